#!/usr/bin/env python3
"""Generate small, real PyTorch profiler (Kineto JSON) traces of pipeline-parallel training on CPU:
torch.distributed.pipelining over gloo, one process per rank.

Usage:
    python datasets/generators/pipeline_training.py OUT_DIR --schedule {gpipe,1f1b,interleaved}
        [--world-size 4] [--microbatches 4] [--slow-stage S --slow-factor F] [--steps N]

Writes OUT_DIR/rank-{r}.pt.trace.json.gz, one per rank.

The model is a stack of identical MLP blocks (Linear-GELU-Linear, residual) cut into stages of equal depth: one stage
per rank (GPipe, 1F1B) or two per rank (interleaved 1F1B: rank r holds stages r and r + world, so a microbatch visits
every rank twice). With --slow-stage S, stage S's blocks are repeated F times: an unbalanced pipeline whose
limiting stage is known. Every rank uses one intra-op thread; the job is profiled with torch.profiler (CPU activity,
record_shapes, so that c10d's send/recv record their peer among the Concrete Inputs) with
schedule(wait=1, warmup=1, active=ACTIVE) and prof.step() after each training step (ProfilerStep#N ranges).

Everything is seeded; timings of course differ between runs.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.profiler import ProfilerActivity, profile, schedule
from torch_jobs import free_port, finish_rank

WAIT, WARMUP, ACTIVE = 1, 1, 2
WIDTH, BLOCKS_PER_STAGE, BATCH = 256, 2, 64
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}



class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)))


def stage_module(stage: int, slow_stage: int, slow_factor: int) -> nn.Module:
    """The blocks of one stage; the slow stage runs its blocks slow_factor times (same parameters, more work)."""
    torch.manual_seed(stage)
    blocks = [Block() for _ in range(BLOCKS_PER_STAGE)]
    repeat = slow_factor if stage == slow_stage else 1
    return nn.Sequential(*[b for _ in range(repeat) for b in blocks])


def worker(rank: int, world: int, port: int, args) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    chunks = 2 if args.schedule == "interleaved" else 1
    n_stages = world * chunks
    stage_ids = [rank + c * world for c in range(chunks)]
    stages = [PipelineStage(stage_module(s, args.slow_stage, args.slow_factor), s, n_stages, torch.device("cpu"))
              for s in stage_ids]
    params = [p for st in stages for p in st.submod.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)

    def loss_fn(out, target):
        return nn.functional.mse_loss(out, target)

    sched_cls = SCHEDULES[args.schedule]
    sched = sched_cls(stages if chunks > 1 else stages[0], args.microbatches, loss_fn=loss_fn)
    gen = torch.Generator().manual_seed(1234)
    raw = os.path.join(args.out_dir, f"rank-{rank}.pt.trace.json")

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(raw)) as prof:
        for _ in range(args.steps):
            x = torch.randn(BATCH, WIDTH, generator=gen)
            y = torch.randn(BATCH, WIDTH, generator=gen)
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                sched.step(x, target=y) if n_stages - 1 in stage_ids else sched.step(x)
            elif n_stages - 1 in stage_ids:
                sched.step(target=y)
            else:
                sched.step()
            opt.step()
            prof.step()

    finish_rank(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), required=True)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--slow-stage", type=int, default=-1, help="stage with more work (default: none)")
    ap.add_argument("--slow-factor", type=int, default=3, help="how many times the slow stage repeats its blocks")
    ap.add_argument("--steps", type=int, default=WAIT + WARMUP + ACTIVE + 1)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    mp.spawn(worker, args=(args.world_size, free_port(), args), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
