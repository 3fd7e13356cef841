"""A toy training loop traced by VizTracer: nested Python calls (X), steps (log_event), a memory counter (C),
instant events (i) and an async data-loader span (b/e)."""
import sys
import time
from viztracer import VizTracer

tracer = VizTracer(output_file=sys.argv[1], max_stack_depth=1, verbose=0)


def forward(n):
    return sum(i * i for i in range(n))


def backward(n):
    return sum(i * 3 for i in range(n))


tracer.start()
for step in range(3):
    with tracer.log_event(f"ProfilerStep#{step}"):
        forward(20000)
        tracer.add_counter("memory", {"allocated": 1000 * (step + 1), "reserved": 4000})
        backward(20000)
        tracer.log_instant("optimizer.step", args={"lr": 0.01})
        time.sleep(0.002)
tracer.stop()
tracer.save()
