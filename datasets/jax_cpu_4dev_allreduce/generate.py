"""Data-parallel training of a tiny MLP on 4 CPU devices (XLA's host platform split in four): gradients are
averaged with an all-reduce (jax.lax.pmean) each step, under jax.profiler.trace with StepTraceAnnotation."""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax
import jax.numpy as jnp


def loss(w, x, y):
    return jnp.mean((jnp.tanh(x @ w[0]) @ w[1] - y) ** 2)


def step(w, x, y):
    g = jax.lax.pmean(jax.grad(loss)(w, x, y), "devices")
    return [wi - 0.01 * gi for wi, gi in zip(w, g)]


step = jax.pmap(step, axis_name="devices")
n = jax.local_device_count()
key = jax.random.PRNGKey(0)
w = [jax.random.normal(key, (64, 128)), jax.random.normal(key, (128, 8))]
w = [jnp.stack([wi] * n) for wi in w]
x, y = jax.random.normal(key, (n, 256, 64)), jax.random.normal(key, (n, 256, 8))
w = step(w, x, y); jax.block_until_ready(w)  # compile outside the trace
options = jax.profiler.ProfileOptions()
options.python_tracer_level = 0  # XLA ops and TraceMe annotations only: a small file
options.enable_hlo_proto = False
with jax.profiler.trace(sys.argv[1], profiler_options=options):
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            w = step(w, x, y)
            jax.block_until_ready(w)
