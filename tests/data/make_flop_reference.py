"""Regenerate tests/data/flop_reference.json: torch's own FLOP counts for real ops, and how Kineto records them.

    pip install torch          # any CPU build; the committed file was made with torch 2.13.0+cpu
    python tests/data/make_flop_reference.py

For every case below the ops run twice:
- under `torch.utils.flop_counter.FlopCounterMode`, which gives the reference FLOPs (total and per aten op);
- under `torch.profiler.profile(record_shapes=True, with_flops=True)` inside a `case:<name>` record_function,
  whose exported Kineto trace shows how the ops' shapes are recorded ('Input Dims', 'Input type',
  'Concrete Inputs'). The cpu_op and annotation events are kept so that tests/test_flops.py can ingest them as a
  real trace and compare tracesql's FLOPs macros with FlopCounterMode.

Ops with no CPU kernel (flash / memory-efficient / cuDNN attention, _scaled_mm) run on the 'meta' device: shapes
only, which is all either counter looks at. torch's CPU SDPA kernel (_scaled_dot_product_flash_attention_for_cpu)
has no FlopCounterMode formula (it counts 0), so those cases take their reference from the same call on 'meta',
where SDPA runs its math path (two bmm).

Also recorded: whether the exported JSON carries a FLOPs argument at all (torch 2.13 does not: `with_flops`
only fills the in-memory `key_averages()`, saved here as `profiler_key_averages_flops` for comparison).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.flop_counter import FlopCounterMode

OUT = Path(__file__).with_name("flop_reference.json")
ARGS_KEPT = ("Input Dims", "Input type", "Concrete Inputs", "Input Strides")


def _t(*shape, device="cpu", dtype=torch.float32, grad=False):
    return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)


def _flash_backward(q, k, v, causal):
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
    torch.ops.aten._scaled_dot_product_flash_attention_backward(
        torch.empty_like(out[0]), q, k, v, out[0], out[1], out[2], out[3], out[4], out[5], 0.0, causal,
        out[6], out[7])


# name -> (device, make inputs, run the ops). The inputs are made outside the profiled range.
CASES = {
    "mm": ("cpu", lambda d: (_t(64, 32), _t(32, 48)), lambda a, b: torch.mm(a, b)),
    "addmm": ("cpu", lambda d: (_t(48), _t(64, 32), _t(32, 48)), lambda c, a, b: torch.addmm(c, a, b)),
    "bmm": ("cpu", lambda d: (_t(4, 16, 32), _t(4, 32, 8)), lambda a, b: torch.bmm(a, b)),
    "baddbmm": ("cpu", lambda d: (_t(4, 16, 8), _t(4, 16, 32), _t(4, 32, 8)),
                lambda c, a, b: torch.baddbmm(c, a, b)),
    "linear": ("cpu", lambda d: (_t(64, 32), _t(48, 32), _t(48)), lambda x, w, b: F.linear(x, w, b)),
    "linear_3d_no_bias": ("cpu", lambda d: (_t(4, 16, 32), _t(48, 32)), lambda x, w: F.linear(x, w)),
    "matmul_broadcast": ("cpu", lambda d: (_t(2, 1, 16, 32), _t(3, 32, 8)), lambda a, b: torch.matmul(a, b)),
    "scaled_mm_fp8": ("meta", lambda d: (_t(32, 64, device=d).to(torch.float8_e4m3fn),
                                        _t(48, 64, device=d).to(torch.float8_e4m3fn).t(),
                                        torch.ones((), device=d), torch.ones((), device=d)),
                      lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)),
    "conv2d": ("cpu", lambda d: (_t(2, 4, 9, 9), _t(6, 4, 3, 3), _t(6)),
               lambda x, w, b: F.conv2d(x, w, b, padding=1)),
    "conv2d_stride_padding_groups": ("cpu", lambda d: (_t(2, 4, 9, 9), _t(6, 2, 3, 3)),
                                     lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=2)),
    "conv2d_dilation_asymmetric": ("cpu", lambda d: (_t(1, 3, 17, 15), _t(8, 3, 3, 5)),
                                   lambda x, w: F.conv2d(x, w, stride=(3, 2), padding=(2, 1), dilation=2)),
    "conv2d_depthwise": ("cpu", lambda d: (_t(2, 8, 10, 10), _t(8, 1, 5, 5)),
                         lambda x, w: F.conv2d(x, w, padding=2, groups=8)),
    "conv1d": ("cpu", lambda d: (_t(3, 4, 20), _t(5, 4, 3)), lambda x, w: F.conv1d(x, w, stride=2)),
    "conv_transpose2d": ("cpu", lambda d: (_t(2, 4, 7, 7), _t(4, 3, 3, 3)),
                         lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1)),
    "conv2d_backward": ("cpu", lambda d: (_t(2, 4, 9, 9, grad=True), _t(6, 4, 3, 3, grad=True)),
                        lambda x, w: F.conv2d(x, w, stride=2, padding=1).sum().backward()),
    "sdpa": ("cpu", lambda d: (_t(2, 4, 16, 8, device=d), _t(2, 4, 24, 8, device=d), _t(2, 4, 24, 8, device=d)),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v)),
    "sdpa_causal": ("cpu", lambda d: (_t(2, 4, 16, 8, device=d),) * 3,
                    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    "flash_attention": ("meta", lambda d: (_t(2, 4, 16, 8, device=d), _t(2, 4, 32, 8, device=d),
                                           _t(2, 4, 32, 8, device=d)),
                        lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)),
    "efficient_attention_gqa": ("meta", lambda d: (_t(2, 8, 16, 8, device=d), _t(2, 2, 32, 8, device=d),
                                                   _t(2, 2, 32, 16, device=d)),
                                lambda q, k, v: torch.ops.aten._scaled_dot_product_efficient_attention(
                                    q, k, v, None, False)),
    "cudnn_attention": ("meta", lambda d: (_t(1, 4, 32, 16, device=d),) * 3,
                        lambda q, k, v: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False)),
    "flash_attention_backward": ("meta", lambda d: (_t(2, 4, 16, 8, device=d), _t(2, 4, 32, 8, device=d),
                                                    _t(2, 4, 32, 8, device=d)),
                                 lambda q, k, v: _flash_backward(q, k, v, True)),
}

# Cases whose CPU kernel has no FlopCounterMode formula: the reference runs the same call on 'meta'.
REFERENCE_ON_META = {"sdpa", "sdpa_causal"}


def torch_flops(name: str) -> dict:
    """FlopCounterMode's total and per-op FLOPs for one case."""
    device, make, run = CASES[name]
    device = "meta" if name in REFERENCE_ON_META else device
    torch.manual_seed(0)
    inputs = make(device)
    with FlopCounterMode(display=False) as counter:
        run(*inputs)
    by_op = {f"aten::{op.__name__}": n for op, n in counter.get_flop_counts()["Global"].items()}
    return {"total": counter.get_total_flops(), "by_op": by_op}


def profiled_events() -> tuple[list[dict], dict]:
    """The Kineto events of all cases, each case inside a `case:<name>` annotation, and key_averages' FLOPs."""
    torch.manual_seed(0)
    inputs = {name: make(device) for name, (device, make, _) in CASES.items()}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        for name, (_, _, run) in CASES.items():
            with record_function(f"case:{name}"):
                run(*inputs[name])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    averages = {e.key: e.flops for e in prof.key_averages() if e.flops}
    return trace, averages


def main() -> None:
    trace, averages = profiled_events()
    events = trace["traceEvents"]
    kept = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            args = {k: v for k, v in e.get("args", {}).items() if k in ARGS_KEPT}
            kept.append({k: e[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur")} | {"args": args})
    flops_args = sorted({k for e in events for k in e.get("args", {}) if "flop" in k.lower()})
    reference = {
        "torch_version": torch.__version__,
        "python": sys.version.split()[0],
        "kineto_flops_args": flops_args,
        "profiler_key_averages_flops": averages,
        "cases": {name: {"device": CASES[name][0],
                         "reference_device": "meta" if name in REFERENCE_ON_META else CASES[name][0],
                         "flop_counter": torch_flops(name)} for name in CASES},
        "trace_events": kept,
    }
    OUT.write_text(json.dumps(reference, indent=1) + "\n")
    print(f"{OUT}: {len(CASES)} cases, {len(kept)} events; FLOPs args in the Kineto JSON: {flops_args or 'none'}")


if __name__ == "__main__":
    main()
