"""Reference numbers from Holistic Trace Analysis itself for HTA's counter-style analyses.

    /work/venvs/hta/bin/python tests/data/make_hta_counters_reference.py CORPUS \
        > tests/data/hta_counters_reference.json

(the venv of tests/data/make_critical_path_reference.py: HolisticTraceAnalysis 0.5 with pandas<3). CORPUS is the
corpus folder (../shared/corpus). For each single-rank trace folder of HTA's own test data (its one rank; an
analysis HTA fails on is recorded as its error):

- `get_queue_length_summary` and `get_time_spent_blocked_on_full_queue` (max queue length 1024 and 4): per stream,
  the statistics HTA's `describe()` gives of the queue-length series (count, mean, std, min, 25 %, 50 %, 75 %, max)
  and the time spent at or above the maximum;
- `get_memory_bw_summary`: per copy kind, `describe()` of the bandwidth series' positive points;
- `get_frequent_cuda_kernel_sequences` for the three CPU-op names that launch the most kernels at their shallowest
  depth: every pattern, its count and summed kernel and op durations;
- `get_cupti_counter_data_with_operators`: per counter kernel, its name, top and bottom op and op stack.

Times are in the unit HTA keeps from the trace's timestamps (µs for integer-µs traces). The file is committed so
that the tests need neither HTA nor pandas<3.
"""
import contextlib
import io
import json
import logging
import math
import sys
import tempfile
import warnings
from pathlib import Path

from hta.trace_analysis import TraceAnalysis

FOLDERS = ("amd_trace", "cupti_profiler", "df_index_resolver", "negative_queue_length_values_check",
           "ns_resolution_trace", "mtia_trace_single_rank", "nccl_parser_config", "triton_example",
           "critical_path/alexnet", "critical_path/simple_add")
DESCRIBE = ("count", "mean", "std", "min", "25%", "50%", "75%", "max")


def number(value):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def describe_rows(frame, keys) -> list[dict]:
    """A describe() frame (MultiIndex rows, (column, statistic) columns) as plain rows."""
    rows = []
    if frame is None:
        return rows
    for index, row in frame.iterrows():
        out = dict(zip(keys, [int(v) if isinstance(v, (int,)) or hasattr(v, "is_integer") and
                              not isinstance(v, str) and float(v).is_integer() else v for v in index]))
        out.update({stat: number(row.iloc[i]) for i, stat in enumerate(DESCRIBE)})
        rows.append(out)
    return rows


def top_operators(analysis, rank: int, count: int = 3) -> list[str]:
    """CPU-op names whose occurrences launch the most kernels (at least 3 each)."""
    from hta.common.trace_call_graph import CallGraph
    trace = analysis.t
    CallGraph(trace, ranks=[rank])  # adds num_kernels to the rank's frame
    frame = trace.get_trace(rank)
    symbols = trace.symbol_table.get_sym_table()
    ops = frame[(frame["stream"] == -1) & (frame["num_kernels"] >= 3)] if "num_kernels" in frame else frame[:0]
    totals = {}
    for name_id, group in ops.groupby("name"):
        name = symbols[name_id]
        if name.startswith("aten::") or name.startswith("nn.Module"):
            totals[name] = int(group["num_kernels"].sum())
    return [n for n, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:count]]


def main(corpus: Path) -> dict:
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    reference = {}
    for name in FOLDERS:
        folder = corpus / "hta/tests/data" / name
        with contextlib.redirect_stdout(io.StringIO()):
            analysis = TraceAnalysis(trace_dir=str(folder))
        (rank,) = analysis.t.traces
        entry = {"rank": int(rank), "trace_duration": float(analysis.t.get_trace_duration(rank))}

        def queue_length():
            series = analysis.get_queue_length_time_series(ranks=[rank])
            blocked = {m: analysis.get_time_spent_blocked_on_full_queue(series, max_queue_length=m)
                       for m in (1024, 4)}
            return {"summary": describe_rows(analysis.get_queue_length_summary(ranks=[rank]), ("rank", "stream")),
                    "blocked_on_full_queue": {
                        str(m): [{"stream": int(r.stream), "duration": float(r.duration_at_max_queue_length),
                                  "relative": float(r.relative_duration_at_max_queue_length)}
                                 for r in frame.itertuples()] for m, frame in blocked.items()}}

        def memory_bw():
            return describe_rows(analysis.get_memory_bw_summary(ranks=[rank]), ("rank", "name"))

        def kernel_sequences():
            sequences = {}
            for operator in top_operators(analysis, rank):
                with tempfile.TemporaryDirectory() as out:
                    frame = analysis.get_frequent_cuda_kernel_sequences(
                        operator_name=operator, output_dir=out, rank=rank, visualize=False)
                sequences[operator] = [
                    {"pattern": r["pattern"], "count": int(r["count"]),
                     "kernel_dur": float(r["GPU kernel duration (us)"]), "op_dur": float(r["CPU op duration (us)"])}
                    for _, r in frame.iterrows()]
            return sequences

        def counters():
            return [
                {"name": r["name"], "ts": float(r["ts"]), "top_level_op": r["top_level_op"],
                 "bottom_level_op": r["bottom_level_op"], "op_stack": list(r["op_stack"]),
                 "values": {k: number(r[k]) for k in frame.columns
                            if k.startswith(("sm__", "smsp__", "dram__", "l1tex__", "lts__", "gpu__"))}}
                for frame in analysis.get_cupti_counter_data_with_operators(ranks=[rank]) for _, r in frame.iterrows()]

        for key, analyse in (("queue_length", queue_length), ("memory_bw", memory_bw),
                             ("kernel_sequences", kernel_sequences), ("counters", counters)):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    entry[key] = analyse()
            except Exception as error:  # HTA's own failure is part of the reference
                entry[key] = {"error": f"{type(error).__name__}: {error}"[:300]}
        reference[name] = entry
    return reference


if __name__ == "__main__":
    json.dump(main(Path(sys.argv[1])), sys.stdout, indent=1, sort_keys=True)
    print()
