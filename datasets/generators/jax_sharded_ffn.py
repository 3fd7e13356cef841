"""A transformer feed-forward block sharded over 8 CPU devices, trained for 3 steps under jax.profiler.

XLA's CPU platform is split into 8 devices (--xla_force_host_platform_device_count=8). The tokens x [B, D] are
sharded by rows (sequence parallel) and the weights by the hidden size F (tensor parallel): each device
all-gathers x, projects it up to its F/8 hidden units (a dot of 2·B·D·F/8 FLOPs), applies gelu, projects down,
and the partial sums are reduce-scattered back to rows. The block is rematerialized (jax.checkpoint) and sits in
named scopes (ffn/up, ffn/down), so the profile has forward, backward and remat ops, all-gathers and
reduce-scatters with known sizes and replica groups.

    python datasets/generators/jax_sharded_ffn.py datasets/jax_cpu_8dev_ffn

writes there `ffn.xplane.pb` (the profile, with the HLO of every program), and
`tests/data/jax_cpu_8dev_ffn_expected.json` (the shapes, and XLA's own cost analysis of the compiled step, for the
tests; not in the dataset folder, which is ingested whole).
"""
import glob
import json
import os
import shutil
import sys
import tempfile
from functools import partial

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

B, D, F = 256, 512, 2048  # tokens, model width, hidden size
DEVICES = 8
mesh = Mesh(jax.devices()[:DEVICES], ("d",))


@jax.checkpoint
def ffn(x_rows, w_up, w_down):
    """x_rows [B/8, D], w_up [D, F/8], w_down [F/8, D] on each device -> its rows of the output [B/8, D]."""
    with jax.named_scope("ffn"):
        x = jax.lax.all_gather(x_rows, "d", axis=0, tiled=True)  # [B, D]
        with jax.named_scope("up"):
            h = jax.nn.gelu(x @ w_up)  # [B, F/8]
        with jax.named_scope("down"):
            y = h @ w_down  # [B, D], a partial sum over this device's hidden units
        return jax.lax.psum_scatter(y, "d", scatter_dimension=0, tiled=True)  # [B/8, D]


def loss(w_up, w_down, x_rows):
    return jax.lax.psum(jnp.sum(ffn(x_rows, w_up, w_down) ** 2), "d") / (B * D)


@jax.jit
@partial(jax.shard_map, mesh=mesh, in_specs=(P(None, "d"), P("d", None), P("d", None)),
         out_specs=(P(None, "d"), P("d", None)))
def train_step(w_up, w_down, x_rows):
    g_up, g_down = jax.grad(loss, argnums=(0, 1))(w_up, w_down, x_rows)
    return w_up - 0.01 * g_up, w_down - 0.01 * g_down


def main(out: str) -> None:
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    w_up = jax.random.normal(k1, (D, F), jnp.float32) / D ** 0.5
    w_down = jax.random.normal(k2, (F, D), jnp.float32) / F ** 0.5
    x = jax.random.normal(k3, (B, D), jnp.float32)
    compiled = train_step.lower(w_up, w_down, x).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    w_up, w_down = train_step(w_up, w_down, x)  # compiled and run once outside the profile
    jax.block_until_ready(w_up)
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # XLA ops, TraceMe annotations and the HLO: a small file
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, profiler_options=options):
            for i in range(3):
                with jax.profiler.StepTraceAnnotation("train", step_num=i):
                    w_up, w_down = train_step(w_up, w_down, x)
                    jax.block_until_ready(w_up)
        (xplane,) = glob.glob(f"{tmp}/plugins/profile/*/*.xplane.pb")
        os.makedirs(out, exist_ok=True)
        shutil.copy(xplane, os.path.join(out, "ffn.xplane.pb"))
    expected = {
        "jax": jax.__version__, "devices": DEVICES, "tokens": B, "model": D, "hidden": F, "dtype": "f32",
        "xla_cost_analysis": {k: cost[k] for k in ("flops", "bytes accessed", "transcendentals") if k in cost},
    }
    tests_data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data")
    with open(os.path.join(tests_data, "jax_cpu_8dev_ffn_expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
