"""Reference numbers from XProf itself (the `xprof` package's converters, run offline) for the XLA tests.

    pip install xprof   # 2.24.2 was used; it needs no network to convert a file
    python tests/data/make_xprof_reference.py > tests/data/xprof_reference.json

For each XPlane below: XProf's HLO op stats (per program and op: category, occurrences, total time in µs,
FLOPs rate) and its memory profile's peak bytes in use per memory id. The tests compare tracesql's tables with
these; the file is committed so that the tests need neither xprof nor its 80 MB of shared libraries.
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

from xprof.convert import raw_to_tool_data

REPO = Path(__file__).resolve().parents[2]
TRACES = {
    "xprof_tpu_inference": REPO / "datasets/xprof_tpu_inference/tpu_inference_2.xplane.pb",
    "jax_cpu_8dev_ffn": REPO / "datasets/jax_cpu_8dev_ffn/ffn.xplane.pb",
}


def tool(path: Path, name: str):
    with tempfile.TemporaryDirectory() as tmp:  # XProf writes caches beside the file
        copy = Path(tmp) / path.name
        shutil.copy(path, copy)
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(copy)], name, {})
    return json.loads(data)


def hlo_stats(path: Path) -> list[dict]:
    table = tool(path, "hlo_stats")
    ids = [c["id"] for c in table["cols"]]
    rows = [dict(zip(ids, (cell.get("v") if cell else None for cell in row["c"]))) for row in table["rows"]]
    keep = ("program_id", "category", "hlo_op_name", "occurrences", "total_time", "model_flop_rate",
            "measured_memory_bw")
    return [{k: r[k] for k in keep} for r in rows]


def main() -> None:
    out = {name: {"hlo_stats": hlo_stats(path)} for name, path in TRACES.items()}
    json.dump(out, sys.stdout, indent=0, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
