#!/usr/bin/env python3
"""Generate small, real PyTorch profiler (Kineto JSON) traces of a multi-rank
CPU training job that uses the gloo backend and several collective types.

Usage:
    python datasets/generators/gloo_training.py OUT_DIR [--world-size 2] [--steps N]
                                                [--slow-rank R --delay-ms D]

Writes OUT_DIR/rank-{r}.pt.trace.json.gz, one per rank.

Each rank:
  * joins a gloo process group (MASTER_ADDR=127.0.0.1, a free local port),
  * trains a tiny conv + transformer-ish model wrapped in DistributedDataParallel
    (DDP all_reduce of gradient buckets),
  * runs extra explicit collectives each step: all_gather, broadcast,
    all_to_all_single (falls back to reduce_scatter if unsupported) and barrier,
  * is profiled with torch.profiler (CPU activity, record_shapes, profile_memory,
    with_flops) using schedule(wait=1, warmup=1, active=3, repeat=1), calling
    prof.step() each iteration so ProfilerStep#N annotations exist.

With --slow-rank R, rank R sleeps D ms before the forward pass and before each
explicit collective: a known straggler, so that skew and straggler analyses
have a ground truth to find.

Everything is seeded; timings of course differ between runs.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch_jobs import free_port, finish_rank

WAIT, WARMUP, ACTIVE = 1, 1, 3



class TinyModel(nn.Module):
    """conv2d -> tokens -> [LayerNorm, MultiheadAttention, MLP(GELU)] -> head."""

    def __init__(self, d: int = 32, heads: int = 4, classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, d, kernel_size=4, stride=4)  # 16x16 -> 4x4 = 16 tokens
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.conv(x).flatten(2).transpose(1, 2)  # (B, 16, d)
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        x = x + self.mlp(self.ln2(x))
        return self.head(x.mean(dim=1))


def extra_collectives(rank: int, world: int, straggle) -> None:
    with record_function("extra_collectives"):
        t = torch.full((8,), float(rank))
        gathered = [torch.empty(8) for _ in range(world)]
        straggle()
        dist.all_gather(gathered, t)

        b = torch.arange(16, dtype=torch.float32) if rank == 0 else torch.zeros(16)
        straggle()
        dist.broadcast(b, src=0)

        inp = torch.arange(4 * world, dtype=torch.int64) + 100 * rank
        out = torch.empty_like(inp)
        straggle()
        try:
            dist.all_to_all_single(out, inp)
        except (RuntimeError, NotImplementedError):
            pass
        # newer torch renamed reduce_scatter_tensor -> reduce_scatter_single
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        straggle()
        try:
            rs(torch.empty(4), torch.ones(4 * world))
        except (RuntimeError, NotImplementedError, ValueError):
            pass  # older gloo builds may not implement reduce_scatter
        straggle()
        dist.barrier()


def worker(rank: int, world: int, port: int, steps: int, out_dir: str, slow_rank: int, delay_ms: float) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    delay_s = delay_ms / 1000 if rank == slow_rank else 0.0

    def straggle():
        if delay_s:
            time.sleep(delay_s)

    dist.init_process_group("gloo", rank=rank, world_size=world)

    model = DDP(TinyModel(), bucket_cap_mb=0.01)  # small buckets -> several all_reduces
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1234 + rank)
    batch = 8

    # exported uncompressed next to the final file (its path ends up in the
    # trace's "traceName"), then gzipped and removed
    raw = os.path.join(out_dir, f"rank-{rank}.pt.trace.json")

    def on_ready(prof):
        prof.export_chrome_trace(raw)

    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        profile_memory=True,
        with_flops=True,
        with_stack=False,
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
        on_trace_ready=on_ready,
    ) as prof:
        for _ in range(steps):
            x = torch.randn(batch, 3, 16, 16, generator=gen)
            y = torch.randint(0, 10, (batch,), generator=gen)
            opt.zero_grad(set_to_none=True)
            straggle()
            with record_function("forward"):
                loss = loss_fn(model(x), y)
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer_step"):
                opt.step()
            extra_collectives(rank, world, straggle)
            prof.step()

    finish_rank(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=WAIT + WARMUP + ACTIVE + 1)
    ap.add_argument("--slow-rank", type=int, default=-1, help="rank that arrives late (default: none)")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="how late the slow rank is, per collective")
    args = ap.parse_args()
    if args.steps < WAIT + WARMUP + ACTIVE:
        ap.error(f"--steps must be >= {WAIT + WARMUP + ACTIVE}")
    os.makedirs(args.out_dir, exist_ok=True)
    mp.spawn(worker, args=(args.world_size, free_port(), args.steps, args.out_dir, args.slow_rank, args.delay_ms),
             nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
