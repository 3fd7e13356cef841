"""The rocpd database and the CSV files rocprofv3 writes, made from the records of a rocprofv3 JSON export.

No public rocpd database or CSV export is paired with a public JSON export of the same run, and making one needs
ROCm and an AMD GPU. This writes the records of a real JSON export (`<pid>_results.json[.gz]`) the way
rocprofiler-sdk's own writers do (ROCm 7.0: `source/lib/output/generateRocpd.cpp` and `generateCSV.cpp` of
ROCm/rocm-systems, branch filtered/rocprofiler-sdk-7.0, 749a2ee463ba9a4aee3337e1987beae5ff9c2e05): the database
through the SDK's own schema files (`source/share/rocprofiler-sdk-rocpd/*.sql`, given by path: their tables, views
and indexes, with a `{{uuid}}` suffix on every table), one row per record as the SDK maps it (a kernel
dispatch's id is its dispatch id, a thread's and a queue's id their handles, an API call with a duration a region,
one without a sample on its category's track; every record an event holding its correlation ids; an agent's
extdata without its list of caches, 90 % of the file otherwise); the CSV files with the SDK's headers and columns.

    python datasets/generators/rocprofv3_exports.py JSON SDK_SHARE_DIR OUT_DIR [--kernels START:STOP]

writes OUT_DIR/rocpd/<pid>_results.db, OUT_DIR/csv/<pid>_*.csv and OUT_DIR/json/<pid>_results.json.gz (the JSON
cut to the same kernel dispatches, for the readers' cross-checks). The tests use `write_rocpd` and
`write_csv` on small records of their own, with the schema copied from the bundled database.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import sqlite3
from pathlib import Path

SCHEMA_FILES = ("rocpd_tables.sql", "rocpd_views.sql", "data_views.sql", "marker_views.sql", "summary_views.sql")
INDEX_FILE = "rocpd_indexes.sql"  # made last, as rocprofv3 does
LDS_BLOCK = 512  # the CSV's LDS_Block_Size: the kernel symbol's static LDS rounded up to this many bytes
UUID = "_019aa7f2_0000_7000_8000_000000000908"  # fixed, so that the file is the same on every run
GUID = UUID[1:].replace("_", "-")
#: rocprofv3's API domains: JSON buffer_records key -> CSV file
API_CSV = {"hip_api": "hip_api_trace", "hsa_api": "hsa_api_trace", "marker_api": "marker_api_trace",
           "rccl_api": "rccl_api_trace"}


def schema_from_share(share: Path) -> str:
    """The SDK's schema files as one script, with the uuid and guid this writer uses."""
    text = "\n".join((share / name).read_text() for name in SCHEMA_FILES)
    return text.replace("{{uuid}}", UUID).replace("{{guid}}", GUID)


def schema_from_database(path: Path) -> str:
    """The schema of a database this writer made (its tables, then its views), to make another like it."""
    con = sqlite3.connect(path)
    try:
        rows = con.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
                           "AND type IN ('table', 'view') ORDER BY type = 'view', rowid").fetchall()
    finally:
        con.close()
    return ";\n".join(sql for (sql,) in rows) + ";"


def _names(process: dict) -> tuple[list[dict], dict]:
    """Each kind's name and operation names (strings.buffer_records), and each marker message by correlation id."""
    strings = process.get("strings", {})
    messages = {m["key"]: m["value"] for m in strings.get("marker_api", []) if isinstance(m, dict)}
    return strings.get("buffer_records", []), messages


def _records(process: dict, kernels: slice | None):
    records = dict(process.get("buffer_records", {}))
    if kernels is not None:
        records["kernel_dispatch"] = records.get("kernel_dispatch", [])[kernels]
    return records


def write_rocpd(process: dict, path: Path, schema: str, kernels: slice | None = None) -> None:
    """One process of a rocprofv3 JSON export (an element of "rocprofiler-sdk-tool") as rocprofv3's database."""
    kinds, messages = _names(process)
    records = _records(process, kernels)
    meta = process["metadata"]
    pid, node = meta["pid"], meta.get("node", {})
    con = sqlite3.connect(path)
    con.executescript(schema)
    strings: dict[str, int] = {}

    def string(text: str) -> int:
        if text not in strings:
            strings[text] = len(strings) + 1
            con.execute(f"INSERT INTO rocpd_string{UUID} (id, string) VALUES (?, ?)", (strings[text], text))
        return strings[text]

    string("")
    nid = 1
    con.execute(f"INSERT INTO rocpd_info_node{UUID} (id, hash, machine_id, system_name, hostname, release, version, "
                "hardware_name, domain_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (nid, node.get("hash", 0), node.get("machine_id", ""), node.get("system_name"), node.get("hostname"),
                 node.get("release"), node.get("version"), node.get("hardware_name"), node.get("domain_name")))
    con.execute(f"INSERT INTO rocpd_info_process{UUID} (id, nid, ppid, pid, init, fini, start, end, command) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (pid, nid, meta.get("ppid", 0), pid, meta.get("init_time"), meta.get("fini_time"),
                 meta.get("init_time"), meta.get("fini_time"), " ".join(meta.get("command", []))))
    agents = {a["id"]["handle"]: a for a in process["agents"]}
    for agent in process["agents"]:
        con.execute(f"INSERT INTO rocpd_info_agent{UUID} (id, nid, pid, type, absolute_index, logical_index, "
                    "type_index, uuid, name, model_name, vendor_name, product_name, user_name, extdata) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (agent["node_id"], nid, pid, {1: "CPU", 2: "GPU"}.get(agent["type"], "UNK"), agent["node_id"],
                     agent["logical_node_id"], agent["logical_node_type_id"], agent.get("device_id"), agent["name"],
                     agent.get("model_name"), agent.get("vendor_name"), agent.get("product_name"),
                     agent.get("product_name"), json.dumps({k: v for k, v in agent.items() if k != "caches"})))
    used = {r["dispatch_info"]["kernel_id"] for r in records.get("kernel_dispatch", [])}
    symbols = [s for s in process.get("kernel_symbols", []) if s["kernel_id"] in used]
    for obj in process.get("code_objects", []):
        if obj["code_object_id"] in {s["code_object_id"] for s in symbols}:
            con.execute(f"INSERT INTO rocpd_info_code_object{UUID} (id, nid, pid, agent_id, uri, load_base, "
                        "load_size, load_delta, storage_type, extdata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (obj["code_object_id"], nid, pid, agents[obj["agent_id"]["handle"]]["node_id"], obj["uri"],
                         obj["load_base"], obj["load_size"], obj["load_delta"],
                         {1: "FILE", 2: "MEMORY"}.get(obj["storage_type"]), json.dumps(obj)))
    for s in symbols:
        con.execute(f"INSERT INTO rocpd_info_kernel_symbol{UUID} (id, nid, pid, code_object_id, kernel_name, "
                    "display_name, kernel_object, kernarg_segment_size, kernarg_segment_alignment, group_segment_size, "
                    "private_segment_size, sgpr_count, arch_vgpr_count, accum_vgpr_count, extdata) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (s["kernel_id"], nid, pid, s["code_object_id"], s["kernel_name"], s["formatted_kernel_name"],
                     s["kernel_object"], s["kernarg_segment_size"], s["kernarg_segment_alignment"],
                     s["group_segment_size"], s["private_segment_size"], s["sgpr_count"], s["arch_vgpr_count"],
                     s["accum_vgpr_count"], json.dumps(s)))
    seen = {"thread": set(), "queue": set(), "stream": set()}

    def info(what: str, handle: int) -> int:
        if handle not in seen[what]:
            seen[what].add(handle)
            if what == "thread":
                con.execute(f"INSERT INTO rocpd_info_thread{UUID} (id, nid, ppid, pid, tid) VALUES (?, ?, ?, ?, ?)",
                            (handle, nid, meta.get("ppid", 0), pid, handle))
            else:
                name = f"Default {what.title()}" if handle == 0 else f"{what.title()} {len(seen[what]) - 2}"
                con.execute(f"INSERT INTO rocpd_info_{what}{UUID} (id, nid, pid, name) VALUES (?, ?, ?, ?)",
                            (handle, nid, pid, name))
        return handle

    info("stream", 0)
    info("queue", 0)
    events = [0]

    def event(record: dict, extdata: str = "{}") -> int:
        events[0] += 1
        corr = record.get("correlation_id", {})
        con.execute(f"INSERT INTO rocpd_event{UUID} (id, category_id, stack_id, parent_stack_id, correlation_id, "
                    "extdata) VALUES (?, ?, ?, ?, ?, ?)",
                    (events[0], string(kinds[record["kind"]]["kind"]), corr.get("internal", 0),
                     corr.get("ancestor", corr.get("internal", 0)), corr.get("external", 0), extdata))
        return events[0]

    tracks: dict[tuple, int] = {}
    for domain in API_CSV:
        for r in records.get(domain, []):
            info("thread", r["thread_id"])
            name = kinds[r["kind"]]["operations"][r["operation"]]
            message = messages.get(r["correlation_id"]["internal"]) if domain == "marker_api" else None
            evt = event(r, json.dumps({"message": message}) if message else "{}")
            if r["start_timestamp"] != r["end_timestamp"]:
                con.execute(f"INSERT INTO rocpd_region{UUID} (id, nid, pid, tid, start, end, name_id, event_id) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            (r["correlation_id"]["internal"], nid, pid, r["thread_id"], r["start_timestamp"],
                             r["end_timestamp"], string(name), evt))
            else:
                key = (pid, r["thread_id"], string(kinds[r["kind"]]["kind"]))
                if key not in tracks:
                    tracks[key] = len(tracks) + 1
                    con.execute(f"INSERT INTO rocpd_track{UUID} (id, nid, pid, tid, name_id) VALUES (?, ?, ?, ?, ?)",
                                (tracks[key], nid, *key))
                con.execute(f"INSERT INTO rocpd_sample{UUID} (id, track_id, timestamp, event_id) VALUES (?, ?, ?, ?)",
                            (r["correlation_id"]["internal"], tracks[key], r["start_timestamp"], evt))
    for r in records.get("kernel_dispatch", []):
        d = r["dispatch_info"]
        info("thread", r["thread_id"])
        con.execute(f"INSERT INTO rocpd_kernel_dispatch{UUID} (id, nid, pid, tid, agent_id, kernel_id, dispatch_id, "
                    "queue_id, stream_id, start, end, private_segment_size, group_segment_size, workgroup_size_x, "
                    "workgroup_size_y, workgroup_size_z, grid_size_x, grid_size_y, grid_size_z, region_name_id, "
                    "event_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (d["dispatch_id"], nid, pid, r["thread_id"], agents[d["agent_id"]["handle"]]["node_id"],
                     d["kernel_id"], d["dispatch_id"], info("queue", d["queue_id"]["handle"]),
                     info("stream", r.get("stream_id", {}).get("handle", 0)), r["start_timestamp"],
                     r["end_timestamp"], d["private_segment_size"], d["group_segment_size"],
                     *(d["workgroup_size"][k] for k in "xyz"), *(d["grid_size"][k] for k in "xyz"), string(""),
                     event(r)))
    for i, r in enumerate(records.get("memory_copy", []), 1):
        info("thread", r["thread_id"])
        con.execute(f"INSERT INTO rocpd_memory_copy{UUID} (id, nid, pid, tid, start, end, name_id, dst_agent_id, "
                    "dst_address, src_agent_id, src_address, size, stream_id, event_id) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (i, nid, pid, r["thread_id"], r["start_timestamp"], r["end_timestamp"],
                     string(kinds[r["kind"]]["operations"][r["operation"]]),
                     agents[r["dst_agent_id"]["handle"]]["node_id"], r.get("dst_address", {}).get("value", 0),
                     agents[r["src_agent_id"]["handle"]]["node_id"], r.get("src_address", {}).get("value", 0),
                     r["bytes"], info("stream", r.get("stream_id", {}).get("handle", 0)), event(r)))
    con.commit()
    con.close()


def write_csv(process: dict, folder: Path, kernels: slice | None = None) -> None:
    """One process of a rocprofv3 JSON export as rocprofv3's CSV files (`--output-format csv`, default
    `--agent-index relative`: "Agent <logical node id>")."""
    kinds, messages = _names(process)
    records = _records(process, kernels)
    pid = process["metadata"]["pid"]
    folder.mkdir(parents=True, exist_ok=True)
    agents = {a["id"]["handle"]: a for a in process["agents"]}
    symbols = {s["kernel_id"]: s for s in process.get("kernel_symbols", [])}

    def agent(handle: int) -> str:
        return f"Agent {agents[handle]['logical_node_id']}"

    def table(name: str, header: list[str], rows) -> None:
        rows = list(rows)
        if rows:
            with open(folder / f"{pid}_{name}.csv", "w", newline="") as f:
                out = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
                out.writerow(header)
                out.writerows(rows)

    table("agent_info", ["Node_Id", "Logical_Node_Id", "Agent_Type", "Cpu_Cores_Count", "Simd_Count", "Cu_Count",
                         "Wave_Front_Size", "Gpu_Id", "Name", "Vendor_Name", "Product_Name", "Model_Name"],
          ([a["node_id"], a["logical_node_id"], {1: "CPU", 2: "GPU"}.get(a["type"], "UNK"), a["cpu_cores_count"],
            a["simd_count"], a["cu_count"], a["wave_front_size"], a["gpu_id"], a["name"], a["vendor_name"],
            a["product_name"], a["model_name"]] for a in sorted(process["agents"], key=lambda a: a["node_id"])))
    table("kernel_trace", ["Kind", "Agent_Id", "Queue_Id", "Stream_Id", "Thread_Id", "Dispatch_Id", "Kernel_Id",
                           "Kernel_Name", "Correlation_Id", "Start_Timestamp", "End_Timestamp", "LDS_Block_Size",
                           "Scratch_Size", "VGPR_Count", "Accum_VGPR_Count", "SGPR_Count", "Workgroup_Size_X",
                           "Workgroup_Size_Y", "Workgroup_Size_Z", "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z"],
          ([kinds[r["kind"]]["kind"], agent(d["agent_id"]["handle"]), d["queue_id"]["handle"],
            r.get("stream_id", {}).get("handle", 0), r["thread_id"], d["dispatch_id"], d["kernel_id"],
            symbols[d["kernel_id"]]["formatted_kernel_name"], r["correlation_id"]["internal"], r["start_timestamp"],
            r["end_timestamp"], -(-symbols[d["kernel_id"]]["group_segment_size"] // LDS_BLOCK) * LDS_BLOCK,
            d["private_segment_size"],
            symbols[d["kernel_id"]]["arch_vgpr_count"], symbols[d["kernel_id"]]["accum_vgpr_count"],
            symbols[d["kernel_id"]]["sgpr_count"], *(d["workgroup_size"][k] for k in "xyz"),
            *(d["grid_size"][k] for k in "xyz")]
           for r in records.get("kernel_dispatch", []) for d in [r["dispatch_info"]]))
    table("memory_copy_trace", ["Kind", "Direction", "Stream_Id", "Source_Agent_Id", "Destination_Agent_Id",
                                "Correlation_Id", "Start_Timestamp", "End_Timestamp"],
          ([kinds[r["kind"]]["kind"], kinds[r["kind"]]["operations"][r["operation"]],
            r.get("stream_id", {}).get("handle", 0), agent(r["src_agent_id"]["handle"]),
            agent(r["dst_agent_id"]["handle"]), r["correlation_id"]["internal"], r["start_timestamp"],
            r["end_timestamp"]] for r in records.get("memory_copy", [])))
    for domain, name in API_CSV.items():
        table(name, ["Domain", "Function", "Process_Id", "Thread_Id", "Correlation_Id", "Start_Timestamp",
                     "End_Timestamp"],
              ([kinds[r["kind"]]["kind"],
                messages.get(r["correlation_id"]["internal"]) if domain == "marker_api" and
                messages.get(r["correlation_id"]["internal"]) else kinds[r["kind"]]["operations"][r["operation"]],
                pid, r["thread_id"], r["correlation_id"]["internal"], r["start_timestamp"], r["end_timestamp"]]
               for r in records.get(domain, [])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="a rocprofv3 JSON export (<pid>_results.json[.gz])")
    parser.add_argument("share", type=Path, help="rocprofiler-sdk's source/share/rocprofiler-sdk-rocpd folder")
    parser.add_argument("out", type=Path)
    parser.add_argument("--kernels", default=None, metavar="START:STOP",
                        help="keep these kernel dispatches (positions in the file's kernel_dispatch array)")
    args = parser.parse_args()
    opener = gzip.open if args.json.name.endswith(".gz") else open
    with opener(args.json, "rb") as f:
        doc = json.loads(f.read())
    process = doc["rocprofiler-sdk-tool"][0]
    pid = process["metadata"]["pid"]
    (args.out / "rocpd").mkdir(parents=True, exist_ok=True)
    db = args.out / "rocpd" / f"{pid}_results.db"
    db.unlink(missing_ok=True)
    kernels = slice(*(int(n) for n in args.kernels.split(":"))) if args.kernels else None
    write_rocpd(process, db, schema_from_share(args.share), kernels)
    con = sqlite3.connect(db)
    con.executescript((args.share / INDEX_FILE).read_text().replace("{{uuid}}", UUID))
    con.execute("VACUUM")
    con.close()
    write_csv(process, args.out / "csv", kernels)
    (args.out / "json").mkdir(parents=True, exist_ok=True)
    process["buffer_records"] = _records(process, kernels)
    used = {r["dispatch_info"]["kernel_id"] for r in process["buffer_records"]["kernel_dispatch"]}
    process["kernel_symbols"] = [s for s in process["kernel_symbols"] if s["kernel_id"] in used]
    with gzip.open(args.out / "json" / f"{pid}_results.json.gz", "wt", compresslevel=9) as f:
        json.dump({"rocprofiler-sdk-tool": [process]}, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
