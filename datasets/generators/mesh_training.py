#!/usr/bin/env python3
"""Generate small, real PyTorch profiler (Kineto JSON) traces of a job on a 2-D device mesh over gloo (CPU):
data parallel × tensor parallel, with named mesh dimensions (their process groups' pg_desc: mesh_dp, mesh_tp).

Usage:
    python datasets/generators/mesh_training.py OUT_DIR [--dp 2 --tp 2] [--steps N]

Writes OUT_DIR/rank-{r}.pt.trace.json.gz, one per rank. Each step, each rank multiplies its shard of a weight,
all-reduces the partial activations over its tp group (tensor parallel: 64×256 float32), and all-reduces its
gradient shard over its dp group (data parallel: 256×128 float32). torch.profiler with record_shapes,
schedule(wait=1, warmup=1, active=2), prof.step() per step.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch_jobs import free_port, finish_rank

WAIT, WARMUP, ACTIVE = 1, 1, 2



def worker(rank: int, world: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    torch.manual_seed(rank)
    w = torch.randn(256, 256 // args.tp)
    raw = os.path.join(args.out_dir, f"rank-{rank}.pt.trace.json")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(raw)) as prof:
        for _ in range(args.steps):
            x = torch.randn(64, 256 // args.tp)
            with record_function("forward"):
                y = x @ w.T
                dist.all_reduce(y, group=tp)
            with record_function("backward"):
                g = y.T @ torch.randn(64, 256 // args.tp)[:, : 128]
                dist.all_reduce(g, group=dp)
            prof.step()
    finish_rank(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=WAIT + WARMUP + ACTIVE + 1)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    world = args.dp * args.tp
    mp.spawn(worker, args=(world, free_port(), args), nprocs=world, join=True)


if __name__ == "__main__":
    main()
