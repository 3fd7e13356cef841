"""What the torch generators share: a free local port for the rendezvous, and the trace's gzip."""
import gzip
import os
import shutil
import socket


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gzip_trace(raw: str) -> None:
    """raw (a JSON trace) -> raw + '.gz', raw removed; mtime=0 and no embedded filename: a reproducible header."""
    with open(raw, "rb") as src, open(raw + ".gz", "wb") as fo:
        with gzip.GzipFile(filename="", mode="wb", fileobj=fo, mtime=0) as gz:
            shutil.copyfileobj(src, gz)
    os.remove(raw)


def finish_rank(raw: str) -> None:
    """A rank's end: wait for the others, leave the process group, gzip the trace it wrote."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    gzip_trace(raw)
