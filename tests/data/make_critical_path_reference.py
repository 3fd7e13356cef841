"""Reference numbers from Holistic Trace Analysis itself for the critical_path tests.

    python -m venv /work/venvs/hta
    /work/venvs/hta/bin/pip install "HolisticTraceAnalysis==0.5.*" "pandas<3"   # 0.5.0 was used
    /work/venvs/hta/bin/python tests/data/make_critical_path_reference.py CORPUS \
        > tests/data/critical_path_reference.json

CORPUS is the corpus folder (../shared/corpus). For each trace of HTA's own critical-path test data and each
instance of each user annotation in it (and the whole trace, annotation ''), HTA's `critical_path_analysis`:
the summed duration of the path's edges per `bound_by` class (edges with no class - dependencies, syncs -
weigh 0 and are left out), the path's length and its edge count; times in µs, the unit HTA keeps from these
traces' integer microsecond timestamps. The file is committed so that the tests need neither HTA nor pandas<3.
"""
import collections
import contextlib
import gzip
import io
import json
import logging
import warnings
import sys
from pathlib import Path

from hta.trace_analysis import TraceAnalysis

TRACES = ("alexnet", "cuda_event_sync", "cuda_event_sync_multi_stream", "simple_add")


def annotations(folder: Path) -> list[tuple[str, int]]:
    """(name, instance) of every user annotation of the trace, instances counted in time order."""
    (path,) = folder.glob("*.json.gz")
    events = json.loads(gzip.open(path).read())["traceEvents"]
    named = sorted((e["ts"], e["name"]) for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X")
    seen = collections.Counter()
    found = []
    for _, name in named:
        found.append((name, seen[name]))
        seen[name] += 1
    return found


def main(corpus: Path) -> dict:
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")  # pandas 2 warns of what pandas 3 will change in HTA
    reference = {}
    for trace in TRACES:
        folder = corpus / "hta/tests/data/critical_path" / trace
        with contextlib.redirect_stdout(io.StringIO()):  # HTA prints progress
            analysis = TraceAnalysis(trace_dir=str(folder))
        rows = []
        for name, instance in [("", 0)] + annotations(folder):
            with contextlib.redirect_stdout(io.StringIO()):
                graph, ok = analysis.critical_path_analysis(rank=0, annotation=name, instance_id=instance)
                edges = graph.get_critical_path_breakdown()
            assert ok, (trace, name, instance)
            totals = edges[edges.bound_by != ""].groupby("bound_by").duration.sum()
            rows.append({"annotation": name, "instance": instance, "edges": len(edges),
                         "length_us": int(edges.duration.sum()),
                         "bound_by_us": {k: int(v) for k, v in sorted(totals.items())}})
        reference[trace] = rows
    return reference


if __name__ == "__main__":
    json.dump(main(Path(sys.argv[1])), sys.stdout, indent=1)
    print()
