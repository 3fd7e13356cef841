"""A tiny CPU JAX training loop under jax.profiler.trace: an MLP, 3 steps with StepTraceAnnotation."""
import sys
import jax, jax.numpy as jnp

def loss(w, x, y):
    h = jnp.tanh(x @ w[0])
    return jnp.mean((h @ w[1] - y) ** 2)

@jax.jit
def step(w, x, y):
    g = jax.grad(loss)(w, x, y)
    return [wi - 0.01 * gi for wi, gi in zip(w, g)]

key = jax.random.PRNGKey(0)
w = [jax.random.normal(key, (64, 128)), jax.random.normal(key, (128, 8))]
x, y = jax.random.normal(key, (256, 64)), jax.random.normal(key, (256, 8))
w = step(w, x, y); jax.block_until_ready(w)  # compile outside the trace
with jax.profiler.trace(sys.argv[1], create_perfetto_trace=True):
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            w = step(w, x, y)
            jax.block_until_ready(w)
