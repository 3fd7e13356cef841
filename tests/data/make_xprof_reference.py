"""Reference numbers from XProf itself (the `xprof` package's converters, run offline) for the XLA tests.

    python -m venv /tmp/xprof && /tmp/xprof/bin/pip install xprof   # 2.24.2 was used; it converts offline
    TRACESQL_CORPUS=../shared/corpus /tmp/xprof/bin/python tests/data/make_xprof_reference.py \
        > tests/data/xprof_reference.json

For each XPlane below (the bundled ones, and the corpus's when it is there), what four of XProf's converters say:
- `hlo_stats`: per program and op, category, occurrences, total time (µs), FLOP rate and memory bandwidth;
- `hlo_stats_per_core`: the same converter on the XSpace with one device plane kept, as total time (µs) per
  category: what each core spent (XProf shows all cores together);
- `op_profile`: per program and category, total time (ps) and occurrences; the idle time (ps) of all cores;
- `kernel_stats`: per GPU kernel and op, occurrences and total duration (µs);
- `overview_page`: the device idle percentage, the step-time table (one row per step) and its averages;
- `framework_op_stats`: per TensorFlow (or tf.data) op on the host, its type, occurrences and total time (µs);
  XProf keeps the 500 ops with the most self time.
The tests compare tracesql's tables with these; the file is committed so that the tests need neither xprof nor
its 80 MB of shared libraries.
"""
import gzip
import importlib.util
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from xprof.convert import raw_to_tool_data

REPO = Path(__file__).resolve().parents[2]
# tracesql's XSpace message (to keep one core's plane), loaded alone: the package needs what xprof's venv lacks
_PROTO = importlib.util.spec_from_file_location("xla_proto", REPO / "tracesql/readers/proto/__init__.py")
proto = importlib.util.module_from_spec(_PROTO)
_PROTO.loader.exec_module(proto)

CORPUS = Path(os.environ.get("TRACESQL_CORPUS", REPO.parent / "shared" / "corpus"))
TRACES = {
    "xprof_tpu_inference": REPO / "datasets/xprof_tpu_inference/tpu_inference_2.xplane.pb",
    "jax_cpu_8dev_ffn": REPO / "datasets/jax_cpu_8dev_ffn/ffn.xplane.pb",
    "xprof_gpu_multi_worker": REPO / "datasets/xprof_gpu_multi_worker/34.83.195.179_6003.xplane.pb.gz",
    **({f"corpus/{p.relative_to(CORPUS)}": p for p in sorted(CORPUS.rglob("*.xplane.pb"))} if CORPUS.is_dir()
       else {}),
}
DEVICE_PLANE = re.compile(r"^/device:(?:GPU|TPU):(\d+)$")


def space_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def tool(data: bytes, name: str):
    with tempfile.TemporaryDirectory() as tmp:  # XProf writes caches beside the file
        copy = Path(tmp) / "trace.xplane.pb"
        copy.write_bytes(data)
        out, _ = raw_to_tool_data.xspace_to_tool_data([str(copy)], name, {})
    return json.loads(out)


def table_rows(table: dict) -> list[dict]:
    ids = [c["id"] for c in table["cols"]]
    return [dict(zip(ids, (cell.get("v") if cell else None for cell in row["c"]))) for row in table["rows"]]


def hlo_stats(data: bytes) -> list[dict]:
    keep = ("program_id", "category", "hlo_op_name", "occurrences", "total_time", "model_flop_rate",
            "measured_memory_bw")
    return [{k: r[k] for k in keep} for r in table_rows(tool(data, "hlo_stats"))]


def hlo_stats_per_core(data: bytes) -> dict:
    """Per device plane that ran XLA ops: total time (µs) per category, XProf's hlo_stats of that plane alone."""
    space = proto.messages()["XSpace"].FromString(data)
    devices = [p.name for p in space.planes if DEVICE_PLANE.match(p.name)]
    out = {}
    for device in devices:
        one = proto.messages()["XSpace"]()
        one.CopyFrom(space)
        del one.planes[:]
        one.planes.extend(p for p in space.planes if p.name == device or not DEVICE_PLANE.match(p.name))
        totals = {}
        for r in hlo_stats(one.SerializeToString()):
            totals[r["category"]] = totals.get(r["category"], 0) + r["total_time"]
        if totals:
            out[DEVICE_PLANE.match(device).group(1)] = totals
    return out


def op_profile(data: bytes) -> dict:
    tree = tool(data, "op_profile")["byProgram"]
    categories, idle = {}, 0
    for program in tree.get("children", []):
        if program["name"] == "IDLE":
            idle += program["metrics"].get("rawTime", 0)
            continue
        for category in program.get("children", []):
            m = category["metrics"]
            categories[f"{program['name']}/{category['name']}"] = {
                "raw_time_ps": m.get("rawTime", 0), "occurrences": m.get("occurrences", 0)}
    return {"categories": categories, "idle_ps": idle}


def kernel_stats(data: bytes) -> list[dict]:
    keep = ("kernel_name", "op_name", "occurrences", "total_duration_us")
    return [{k: r[k] for k in keep} for r in table_rows(tool(data, "kernel_stats"))]


def overview_page(data: bytes) -> dict:
    tables = tool(data, "overview_page")
    analysis, steps = tables[0]["p"], tables[1]
    keep = ("steptime_ms_average", "device_compute_time_ms_avg", "tc_compute_ms_average", "tc_idle_ms_average")
    return {"device_idle_time_percent": analysis.get("device_idle_time_percent"),
            "steps": [{k: v for k, v in r.items() if k != "tooltip"} for r in table_rows(steps)],
            **{k: steps["p"][k] for k in keep if k in steps["p"]}}


def framework_op_stats(data: bytes) -> list[dict]:
    keep = ("type", "operation", "occurrences", "total_time")
    return [{k: r[k] for k in keep} for r in table_rows(tool(data, "framework_op_stats")[0])
            if r["host_or_device"] == "Host" and r["type"] != "IDLE"]


def main() -> None:
    out = {}
    for name, path in TRACES.items():
        data = space_bytes(path)
        out[name] = {"hlo_stats": hlo_stats(data), "hlo_stats_per_core": hlo_stats_per_core(data),
                     "op_profile": op_profile(data), "kernel_stats": kernel_stats(data),
                     "overview_page": overview_page(data), "framework_op_stats": framework_op_stats(data)}
    json.dump(out, sys.stdout, indent=0, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
