"""The tables every trace becomes: names, column types and meaning, and the schema version.

This module is the only place that defines them. Readers and the normalizer produce columns by these names,
the store casts every table to these types before writing, the engine exposes them as views, and
`tracesql schema` / the README print them from here.

Conventions: integer nanoseconds for every time (`ts`, `dur`, `*_ns`); ids are `*_id` and unique within
(run_id, rank); units are suffixes (`_bytes`, `_ns`); unknown values are NULL, never 0 or -1.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bumped whenever a table or column is added, removed, renamed or changes meaning. Written into every run.
SCHEMA_VERSION = 11
#: What each version changed. Versions from OLDEST_READABLE on differ only by additions, so their runs are read
#: as they are (a table they lack reads as empty); a run older than that must be ingested again.
SCHEMA_CHANGES = {
    1: "first version",
    2: "added tables counters (sampled values: Chrome counter events, Perfetto counter tracks) and warnings "
       "(data-quality checks of each source)",
    3: "XLA (issue 13): added table xla_ops (the HLO ops of each XLA program: opcode, category, shapes, replica "
       "groups, costs, source); ops gains program_id and bytes_accessed and holds one row per XLA op execution "
       "(TPU and CPU ops, GPU kernels of one HLO op); memory gains allocator, peak_allocated_bytes, "
       "requested_bytes, fragmentation and op_name, and holds XPlane's allocator events; memory.device_type "
       "may be 'tpu'",
    4: "inference iterations (issue 14): steps come from the rule that matches the rank's ranges (vLLM, SGLang, "
       "ProfilerStep, vLLM execute_model, or --step-pattern) and gain rule, phase, batch_size, tokens and "
       "prefill_tokens (NULL in older runs); collectives.seq, when counted by tracesql, counts each kind of "
       "call apart (point-to-point calls together)",
    5: "phases (issue 14): ops gains fwd_op_id (the forward op a backward op differentiates: Kineto's fwdbwd "
       "flows, else autograd sequence numbers)",
    6: "steps on the device (issue 12): steps.device_ts/device_dur are the step's device window (from its first "
       "device event to the next step's first; windows no longer overlap); device work with no captured launch "
       "takes its step by its order on its stream (slices.step)",
    7: "torch_npu memory (issue 25): memory holds torch_npu's memory_record.csv / operator_memory.csv / "
       "npu_module_mem.csv (device_type 'npu', allocator = the component: PTA, GE, APP, 'module <NAME>'); the memory "
       "queries give a row (curve) per device and allocator; total_reserved_bytes is NULL, not 0, where the trace "
       "gives no such figure (PyTorch's CPU memory events). XPlane against XProf (issue 25): a TPU op's "
       "slices.ts/dur are the device's clock (device_offset_ps, device_duration_ps; the timeline's span in args.span_ts/span_ns); steps may come "
       "from the device 'Steps' line (rule xplane_steps); xla_ops gains async_start (an async -done's -start op); "
       "collectives gains warning (a bus bandwidth above the link's peak)",
    8: "run configuration (issue 30): added table runs (one row per run: its labels, key = value, from --label, "
       "a tracesql.toml or labels.json beside the traces, --label-pattern over folder names and what the traces "
       "record; older runs have no row). Launches on the device events (issue 24): slices gains launch_ts, "
       "launch_dur, launch_pid and launch_tid, the launching call's start, duration, process and thread, so that "
       "queries need not join each device event to its launch (a run of an older version derives them from "
       "launch_id when read). Point-to-point pairs (issue 29): collectives gains peer (a send's "
       "destination, a recv's source, global rank; NULL in older runs and for other calls)",
    9: "device classes at ingest (issue 24): slices gains class, each kernel's, copy's and memset's class by the "
       "default rules of kernel_classes (compute, communication, memory, infeed_outfeed), so that queries need "
       "not classify every device event by name (NULL in older runs, which device_activity classifies when read)",
    10: "op costs at ingest (issue 28): added table op_costs (each op's FLOPs, bytes, cost family and whether it "
       "is counted, worked out once when the run is ingested by the formulas of functions/30_flops.sql); "
       "op_costs() and the queries that cost ops (mfu, roofline, cost_coverage) read it, and refuse a run of an "
       "older version (ingest it again)",
    11: "costs of kernels with no launch (issue 28): op_costs gains cost_source (where an op's cost comes from: "
        "'formula', 'xla', 'identical kernel') and cost_op_id, and a row for each kernel with no launch recorded "
        "whose identical kernels (same name, grid, block, registers, shared memory) were launched by costed ops "
        "(op_id: the kernel's slice_id): their cost when they all agree ('identical kernel'), else the cost of "
        "the ops that launched the identical kernels at its place in its stream's kernel sequence, when they agree "
        "('aligned kernel'), else none; a run of version 10 reads "
        "cost_source from family and flops",
}
OLDEST_READABLE = 1
#: The first version whose slices store each device event's class (slices.class): a session whose runs are all of
#: this version or newer reads it (functions/20_activity.sql, device_activity); else it classifies by name.
CLASSES_STORED_SINCE = 9
#: Tables written once per run at ingest (not a part per source file).
RUN_TABLES = ("runs", "op_costs")
#: Columns that a run of an older version lacks but that its other columns give, derived when it is read
#: (views.view_sql), so that queries read such a run as a current one: table -> (a join onto the table's rows, `t`,
#: over `{files}` (the table's own files), {column: expression}).
DERIVED_FOR_OLDER_RUNS = {
    "op_costs": ("", {"cost_source": "CASE WHEN t.flops IS NULL THEN NULL WHEN t.family = 'xla' THEN 'xla' "
                                     "ELSE 'formula' END"}),
    "slices": ("LEFT JOIN (SELECT run_id, rank, slice_id, ts, dur, pid, tid FROM read_parquet([{files}], "
               "union_by_name = true)) launch ON launch.run_id = t.run_id AND launch.rank = t.rank "
               "AND launch.slice_id = t.launch_id",
               {"launch_ts": "launch.ts", "launch_dur": "launch.dur", "launch_pid": "launch.pid",
                "launch_tid": "launch.tid"}),
}


#: What names a PyTorch step range: 'ProfilerStep#3', also with a trailing label ('ProfilerStep#3 (train.py:20)':
#: VizTracer's log_event). Python re and DuckDB (RE2) syntax alike. The steps table's other rules (inference
#: iterations, --step-pattern) are in tracesql.step_rules.
STEP_PATTERN = r"^ProfilerStep#(?P<step>\d+)(?:\s.*)?$"
#: `slices.kind` values of host calls that launch device work (their correlation id links the work to them).
LAUNCH_KINDS = ("runtime", "driver")
#: `slices.kind` values of device work that counts as device time (and is charged to the op that launched it).
DEVICE_TIME_KINDS = ("kernel", "memcpy", "memset")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # DuckDB type
    doc: str


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


def _cols(*rows: tuple[str, str, str]) -> tuple[Column, ...]:
    return tuple(Column(*row) for row in rows)


_RUN_RANK = (
    ("run_id", "VARCHAR", "Name of the run (the ingested folder's name unless given with --run-id)."),
    ("rank", "INTEGER", "Global rank of the process that wrote the trace."),
)

TABLES: dict[str, Table] = {
    t.name: t
    for t in [
        Table(
            "runs",
            "One row per run: its configuration as labels (key = value), which group replicate runs and sweeps "
            "(docs/guides/ci.md). Runs of schema version 7 and older have no row.",
            _cols(
                ("run_id", "VARCHAR", "Name of the run."),
                ("labels", "JSON", "Every label of the run, key -> value (strings): `labels->>'dp'`."),
                ("label_sources", "JSON", "Where each label came from, key -> 'option' (--label), 'file' "
                 "(tracesql.toml, labels.json), 'folder' (--label-pattern) or 'trace' (what the traces record)."),
            ),
        ),
        Table(
            "ranks",
            "One row per ingested trace file: which rank it is, where it came from, and its time span.",
            _cols(
                *_RUN_RANK,
                ("source_path", "VARCHAR", "Path of the trace file, relative to the ingested folder."),
                ("source_format", "VARCHAR", "Detected format of the file (e.g. 'kineto')."),
                ("source_bytes", "BIGINT", "Size of the file on disk (compressed if it was compressed)."),
                ("world_size", "INTEGER", "Number of ranks in the job, when the trace says."),
                ("backend", "VARCHAR", "Distributed backend named by the trace (nccl, gloo, ...)."),
                ("host_name", "VARCHAR", "Host that wrote the trace, when recorded."),
                ("base_time_ns", "BIGINT", "Offset added to the file's timestamps to make them absolute (0 if none)."),
                ("trace_start_ns", "BIGINT", "First timestamp of any event in the file."),
                ("trace_end_ns", "BIGINT", "Last end timestamp of any event in the file."),
                ("event_count", "BIGINT", "Events read from the file (metadata and flow events included)."),
                ("skipped_count", "BIGINT", "Damaged events skipped (no timestamp, negative duration, bad types)."),
                ("metadata", "JSON", "The file's remaining top-level fields (trace id, schema version, ...)."),
            ),
        ),
        Table(
            "devices",
            "Accelerators seen in each rank's trace, with the properties the profiler recorded.",
            _cols(
                *_RUN_RANK,
                ("device_id", "INTEGER", "Device index as used by `slices.device_id`."),
                ("name", "VARCHAR", "Device name as reported (e.g. 'NVIDIA H100 80GB HBM3'); NULL if not recorded."),
                ("total_memory_bytes", "BIGINT", "Device memory size."),
                ("compute_capability", "VARCHAR", "'major.minor' for NVIDIA devices, gfx version for AMD when given."),
                ("sm_count", "INTEGER", "Streaming multiprocessors / compute units."),
                ("properties", "JSON", "Every property the trace recorded for the device."),
            ),
        ),
        Table(
            "process_groups",
            "Communication process groups each rank belonged to (from the trace's distributed info).",
            _cols(
                *_RUN_RANK,
                ("pg_name", "VARCHAR", "Process group name, as used by `collectives.pg_name`."),
                ("pg_desc", "VARCHAR", "Process group description (default_pg, ...)."),
                ("backend", "VARCHAR", "Backend configuration of the group."),
                ("group_size", "INTEGER", "Number of ranks in the group."),
                ("group_ranks", "INTEGER[]", "Global ranks in the group, in group order."),
            ),
        ),
        Table(
            "slices",
            "Every timed event, on the host (ops, annotations, runtime calls) and on devices (kernels, copies).",
            _cols(
                *_RUN_RANK,
                ("slice_id", "BIGINT", "Id of the event, unique within (run_id, rank): its index in the source's event list."),
                (
                    "kind",
                    "VARCHAR",
                    "Normalized kind: cpu_op, user_annotation, python_function, runtime, driver, kernel, memcpy, "
                    "memset, gpu_annotation, sync, memory (allocator instant), instant, profiler, other.",
                ),
                ("category", "VARCHAR", "The event's category as the source named it (Kineto `cat`)."),
                ("name", "VARCHAR", "Event name (op, kernel, annotation text)."),
                ("ts", "BIGINT", "Start, absolute nanoseconds. XPlane device ops that the device timed "
                 "(TPU): by the device's clock, anchored at the device's first op (the timeline's start: args.span_ts)."),
                ("dur", "BIGINT", "Duration in nanoseconds (0 for instants). XPlane device ops that the device timed "
                 "(TPU): the device's own duration (device_duration_ps), as XProf counts it; the timeline's span "
                 "is args.span_ns."),
                ("pid", "BIGINT", "Host process id; for device events the device index the source used as pid."),
                ("tid", "BIGINT", "Host thread id; for device events the source's lane (stream)."),
                ("device_id", "INTEGER", "Device index for device events; NULL on the host."),
                ("stream", "BIGINT", "Device stream / queue for device events; NULL on the host."),
                ("track", "VARCHAR", "Human label of the lane the event sits on (process/thread or device/stream)."),
                ("parent_id", "BIGINT", "slice_id of the innermost event on the same track that encloses this one."),
                ("depth", "INTEGER", "Nesting depth on the track (0 = top level)."),
                ("correlation", "BIGINT", "Correlation id linking a runtime launch and the device work it caused "
                                           "(a copy of a graph capture's op: its graph launch's)."),
                ("external_id", "BIGINT", "Framework-level external id (Kineto 'External id')."),
                ("launch_id", "BIGINT", "For device events: slice_id of the host runtime/driver call that launched it."),
                ("launch_ts", "BIGINT", "For launched device events: start of the launching call (its `ts`)."),
                ("launch_dur", "BIGINT", "For launched device events: duration of the launching call."),
                ("launch_pid", "BIGINT", "For launched device events: process of the launching call (its `pid`)."),
                ("launch_tid", "BIGINT", "For launched device events: thread of the launching call (its `tid`)."),
                ("class", "VARCHAR", "For kernels, copies and memsets: their class by the default rules of "
                 "`kernel_classes` (compute, communication, memory, infeed_outfeed; NULL where no rule matches). "
                 "`device_activity()` gives it for either scheme."),
                (
                    "op_id",
                    "BIGINT",
                    "The innermost enclosing cpu_op (for device events: of the launching call; for a graph-replayed "
                    "kernel whose capture trace was read, the copy of the op that launched it at capture); joins "
                    "`ops.op_id`.",
                ),
                ("step", "INTEGER", "Training/inference step the event belongs to (device events: their launch's)."),
                ("args", "JSON", "Every remaining argument the source recorded, as JSON."),
            ),
        ),
        Table(
            "ops",
            "Framework operators (aten::*, TensorFlow's node:Type ops, custom ops) and XLA ops (one row per execution of an HLO op: a TPU or "
            "CPU op event, or the kernels one HLO op launched on a GPU) with their inputs and the device time "
            "they caused. Every other argument is in `slices.args` (join on rank and op_id = slice_id); an XLA "
            "op's HLO details are in `xla_ops` (join on rank, program_id and name).",
            _cols(
                *_RUN_RANK,
                ("op_id", "BIGINT", "slice_id of the op (XLA on a GPU: of the first launch of its kernels)."),
                ("name", "VARCHAR", "Operator name (e.g. aten::addmm; XLA: the HLO op's name, e.g. fusion.3)."),
                ("ts", "BIGINT", "Start, absolute ns."),
                ("dur", "BIGINT", "Host duration, ns (inclusive of child ops); XLA ops on TPU/CPU: the op's own "
                 "duration; on a GPU: from its first launch's start to its last launch's end."),
                ("self_dur", "BIGINT", "Host duration minus the time covered by directly nested ops and annotations (the union "
                 "of their intervals: never negative)."),
                ("pid", "BIGINT", "Host process id."),
                ("tid", "BIGINT", "Host thread id."),
                ("parent_op_id", "BIGINT", "The enclosing op, if any (NULL for top-level ops)."),
                ("op_depth", "INTEGER", "Number of enclosing ops (0 = top-level op)."),
                ("step", "INTEGER", "Step the op belongs to."),
                ("external_id", "BIGINT", "Kineto 'External id'."),
                ("sequence_number", "BIGINT", "Autograd sequence number (links forward and backward ops)."),
                ("fwd_thread_id", "BIGINT", "For backward ops: the thread of the matching forward op."),
                ("fwd_op_id", "BIGINT", "For backward ops: op_id of the forward op they differentiate, from Kineto's "
                 "fwdbwd flow events, else (traces without them) by the rule PyTorch writes them with: the latest "
                 "forward op of the process with the same sequence_number to start before it. NULL for other ops, "
                 "and when the forward op is not in the trace."),
                ("input_dims", "BIGINT[][]", "Shape of each input (record_shapes); NULL entries for non-tensor inputs."),
                ("input_types", "VARCHAR[]", "Dtype or kind of each input (float, c10::BFloat16, Scalar, ...)."),
                ("input_strides", "BIGINT[][]", "Strides of each tensor input, when recorded."),
                ("concrete_inputs", "VARCHAR[]", "Values of scalar inputs, when recorded."),
                ("flops", "DOUBLE", "FLOPs the profiler counted for the op (with_flops=True); XLA ops: XLA's cost "
                 "analysis when the profile carries it, else counted from the HLO shapes (xla_ops.cost_source); "
                 "NULL if not known."),
                ("bytes_accessed", "DOUBLE", "XLA ops: bytes read and written, as xla_ops.bytes_accessed; NULL for "
                 "framework ops (tracesql's op_bytes() counts those from their shapes)."),
                ("program_id", "VARCHAR", "XLA ops: the program (HLO module) that ran the op, as `xla_ops.program_id`; "
                 "NULL for framework ops."),
                ("kernel_count", "BIGINT", "Device events launched directly by this op (not by nested ops)."),
                ("device_self_ns", "BIGINT", "Summed duration of device events launched directly by this op."),
                ("kernel_count_total", "BIGINT", "Device events launched by this op or any op nested in it."),
                ("device_total_ns", "BIGINT", "Summed duration of device events launched by this op or nested ops."),
            ),
        ),
        Table(
            "op_costs",
            "The cost model's numbers for every op (docs/concepts/cost-model.md), worked out once per distinct call "
            "when the run is ingested, by the formulas of tracesql/functions/30_flops.sql (op_flops, op_bytes), and "
            "for each kernel with no launch recorded whose identical kernels were launched by costed ops: what "
            "op_costs(), mfu, roofline and cost_coverage read. Runs of schema version 8 and older have no rows.",
            _cols(
                *_RUN_RANK,
                ("op_id", "BIGINT", "The op (`ops.op_id`); for a kernel with no launch recorded (cost_source "
                 "'identical kernel' or 'aligned kernel'), the kernel's `slices.slice_id`."),
                ("family", "VARCHAR", "Which formula costs the op: gemm, conv, attention, elementwise, reduction, norm, "
                 "softmax, copy, upsample, pool, index, fused, triton, loss, random, view (moves nothing), or xla "
                 "(XLA's own cost analysis); NULL when tracesql has no formula for it."),
                ("dtype", "VARCHAR", "The dtype the op is rated against, as a device_peaks column (fp32, bf16, ...): "
                 "its first tensor argument's."),
                ("flops", "DOUBLE", "FLOPs of the call, causal attention halved (attention_convention 'flash'); NULL "
                 "without a formula or without the shapes it needs."),
                ("torch_flops", "DOUBLE", "FLOPs as FlopCounterMode counts them (attention_convention 'torch': causal "
                 "attention not halved); equal to flops for every other op."),
                ("bytes", "DOUBLE", "Bytes the call moves at least (each tensor read once, each output written once)."),
                ("device_total_ns", "BIGINT", "The device time its cost is rated against: `ops.device_total_ns`, or "
                 "for the -start of an XLA async pair on a device lane the pair's span to its -done."),
                ("counted", "BOOLEAN", "True for the ops whose FLOPs and bytes add up without double counting (the "
                 "innermost math op, the outermost other op with a formula; see op_costs())."),
                ("cost_source", "VARCHAR", "Where the cost comes from: 'formula' (the op's recorded arguments), 'xla' "
                 "(XLA's own numbers: xla_ops.cost_source), 'identical kernel' (a kernel with no launch: the cost of "
                 "the ops that launched identical kernels, same name, grid, block, registers and shared memory, each "
                 "that one kernel's only op; flops NULL when their costs differ), 'aligned kernel' (a kernel with no "
                 "launch whose identical kernels' ops differ: the cost of those that launched the identical kernels "
                 "at its place in the kernel sequence of its stream, the launchless kernels lined up with the "
                 "launched ones where most match); NULL: no cost."),
                ("cost_op_id", "BIGINT", "For cost_source 'identical kernel' or 'aligned kernel' with a cost: one op it is taken from "
                 "(the first); NULL otherwise."),
            ),
        ),
        Table(
            "collectives",
            "Each communication call: its size, group and timing on the host and on the device.",
            _cols(
                *_RUN_RANK,
                ("collective_id", "BIGINT", "slice_id of the host call (record_param_comms), or of the kernel."),
                (
                    "collective",
                    "VARCHAR",
                    "Normalized collective: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, "
                    "send, recv, send_recv, barrier, gather, scatter, or the source's name.",
                ),
                ("source_name", "VARCHAR", "The collective's name as recorded (Collective name or kernel name)."),
                ("pg_name", "VARCHAR", "Process group name (the rank's only group when the call names none)."),
                ("pg_desc", "VARCHAR", "Process group description."),
                ("group_size", "INTEGER", "Ranks in the group."),
                ("group_ranks", "INTEGER[]", "Global ranks in the group."),
                ("seq", "BIGINT", "Sequence number of the call within (rank, pg_name): matches calls across ranks "
                 "(with the kind: collective_match_key). When the trace records none, tracesql counts the calls of "
                 "each kind (point-to-point calls together) in time order."),
                (
                    "seq_recorded",
                    "BOOLEAN",
                    "True when the trace recorded seq; false when it counts the rank's calls in time order (then "
                    "ranks whose profiles start at different calls disagree).",
                ),
                ("peer", "INTEGER", "Global rank at the other end of a send (its destination) or recv (its "
                 "source): Kineto's Dst/Src Rank, else the call's group rank mapped by group_ranks; NULL for "
                 "other calls."),
                ("dtype", "VARCHAR", "Element type."),
                ("dtype_bytes", "INTEGER", "Bytes per element."),
                ("in_nelems", "BIGINT", "Input elements."),
                ("out_nelems", "BIGINT", "Output elements."),
                ("size_bytes", "BIGINT", "Message size (nccl-tests convention: output for all_gather, else input)."),
                ("cpu_ts", "BIGINT", "Start of the host call, ns (NULL for kernel-only rows)."),
                ("cpu_dur", "BIGINT", "Duration of the host call, ns."),
                ("kernel_count", "INTEGER", "Communication kernels that ran for the call."),
                ("device_id", "INTEGER", "Device the kernels ran on."),
                ("stream", "BIGINT", "Stream of the (first) kernel."),
                ("device_ts", "BIGINT", "Start of the first kernel, ns."),
                ("device_dur", "BIGINT", "From the first kernel's start to the last kernel's end, ns."),
                ("kernel_dur", "BIGINT", "Summed kernel durations, ns."),
                ("step", "INTEGER", "Step of the call."),
            ),
        ),
        Table(
            "memory",
            "Allocator events (PyTorch profile_memory=True, XPlane's MemoryAllocation/MemoryDeallocation, "
            "torch_npu's memory_record.csv and npu_module_mem.csv): each allocation or free, or sample, with the "
            "running totals.",
            _cols(
                *_RUN_RANK,
                ("memory_id", "BIGINT", "slice_id of the allocator event."),
                ("ts", "BIGINT", "When, absolute ns."),
                ("device_type", "VARCHAR", "'cpu', 'gpu', 'tpu', 'npu' or 'other' (from the event's Device Type, or "
                 "the XPlane allocator's name)."),
                ("device_id", "INTEGER", "Device index (-1 for host memory)."),
                ("addr", "BIGINT", "Address of the block."),
                ("bytes", "BIGINT", "Bytes allocated (positive) or freed (negative)."),
                ("total_allocated_bytes", "BIGINT", "Allocated bytes on the device after the event."),
                ("total_reserved_bytes", "BIGINT", "Bytes reserved by the caching allocator after the event; NULL "
                 "where the trace gives no such figure (PyTorch's CPU allocator, which has no cache; XPlane's BFC "
                 "allocators, whose bytes_reserved is memory set aside, not held)."),
                ("pid", "BIGINT", "Host process id."),
                ("tid", "BIGINT", "Host thread id."),
                ("op_id", "BIGINT", "The op that was running on that thread (the allocating op)."),
                ("step", "INTEGER", "Step of the event."),
                ("allocator", "VARCHAR", "Allocator that recorded the event (XPlane: e.g. 'GPU_0_bfc'; torch_npu: the "
                 "component, PTA = torch_npu's caching allocator, GE = the graph engine's, APP = the process's whole "
                 "reservation, 'module <NAME>' = a CANN module's); NULL when not named."),
                ("peak_allocated_bytes", "BIGINT", "The allocator's own peak of bytes in use so far (XPlane "
                 "peak_bytes_in_use), which may predate the profile; NULL when not recorded."),
                ("requested_bytes", "BIGINT", "Bytes the caller asked for (the allocation may be rounded up)."),
                ("fragmentation", "DOUBLE", "The allocator's fragmentation after the event, 0..1 (XPlane BFC)."),
                ("op_name", "VARCHAR", "Framework op / region the memory is for, as the allocator recorded it "
                 "(XPlane tf_op, torch_npu operator_memory.csv); NULL when not recorded."),
            ),
        ),
        Table(
            "xla_ops",
            "The ops of each XLA program (HLO module) the profile ran, from the HLO it carries (XPlane's metadata "
            "plane) or an --xla-dump folder: one row per op of the entry computation and of the computations it "
            "runs through control flow. Ops join it on (rank, program_id, name); slices of XLA ops name theirs "
            "in args (hlo_op, program_id).",
            _cols(
                *_RUN_RANK,
                ("program_id", "VARCHAR", "Program id as the profile names it (a 64-bit fingerprint on TPU, a small "
                 "number on CPU/GPU), unsigned, as text."),
                ("module", "VARCHAR", "HLO module name (e.g. jit_train_step)."),
                ("name", "VARCHAR", "Op (HLO instruction) name, unique in the module (e.g. fusion.3)."),
                ("opcode", "VARCHAR", "HLO opcode (fusion, dot, all-reduce, copy-start, custom-call, ...)."),
                ("fusion_kind", "VARCHAR", "For fusions: kLoop, kInput, kOutput or kCustom."),
                ("category", "VARCHAR", "Category as XProf shows it: the profile's hlo_category (TPU), else XLA's "
                 "(data formatting, non-fusion elementwise, loop fusion, convolution fusion, all-reduce, ...); a "
                 "fusion wrapping a collective is '<collective> fusion'."),
                ("collective", "VARCHAR", "The collective the op is or wraps (all_reduce, all_gather, reduce_scatter, "
                 "all_to_all, collective_permute, send, recv, broadcast); NULL for other ops."),
                ("async_start", "VARCHAR", "For the -done half of an asynchronous pair (copy-done, all-reduce-done, "
                 "collective-permute-done, all-gather-done, send-done, recv-done, async-done): the name of its "
                 "-start op (copy-start, ..., send, recv, async-start), whose work it waits for; NULL for other ops."),
                ("computation", "VARCHAR", "Computation the op is in: NULL for the entry computation, else a while "
                 "body, branch or called computation."),
                ("output_shape", "VARCHAR", "Output shape as XLA prints it, with layout, tiling and memory space "
                 "(e.g. f32[256,128]{1,0}, bf16[8,1024]{1,0:T(8,128)S(1)}; tuples in parentheses)."),
                ("output_type", "VARCHAR", "Element type of the output (f32, bf16, s32, pred, ...); NULL for tuples."),
                ("output_dims", "BIGINT[]", "Output dimensions; NULL for tuples."),
                ("operand_shapes", "VARCHAR[]", "Each operand's shape as XLA prints it (layout and memory space)."),
                ("operand_types", "VARCHAR[]", "Each operand's element type."),
                ("operand_dims", "BIGINT[][]", "Each operand's dimensions."),
                ("fused_root", "VARCHAR", "For fusions: the opcode of the fused computation's root."),
                ("fused_ops", "INTEGER", "For fusions: instructions in the fused computations."),
                ("replica_groups", "INTEGER[][]", "For collectives (also wrapped in a fusion): the device groups."),
                ("group_size", "INTEGER", "Devices in each replica group."),
                ("channel_id", "BIGINT", "Channel id of a cross-program collective."),
                ("collective_dtype", "VARCHAR", "Element type of the collective's operands (also when wrapped)."),
                ("collective_in_elems", "BIGINT", "Elements of the collective's operands."),
                ("collective_out_elems", "BIGINT", "Elements of the collective's result."),
                ("flops", "DOUBLE", "FLOPs of one execution: XLA's cost analysis when the profile carries it, else "
                 "counted from the shapes (2 per multiply-add for dot/convolution; 1 per output element of "
                 "elementwise ops and per reduced element; fusions: the sum over their parts)."),
                ("bytes_accessed", "DOUBLE", "Bytes one execution reads and writes: XLA's cost analysis when the "
                 "profile carries it, else operands read once plus the output written once."),
                ("cost_source", "VARCHAR", "'profile' (XLA's cost analysis recorded in the profile), "
                 "'cost_estimate' (a custom call's own declared cost: a Pallas/Mosaic kernel's cost_estimate, kept "
                 "in its backend config) or 'shapes' (counted by tracesql from the HLO's shapes; for the custom "
                 "calls it knows, from the dims their operands and backend configs record)."),
                ("op_name", "VARCHAR", "The framework op path (JAX named scopes: jit(step)/transpose(jvp(...))/dot)."),
                ("op_type", "VARCHAR", "The framework op type, when recorded."),
                ("source_file", "VARCHAR", "Source file of the framework op."),
                ("source_line", "INTEGER", "Line in source_file."),
                ("hlo_text", "VARCHAR", "The op's HLO text, when the profile carries it (TPU)."),
            ),
        ),
        Table(
            "counters",
            "Sampled values over time: Chrome JSON counter ('C') events, Perfetto counter tracks. One row per sample.",
            _cols(
                *_RUN_RANK,
                ("name", "VARCHAR", "Counter name (the event's or the counter track's)."),
                ("series", "VARCHAR", "Series within the counter: the args key of a Chrome counter event (one event sets "
                 "several series); NULL for single-valued counters (Perfetto)."),
                ("track", "VARCHAR", "Process (or device) the counter belongs to, as in slices.track."),
                ("device_id", "INTEGER", "Device the counter measures, when it is a device counter."),
                ("ts", "BIGINT", "When the value was sampled, absolute ns."),
                ("value", "DOUBLE", "The value from this sample until the next one."),
            ),
        ),
        Table(
            "steps",
            "Steps per rank, on the host and projected onto the device: training steps (ProfilerStep#N ranges) or "
            "inference iterations (vLLM execute_..., SGLang step[...] ranges), or the ranges --step-pattern names "
            "at ingest. One rule defines a rank's steps: the user's pattern, else the first built-in rule that "
            "matches (sglang, vllm, vllm_new_cached, profiler_step, vllm_execute_model, xplane_steps: the device "
            "'Steps' line of an XPlane whose host marks no step, one row per step: its longest device's marker, "
            "XProf's step time).",
            _cols(
                *_RUN_RANK,
                ("step", "INTEGER", "Step number: N of ProfilerStep#N (or the pattern's `step` group), else 0, 1, ... "
                 "in time order."),
                ("name", "VARCHAR", "Name of the range that defines the step."),
                ("slice_id", "BIGINT", "slice_id of that range."),
                ("ts", "BIGINT", "Host start, ns (xplane_steps: the device marker's)."),
                ("dur", "BIGINT", "Host duration, ns (xplane_steps: the device marker's)."),
                ("device_ts", "BIGINT", "Start of the step's device window: its first device event (launched in the "
                 "step; work with no captured launch placed by its order on its stream, docs/concepts/steps.md); "
                 "xplane_steps: the marker's start."),
                ("device_dur", "BIGINT", "Length of the step's device window: up to the next step's first device event "
                 "(the last step: to the last stepped device event). Windows of consecutive steps do not overlap. "
                 "xplane_steps: the marker's duration (XProf's step time)."),
                ("kernel_count", "BIGINT", "Device events of the step (kernels, copies, memsets)."),
                ("rule", "VARCHAR", "The rule that recognised the range: profiler_step, sglang, vllm, vllm_new_cached, "
                 "vllm_execute_model, xplane_steps or user (--step-pattern)."),
                ("phase", "VARCHAR", "Inference iterations: prefill, decode or mixed (both in one batch; 'idle' for "
                 "SGLang's idle batches), as the name says; NULL when it does not."),
                ("batch_size", "INTEGER", "Requests in the iteration's batch, when the name says."),
                ("tokens", "BIGINT", "Tokens the iteration processed (prefill and decode), when the name says."),
                ("prefill_tokens", "BIGINT", "Of those, prefill tokens (0 for a decode iteration), when known."),
            ),
        ),
        Table(
            "warnings",
            "Data-quality checks of each source, one row per check that found something: damaged events that were "
            "skipped, device work without a launch, repeated correlation ids, steps that never end, rank clocks "
            "far apart. Queries still run on such data; these rows say how far to trust it.",
            _cols(
                *_RUN_RANK,
                ("source_path", "VARCHAR", "The trace file the check ran on (as in `ranks.source_path`)."),
                (
                    "check_name",
                    "VARCHAR",
                    "end_before_start, missing_timestamp, missing_duration, time_out_of_range, malformed_event, "
                    "unsupported_event, "
                    "unterminated_step, unterminated_slice, unmatched_end, kernel_without_launch, repeated_correlation, clock_skew.",
                ),
                ("event_count", "BIGINT", "Events the check found (for clock_skew: 1)."),
                ("example", "VARCHAR", "One of them, as text (NULL when the source gives none)."),
                ("message", "VARCHAR", "What was found and what tracesql did about it."),
            ),
        ),
    ]
}


_ARROW_SCALARS = {
    "VARCHAR": lambda pa: pa.string(),
    "JSON": lambda pa: pa.json_(pa.string()),
    "BIGINT": lambda pa: pa.int64(),
    "INTEGER": lambda pa: pa.int32(),
    "DOUBLE": lambda pa: pa.float64(),
    "BOOLEAN": lambda pa: pa.bool_(),
}


def arrow_type(duckdb_type: str):
    """The Arrow type a column of this DuckDB type is stored as (JSON keeps Parquet's JSON logical type)."""
    import pyarrow as pa

    if duckdb_type.endswith("[]"):
        return pa.list_(arrow_type(duckdb_type[:-2]))
    return _ARROW_SCALARS[duckdb_type](pa)


def arrow_schema(table: str):
    import pyarrow as pa

    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in TABLES[table].columns])


def conform(table: str, data):
    """`data` (an Arrow table) with exactly the table's columns, in order and of its types. Dictionary-encoded
    strings stay dictionary-encoded (same logical type, smaller and faster to write)."""
    import pyarrow as pa

    columns = []
    for c in TABLES[table].columns:
        col = data[c.name]
        target = arrow_type(c.type)
        if pa.types.is_dictionary(col.type) and target == pa.string():
            target = pa.dictionary(col.type.index_type, pa.string())
        if col.type != target:
            col = col.cast(target)
        columns.append(col)
    return pa.Table.from_arrays(columns, names=TABLES[table].column_names)


def select_list(table: str) -> str:
    """`CAST(col AS type) AS col, ...` in schema order: the projection that makes a relation conform."""
    return ", ".join(f'CAST("{c.name}" AS {c.type}) AS "{c.name}"' for c in TABLES[table].columns)


def markdown() -> str:
    """The schema as Markdown (README and `tracesql schema --format markdown`)."""
    out = [f"Schema version {SCHEMA_VERSION}. Times are integer nanoseconds.\n"]
    for t in TABLES.values():
        out.append(f"### `{t.name}`\n{t.doc}\n\n| column | type | meaning |\n|---|---|---|")
        out += [f"| `{c.name}` | {c.type} | {c.doc} |" for c in t.columns]
        out.append("")
    return "\n".join(out)
