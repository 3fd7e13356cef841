#!/usr/bin/env python3
"""Ingest benchmark: tracesql vs. Holistic Trace Analysis (HTA) vs. plain json.loads.

For each trace file, and each of

  (a) json      gunzip (if .gz) + stdlib ``json.loads`` of the whole file
  (b) hta       ``hta.trace_analysis.TraceAnalysis(trace_dir=DIR)``, DIR holding only a
                symlink to that one file (HTA's default JSON parser backend)
  (c) tracesql  ``tracesql ingest FILE -o OUTDIR`` (the CLI on PATH, else
                ``python -m tracesql``, or --tracesql-cmd)
  (d) base      with --base CHECKOUT: ``python -m tracesql ingest`` of that checkout (e.g. main's
                worktree), to compare two versions of tracesql in the same run
  (e) floor     gunzip (isal's igzip if installed) + the fastest JSON parser installed (pysimdjson, else
                orjson, else ``json``): the parse floor of issue 15, what any reader of every byte pays

it runs the measurement in a FRESH child process, ``--repeat`` times, and records

* wall seconds of the whole child process (interpreter start + imports + work), measured
  by the parent; the best (smallest) over the repeats is reported;
* for (a) and (b) also the seconds of the operation alone, timed inside the child
  (``json_s`` = gunzip + loads; ``load_s`` = the TraceAnalysis constructor, without the
  ~1-2 s of ``import hta``); best over the repeats;
* peak RSS: ``ru_maxrss`` from ``os.wait4`` on that one child (max of the child and any
  descendants it waited for), and, when psutil is there, the peak of the RSS *summed* over
  the child's process tree sampled every 0.1 s (matters if a tool uses worker processes).
  The largest over the repeats is reported.

Ratios (from the best process wall times): HTA/tracesql, tracesql/(a), tracesql/base, and
tracesql peak RSS / uncompressed JSON bytes; CPU seconds (user + system, of the fastest run) per
million events for (c) and (d).

A measurement that fails, times out (--timeout) or goes over the memory guard (--mem-limit-gb,
the child's process tree is killed) is recorded with its reason and not repeated.
A mode whose tool is missing is reported as "skipped: ... not installed".

Usage:
    python benchmarks/bench_ingest.py                      # the two default traces
    python benchmarks/bench_ingest.py --big                # + tiled >=1 GB and >=2 GB traces
    python benchmarks/bench_ingest.py --only json,hta --json /tmp/tracesql-bench/results.json
    python benchmarks/bench_ingest.py some/trace.json.gz --only tracesql --repeat 5
    python benchmarks/bench_ingest.py --only json,tracesql,base --base /work/main   # this checkout vs main
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = "/work/shared/corpus/hta/tests/data"
DEFAULT_TRACES = [
    f"{CORPUS}/df_index_resolver/df_index_resolver.json.gz",
    f"{CORPUS}/mtia_trace_single_rank/mtia_rank_0.json.gz",
]
DEFAULT_SCRATCH = "/tmp/tracesql-bench"
# (name, source, min bytes) of the tiled traces made by --big
BIG_TRACES = [
    ("df_index_resolver_1GB.json", DEFAULT_TRACES[0], 1e9),
    ("df_index_resolver_2GB.json", DEFAULT_TRACES[0], 2e9),
]
MODES = ("json", "hta", "tracesql", "base", "floor")


# --------------------------------------------------------------------------- child side

def _child(argv: list[str]) -> int:
    """Runs inside the measured child process: ``_child MODE TRACE RESULT_JSON``."""
    mode, trace, result_path = argv
    res: dict = {}
    if mode == "json":
        res = _read_and_parse(trace, gzip, json.loads)
    elif mode == "hta":
        import logging
        import warnings

        warnings.filterwarnings("ignore")
        t0 = time.perf_counter()
        from hta.configs.config import logger
        from hta.trace_analysis import TraceAnalysis

        logger.setLevel(logging.ERROR)
        t1 = time.perf_counter()
        a = TraceAnalysis(trace_dir=os.path.dirname(trace))
        t2 = time.perf_counter()
        rows = {str(r): int(len(df)) for r, df in a.t.traces.items()}
        res = {"import_s": t1 - t0, "load_s": t2 - t1, "df_rows": rows}
    elif mode == "floor":
        try:  # ISA-L's inflate, ~2x zlib's
            from isal import igzip as gz
        except ImportError:
            import gzip as gz
        parser, parse = fast_json()
        res = {**_read_and_parse(trace, gz, parse), "parser": f"{gz.__name__.split('.')[-1]} + {parser}"}
    else:
        raise SystemExit(f"unknown child mode {mode}")
    with open(result_path, "w") as fh:
        json.dump(res, fh)
    return 0


def _read_and_parse(trace: str, gz, parse) -> dict:
    """Read `trace` (inflated by the module `gz` when gzip) and parse it: the seconds of each, and its events."""
    t0 = time.perf_counter()
    with (gz.open if trace.endswith(".gz") else open)(trace, "rb") as fh:
        raw = fh.read()
    t1 = time.perf_counter()
    obj = parse(raw)
    try:
        events = len(obj["traceEvents"])
    except KeyError:  # an object without events
        events = 0
    except (TypeError, IndexError):  # not an object
        events = None
    t2 = time.perf_counter()
    return {"read_s": t1 - t0, "json_s": t2 - t0, "loads_s": t2 - t1, "events": events}


def fast_json():
    """(name, parse) of the fastest JSON parser installed: a SIMD parse (the document stays on the parser's
    tape, as a reader that walks it would use it), else orjson, else the standard library."""
    try:
        import simdjson

        return "simdjson", simdjson.Parser().parse
    except ImportError:
        pass
    try:
        import orjson

        return "orjson", orjson.loads
    except ImportError:
        return "json", json.loads


# --------------------------------------------------------------------------- parent side

def _tree_memory(pid: int) -> tuple[int, int]:
    """(RSS, anonymous RSS) in bytes summed over pid and its descendants, from /proc (0, 0 if gone)."""
    pids, i = [pid], 0
    while i < len(pids):  # the descendants, breadth first
        try:
            pids += [int(c) for c in Path(f"/proc/{pids[i]}/task/{pids[i]}/children").read_text().split()]
        except OSError:
            pass
        i += 1
    rss = anon = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
                elif line.startswith("RssAnon:"):
                    anon += int(line.split()[1]) * 1024
        except OSError:
            pass
    return rss, anon


def run_measured(cmd: list[str], timeout: float, mem_limit: int, log_path: str,
                 env: dict | None = None, cwd: str | None = None) -> dict:
    """Run cmd as a fresh child in its own process group; return wall, rusage peak RSS,
    sampled (every 50 ms) tree peak RSS and peak anonymous RSS, exit status and why it was killed, if it was."""
    with open(log_path, "wb") as log:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env, cwd=cwd)
        state = {"killed": None, "tree_peak": 0, "anon_peak": 0}
        done = threading.Event()

        def watch():
            while not done.wait(0.05):
                rss, anon = _tree_memory(p.pid)
                state["tree_peak"] = max(state["tree_peak"], rss)
                state["anon_peak"] = max(state["anon_peak"], anon)
                reason = None
                if time.perf_counter() - t0 > timeout:
                    reason = f"timeout after {timeout:.0f} s"
                elif mem_limit and rss > mem_limit:
                    reason = f"memory guard: process tree RSS {rss / 2**30:.1f} GiB > {mem_limit / 2**30:.1f} GiB"
                if reason:
                    state["killed"] = reason
                    try:
                        os.killpg(p.pid, signal.SIGKILL)  # our own child's process group
                    except ProcessLookupError:
                        pass
                    return

        th = threading.Thread(target=watch, daemon=True)
        th.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        done.set()
        th.join()
        p.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall_s": wall,
        "rss_mb": ru.ru_maxrss / 1024.0,  # Linux: KiB
        "tree_rss_mb": state["tree_peak"] / 2**20 if state["tree_peak"] else None,
        "anon_mb": state["anon_peak"] / 2**20,
        "returncode": p.returncode,
        "killed": state["killed"],
        "user_s": ru.ru_utime,
        "sys_s": ru.ru_stime,
    }


def _tail(path: str, n: int = 600) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - n))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def hta_available(python: str) -> str | None:
    """HTA version string, or None if it cannot be imported by `python`."""
    code = ("import importlib.metadata as m, hta.trace_analysis\n"
            "print(m.version('HolisticTraceAnalysis'))")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def tracesql_command(args) -> tuple[list[str] | None, str]:
    """(command template with {trace} and {out}, description) or (None, why not)."""
    if args.tracesql_cmd:
        return shlex.split(args.tracesql_cmd), args.tracesql_cmd
    exe = shutil.which("tracesql")
    if exe:
        return [exe, "ingest", "{trace}", "-o", "{out}"], f"{exe} ingest {{trace}} -o {{out}}"
    # `python -m tracesql`, importable from the repository root or the environment
    repo = os.path.dirname(HERE)
    code = "import importlib.util as u; import sys; sys.exit(0 if u.find_spec('tracesql.__main__') else 1)"
    r = subprocess.run([args.python, "-c", code], capture_output=True, cwd=repo)
    if r.returncode == 0:
        return ([args.python, "-m", "tracesql", "ingest", "{trace}", "-o", "{out}"],
                f"{args.python} -m tracesql ingest {{trace}} -o {{out}} (cwd {repo})")
    return None, "skipped: tracesql not installed (no `tracesql` on PATH, no `python -m tracesql`)"


def byte_compile(checkout: str, python: str) -> None:
    """Write the bytecode of the checkout's tracesql, as installing a package does: without it (a fresh checkout
    with PYTHONDONTWRITEBYTECODE set, as here) every measured run would first compile the sources (~0.15 s)."""
    subprocess.run([python, "-m", "compileall", "-q", os.path.join(checkout, "tracesql")], capture_output=True)


def _git_rev() -> str | None:
    """Commit of the checkout holding this script (+ '-dirty'), to date tracesql numbers."""
    try:
        r = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=HERE,
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def du_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def trace_info(path: str) -> dict:
    info = {"trace": os.path.abspath(path), "name": os.path.basename(path),
            "gz_bytes": None, "json_bytes": None, "events": None}
    size = os.path.getsize(path)
    if path.endswith(".gz"):
        info["gz_bytes"] = size
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        n = 0
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                n += len(d.decompress(chunk))
        info["json_bytes"] = n + len(d.flush())
    else:
        info["json_bytes"] = size
    meta = path + ".meta.json"  # written by tile_trace.py
    if os.path.exists(meta):
        with open(meta) as fh:
            m = json.load(fh)
        if m.get("bytes_uncompressed") == info["json_bytes"] or m.get("bytes_on_disk") == size:
            info["events"] = m.get("events")
            info["tiled_from"] = m.get("source")
            info["copies"] = m.get("copies")
    return info


def ensure_big(scratch: str, python: str) -> list[str]:
    out = []
    for name, src, min_bytes in BIG_TRACES:
        path = os.path.join(scratch, name)
        if not (os.path.exists(path) and os.path.exists(path + ".meta.json")):
            print(f"# tiling {src} -> {path} (>= {min_bytes:.0e} bytes)", file=sys.stderr, flush=True)
            subprocess.run([python, os.path.join(HERE, "tile_trace.py"), src, path,
                            "--min-bytes", repr(min_bytes), "--quiet"], check=True,
                           stdout=sys.stderr)
        out.append(path)
    return out


def bench_trace(path: str, args, hta_version, ts_cmd, mem_limit: int) -> dict:
    info = trace_info(path)
    big = info["json_bytes"] >= args.big_threshold
    repeat = args.big_repeat if big else args.repeat
    info["repeat"] = repeat
    info["results"] = {}
    stem = info["name"].replace(".json.gz", "").replace(".json", "")
    work = os.path.join(args.scratch, "work", stem)
    os.makedirs(work, exist_ok=True)
    for mode in args.only:
        r: dict = {"runs": []}
        info["results"][mode] = r
        cmd = None
        if mode in ("json", "floor"):
            cmd = [args.python, os.path.abspath(__file__), "_child", mode, info["trace"]]
        elif mode == "hta":
            if hta_version is None:
                r["status"] = "skipped: HTA not installed (pip install HolisticTraceAnalysis psutil)"
            elif info["json_bytes"] > args.skip_hta_over:
                r["status"] = (f"skipped: {info['json_bytes'] / 1e9:.2f} GB > --skip-hta-over "
                               f"{args.skip_hta_over:.2g} bytes")
            else:
                hdir = os.path.join(work, "hta_dir")
                shutil.rmtree(hdir, ignore_errors=True)
                os.makedirs(hdir)
                link = os.path.join(hdir, info["name"])  # keeps the .json/.json.gz suffix HTA wants
                os.symlink(info["trace"], link)
                cmd = [args.python, os.path.abspath(__file__), "_child", "hta", link]
        elif mode == "tracesql":
            if ts_cmd is None:
                r["status"] = "skipped: tracesql not installed"
            else:
                cmd = ts_cmd
        elif mode == "base":
            if not args.base:
                r["status"] = "skipped: no --base checkout"
            else:
                cmd = [args.python, "-m", "tracesql", "ingest", "{trace}", "-o", "{out}"]
        if cmd is None:
            print(f"# {info['name']} {mode}: {r['status']}", file=sys.stderr, flush=True)
            continue
        r["status"] = "ok"
        for i in range(repeat):
            result_path = os.path.join(work, f"{mode}.result.json")
            log_path = os.path.join(work, f"{mode}.{i}.log")
            if os.path.exists(result_path):
                os.remove(result_path)
            run_cmd = list(cmd)
            outdir = None
            if mode in ("tracesql", "base"):
                outdir = os.path.join(work, f"{mode}_out")
                shutil.rmtree(outdir, ignore_errors=True)
                run_cmd = [c.replace("{trace}", info["trace"]).replace("{out}", outdir) for c in cmd]
            else:
                run_cmd = run_cmd + [result_path]
            env = None
            if mode == "base":
                env = dict(os.environ, PYTHONPATH=os.path.abspath(args.base))
            elif mode == "tracesql" and run_cmd[1:3] == ["-m", "tracesql"]:
                # `python -m tracesql` from the checkout, without installing it
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                    x for x in [os.path.dirname(HERE), os.environ.get("PYTHONPATH")] if x))
            # `python -m` puts the working folder first on sys.path: the base runs in its checkout
            m = run_measured(run_cmd, args.timeout, mem_limit, log_path, env=env,
                             cwd=os.path.abspath(args.base) if mode == "base" else None)
            if mode not in ("tracesql", "base") and os.path.exists(result_path):
                with open(result_path) as fh:
                    m.update(json.load(fh))
            if outdir is not None and os.path.exists(outdir):
                m["output_bytes"] = du_bytes(outdir)
                if not args.keep_output:
                    shutil.rmtree(outdir, ignore_errors=True)
            r["runs"].append(m)
            desc = (f"wall {m['wall_s']:.2f}s rss {m['rss_mb']:.0f}MB"
                    + (f" tree {m['tree_rss_mb']:.0f}MB" if m["tree_rss_mb"] else ""))
            print(f"# {info['name']} {mode} run {i + 1}/{repeat}: {desc}"
                  + (f" rc={m['returncode']}" if m["returncode"] else "")
                  + (f" KILLED ({m['killed']})" if m["killed"] else ""), file=sys.stderr, flush=True)
            if m["killed"] or m["returncode"] != 0:
                why = m["killed"] or f"exit status {m['returncode']}"
                r["status"] = f"failed: {why}"
                r["log_tail"] = _tail(log_path)
                break
            if mode in ("json", "floor") and info["events"] is None:
                info["events"] = m.get("events")
        ok = [x for x in r["runs"] if not x["killed"] and x["returncode"] == 0]
        if ok:
            best = min(ok, key=lambda x: x["wall_s"])
            r["wall_s"], r["cpu_s"] = best["wall_s"], best["user_s"] + best["sys_s"]
            r["rss_mb"] = max(x["rss_mb"] for x in ok)
            trees = [x["tree_rss_mb"] for x in ok if x.get("tree_rss_mb")]
            r["tree_rss_mb"] = max(trees) if trees else None
            for k in ("json_s", "load_s", "import_s", "output_bytes"):
                vals = [x[k] for x in ok if x.get(k) is not None]
                if vals:
                    r[k] = min(vals)
            if best.get("parser"):
                r["parser"] = best["parser"]
        elif r["runs"]:
            # keep what the failed run got to (e.g. peak RSS before the kill)
            x = r["runs"][-1]
            r["failed_after_s"] = x["wall_s"]
            r["failed_rss_mb"] = max(x["rss_mb"], x.get("tree_rss_mb") or 0)
    # ratios
    res = info["results"]
    get = lambda m, k: res.get(m, {}).get(k)  # noqa: E731
    ts_wall, ts_rss = get("tracesql", "wall_s"), get("tracesql", "rss_mb")
    info["ratios"] = {
        "hta_over_tracesql_time": (get("hta", "wall_s") / ts_wall) if ts_wall and get("hta", "wall_s") else None,
        "tracesql_over_json_time": (ts_wall / get("json", "wall_s")) if ts_wall and get("json", "wall_s") else None,
        "tracesql_over_base_time": (ts_wall / get("base", "wall_s")) if ts_wall and get("base", "wall_s") else None,
        "tracesql_over_floor_time": (ts_wall / get("floor", "wall_s")) if ts_wall and get("floor", "wall_s") else None,
        "tracesql_rss_over_json_bytes": (ts_rss * 2**20 / info["json_bytes"]) if ts_rss else None,
    }
    return info


# --------------------------------------------------------------------------- report

def _f(x, fmt="{:.2f}"):
    return "–" if x is None else fmt.format(x)


def _cell(r: dict | None, key: str, fmt: str) -> str:
    if r is None:
        return "n/a"
    if key in r:
        return _f(r[key], fmt)
    st = r.get("status", "")
    if st.startswith("skipped"):
        return "skipped"
    if st.startswith("failed"):
        return "FAILED" if key != "rss_mb" or "failed_rss_mb" not in r else f"FAILED (≥{r['failed_rss_mb']:.0f})"
    return "–"


def markdown(results: list[dict]) -> str:
    hdr = ["trace", "gz MB", "JSON MB", "events",
           "(a) json s", "(a) json-only s", "(a) RSS MB",
           "(b) HTA s", "(b) HTA load s", "(b) HTA RSS MB",
           "(c) tracesql s", "(c) tracesql RSS MB", "(c) output MB", "(c) CPU s / M events",
           "(d) base s", "(d) base RSS MB", "(d) CPU s / M events", "(e) floor s", "(e) floor parser",
           "HTA/tracesql time", "tracesql/(a) time", "tracesql/base time", "tracesql/(e) time",
           "tracesql RSS/JSON size"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for t in results:
        R = t["results"]
        a, b, c, d, e = R.get("json"), R.get("hta"), R.get("tracesql"), R.get("base"), R.get("floor")
        ra = t["ratios"]
        per_m = lambda r: r["cpu_s"] / t["events"] * 1e6 if r and "cpu_s" in r and t["events"] else None  # noqa: E731
        row = [t["name"], _f(t["gz_bytes"] and t["gz_bytes"] / 1e6, "{:.1f}"),
               _f(t["json_bytes"] / 1e6, "{:.0f}"), _f(t["events"], "{:,}"),
               _cell(a, "wall_s", "{:.2f}"), _cell(a, "json_s", "{:.2f}"), _cell(a, "rss_mb", "{:.0f}"),
               _cell(b, "wall_s", "{:.2f}"), _cell(b, "load_s", "{:.2f}"), _cell(b, "rss_mb", "{:.0f}"),
               _cell(c, "wall_s", "{:.2f}"), _cell(c, "rss_mb", "{:.0f}"),
               _f(c.get("output_bytes") / 1e6 if c and c.get("output_bytes") is not None else None, "{:.1f}"),
               _f(per_m(c), "{:.2f}"), _cell(d, "wall_s", "{:.2f}"), _cell(d, "rss_mb", "{:.0f}"), _f(per_m(d), "{:.2f}"),
               _cell(e, "wall_s", "{:.2f}"), (e or {}).get("parser", "–"),
               _f(ra["hta_over_tracesql_time"], "{:.1f}×"), _f(ra["tracesql_over_json_time"], "{:.2f}×"),
               _f(ra["tracesql_over_base_time"], "{:.2f}×"), _f(ra["tracesql_over_floor_time"], "{:.2f}×"),
               _f(ra["tracesql_rss_over_json_bytes"], "{:.2f}")]
        lines.append("| " + " | ".join(row) + " |")
    notes = []
    for t in results:
        for mode, r in t["results"].items():
            st = r.get("status", "ok")
            if st != "ok":
                notes.append(f"- {t['name']} / {mode}: {st}"
                             + (f" (after {r['failed_after_s']:.0f} s)" if "failed_after_s" in r else ""))
            if r.get("tree_rss_mb") and r.get("rss_mb") and r["tree_rss_mb"] > 1.1 * r["rss_mb"]:
                notes.append(f"- {t['name']} / {mode}: process-tree RSS peak {r['tree_rss_mb']:.0f} MB "
                             f"(several processes) > single-process {r['rss_mb']:.0f} MB")
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("Usage:")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="*", help=f"trace files (default: {' '.join(DEFAULT_TRACES)})")
    p.add_argument("--big", action="store_true",
                   help="also the tiled >=1 GB and >=2 GB traces of df_index_resolver, made in "
                        "--scratch with tile_trace.py if missing")
    p.add_argument("--scratch", default=DEFAULT_SCRATCH, help=f"scratch dir (default {DEFAULT_SCRATCH})")
    p.add_argument("--only", default=",".join(MODES),
                   help="comma-separated subset of json,hta,tracesql,base,floor (default all; base needs --base)")
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement, best time kept (default 3)")
    p.add_argument("--big-repeat", type=int, default=1,
                   help="runs per measurement for traces of >= --big-threshold bytes (default 1)")
    p.add_argument("--big-threshold", type=float, default=5e8,
                   help="uncompressed size from which --big-repeat applies (default 5e8)")
    p.add_argument("--skip-hta-over", type=float, default=1.5e9,
                   help="skip HTA for traces over this many uncompressed bytes (default 1.5e9)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run before it is killed (default 900)")
    p.add_argument("--mem-limit-gb", type=float, default=None,
                   help="kill a run whose process tree RSS exceeds this (default 85%% of MemAvailable)")
    p.add_argument("--tracesql-cmd", default=None,
                   help="command for (c) with {trace} and {out} placeholders "
                        "(default: `tracesql ingest {trace} -o {out}`, else `python -m tracesql ...`)")
    p.add_argument("--base", default=None, metavar="CHECKOUT",
                   help="a tracesql checkout measured as (d), `python -m tracesql` with PYTHONPATH=CHECKOUT")
    p.add_argument("--python", default=sys.executable, help="interpreter for the (a)/(b) children")
    p.add_argument("--keep-output", action="store_true", help="keep tracesql's output dir in --scratch/work/")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    return p


def parse_args(argv: list[str]):
    """The command line, checked; `only` as a list (benchmarks/targets.py builds its settings here too)."""
    p = build_parser()
    args = p.parse_args(argv)
    args.only = [m.strip() for m in args.only.split(",") if m.strip()]
    bad = [m for m in args.only if m not in MODES]
    if bad:
        p.error(f"unknown mode(s) {bad}; choose from {MODES}")
    return args


def memory_guard(args) -> int:
    """Bytes of process-tree RSS beyond which a run is killed: --mem-limit-gb, else 85 % of MemAvailable."""
    if args.mem_limit_gb:
        return int(args.mem_limit_gb * 2**30)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(int(line.split()[1]) * 1024 * 0.85)
    except OSError:
        pass
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        return _child(argv[1:])
    args = parse_args(argv)
    os.makedirs(args.scratch, exist_ok=True)
    mem_limit = memory_guard(args)

    traces = list(args.traces) or list(DEFAULT_TRACES)
    if args.big:
        traces += ensure_big(args.scratch, args.python)

    hta_version = hta_available(args.python) if "hta" in args.only else None
    ts_cmd, ts_desc = (tracesql_command(args) if "tracesql" in args.only else (None, "not requested"))
    if ts_cmd and ts_cmd[1:3] == ["-m", "tracesql"]:
        byte_compile(os.path.dirname(HERE), args.python)
    if args.base and "base" in args.only:
        byte_compile(args.base, args.python)
    env = {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "cpus": os.cpu_count(), "mem_limit_gb": round(mem_limit / 2**30, 1),
        "hta_version": hta_version, "tracesql_cmd": ts_desc, "tracesql_git": _git_rev(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    hta_desc = (hta_version or "not installed") if "hta" in args.only else "not requested"
    print(f"# HTA: {hta_desc}; tracesql: {ts_desc}; "
          f"memory guard {env['mem_limit_gb']} GiB", file=sys.stderr, flush=True)

    results = []
    for t in traces:
        results.append(bench_trace(t, args, hta_version, ts_cmd, mem_limit))
        if args.json_out:  # write as we go, so a long run leaves partial results
            with open(args.json_out, "w") as fh:
                json.dump({"env": env, "traces": results}, fh, indent=1)

    print(f"HTA {hta_desc}; tracesql: {ts_desc} (checkout {env['tracesql_git']}); "
          f"python {env['python']}, "
          f"{env['cpus']} CPUs. Times: best of N runs, whole fresh process; RSS: max ru_maxrss over runs.\n")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
