"""HLO modules (xla.HloProto / HloModuleProto) -> one row per XLA op of each program: the `xla_ops` table.

XLA profiles carry the optimized HLO of every program they ran (XPlane's '/host:metadata' plane: one 'Hlo Proto'
per program), and `--xla_dump_to` folders hold the same modules as files. An *op* is an instruction that runs
as one unit: those of the entry computation and of the computations it runs through control flow (while
bodies, conditional branches, calls, async wrappers); the computations fused into a fusion instruction or
applied by a reduction are parts of their op, and describe it (fused root, collective inside, costs).

Categories follow XProf / XLA's `HloInstruction::ToCategory` ('data formatting', 'non-fusion elementwise',
'loop fusion', 'convolution', 'all-reduce', ...); a fusion that wraps a collective is '<collective> fusion',
so that it counts as communication. Costs: XLA's own cost analysis where the profile records it (TPU
profiles: per op `flops` and `bytes_accessed`), else counted here from the shapes: 2 FLOPs per multiply-add
for dot and convolution, one per output element of elementwise ops (transcendentals too, as tracesql's
other formulas), one per reduced input element; bytes = operands read once + output written once (for a
fusion, its operands and output: what crosses memory). Custom calls (kernels XLA does not see into): a Pallas /
Mosaic kernel's own `cost_estimate` (pallas_call(cost_estimate=...)), which XLA keeps in the call's backend config
and its cost analysis reports as the op's cost; else, for the targets tracesql knows, from the dims the call's
operands and backend config record: cuBLAS/hipBLASLt GEMMs as a dot, Transformer Engine's fused attention as
attention (`CUSTOM_CALL_FLOPS`); other custom calls have no FLOPs.
"""

from __future__ import annotations

import json
import math
import re
from functools import cache

from .proto import messages

#: Opcodes that move or reformat data without arithmetic (XLA's 'data formatting' category).
DATA_FORMATTING = {"transpose", "copy", "copy-start", "copy-done", "bitcast", "reshape", "dynamic-reshape"}
#: Communication opcodes (also as async start/update/done pairs), and what tracesql calls each.
COLLECTIVES = {
    "all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
    "all-to-all": "all_to_all", "ragged-all-to-all": "all_to_all", "collective-permute": "collective_permute",
    "collective-broadcast": "broadcast", "send": "send", "recv": "recv", "all-reduce-scatter": "reduce_scatter",
}
ELEMENTWISE = {
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "clz", "complex", "compare", "convert", "cos", "divide",
    "erf", "exp", "expm1", "floor", "imag", "is-finite", "log", "log1p", "logistic", "maximum", "minimum",
    "multiply", "negate", "not", "or", "popcnt", "power", "real", "reduce-precision", "remainder",
    "round-nearest-afz", "round-nearest-even", "rsqrt", "select", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "sign", "sin", "sqrt", "stochastic-convert", "subtract", "tan", "tanh", "xor",
}
#: Elementwise opcodes that compute nothing (their cost is memory traffic only).
NO_FLOPS = {"convert", "reduce-precision", "real", "imag", "complex", "bitcast-convert"}
CONTROL_FLOW = {"while", "conditional", "call", "async-start", "async-update", "async-done"}
#: Custom-call targets whose FLOPs tracesql counts from their dims, and how: 'gemm' (cuBLAS / hipBLASLt, a dot
#: whose dimension numbers the backend config's gemm_backend_config holds), 'attention_forward' /
#: 'attention_backward' (Transformer Engine's JAX fused attention, whose backend config records batch, heads,
#: sequence lengths, head dims and mask).
CUSTOM_CALL_FLOPS = {
    "__cublas$gemm": "gemm", "__cublas$lt$matmul": "gemm", "__cublas$lt$matmul$f8": "gemm",
    "te_fused_attn_forward_ffi": "attention_forward", "te_fused_attn_backward_ffi": "attention_backward",
}
#: Transformer Engine's NVTE_Mask_Type values without padding (whose sequences' real lengths are run-time data):
#: no mask, causal (top left), causal (bottom right); True where causal.
TE_MASK_CAUSAL = {0: False, 2: True, 4: True}
_ASYNC_SUFFIX = re.compile(r"-(start|update|done)$")


@cache
def _enum_names(full_name: str) -> dict[int, str]:
    pool = messages()["HloProto"].DESCRIPTOR.file.pool
    return {v.number: v.name for v in pool.FindEnumTypeByName(full_name).values}


def dtype_name(element_type: int) -> str:
    """'f32', 'bf16', 's32', 'pred', 'tuple' ... as XLA prints them."""
    return _enum_names("xla.PrimitiveType").get(element_type, str(element_type)).lower()


def _dtype_bits(dtype: str) -> int | None:
    if dtype == "pred":
        return 8
    m = re.search(r"(\d+)", dtype)
    return int(m.group(1)) * (2 if dtype.startswith("c") else 1) if m else None


def shape_text(shape) -> str:
    """'f32[256,128]{1,0}', 'bf16[8,1024]{1,0:T(8,128)(2,1)S(1)}', '(f32[4], u32[])' as XLA prints shapes."""
    dtype = dtype_name(shape.element_type)
    if dtype == "tuple":
        return "(" + ", ".join(shape_text(s) for s in shape.tuple_shapes) + ")"
    if dtype in ("token", "opaque_type"):
        return dtype
    text = f"{dtype}[{','.join(map(str, shape.dimensions))}]"
    layout = shape.layout
    if layout.minor_to_major or layout.tiles or layout.memory_space:
        text += "{" + ",".join(map(str, layout.minor_to_major))
        extra = "".join("T(" + ",".join(map(str, t.dimensions)) + ")" for t in layout.tiles)
        if layout.memory_space:
            extra += f"S({layout.memory_space})"
        text += (":" + extra if extra else "") + "}"
    return text


def _leaves(shape):
    if dtype_name(shape.element_type) == "tuple":
        for s in shape.tuple_shapes:
            yield from _leaves(s)
    else:
        yield shape


def shape_bytes(shape) -> int:
    total = 0
    for leaf in _leaves(shape):
        bits = _dtype_bits(dtype_name(leaf.element_type))
        if bits:
            total += math.prod(leaf.dimensions) * bits // 8
    return total


def replica_groups(instruction) -> list[list[int]] | None:
    """The device groups of a collective, from any of the encodings HLO has used (explicit lists, iota lists)."""
    lists = instruction.collective_device_list
    if instruction.replica_groups:
        return [list(g.replica_ids) for g in instruction.replica_groups]
    if lists.replica_groups:
        return [list(g.replica_ids) for g in lists.replica_groups]
    for iota in (lists.iota_replica_group_list, instruction.iota_collective_device_list):
        if iota.num_replica_groups:
            return _iota_groups(iota)
    return None


def _iota_groups(iota) -> list[list[int]]:
    """[G,S]<=[d0,d1,...]T(p...): iota over prod(dims) reshaped to dims, transposed by perm, cut into G groups."""
    dims = list(iota.iota_reshape_dims) or [iota.num_replica_groups * iota.num_devices_per_group]
    perm = list(iota.iota_transpose_perm) or list(range(len(dims)))
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    out_dims, out_strides = [dims[p] for p in perm], [strides[p] for p in perm]
    flat = []
    for index in range(math.prod(dims)):
        position, rest = 0, index
        for size, stride in zip(reversed(out_dims), reversed(out_strides)):
            position += (rest % size) * stride
            rest //= size
        flat.append(position)
    n = iota.num_devices_per_group
    return [flat[i:i + n] for i in range(0, len(flat), n)]


def category(instruction, fused_opcodes: list[str]) -> str:
    """XProf's category of an op (XLA's HloInstruction::ToCategory), with collectives wrapped in a fusion as
    '<collective> fusion'."""
    opcode = instruction.opcode
    if opcode in DATA_FORMATTING:
        return "data formatting"
    if opcode in ELEMENTWISE:
        return "non-fusion elementwise"
    if opcode == "fusion":
        wrapped = next((o for o in fused_opcodes if _collective_opcode(o)), None)
        if wrapped:
            return f"{_ASYNC_SUFFIX.sub('', wrapped)} fusion"
        if "convolution" in fused_opcodes:
            return "convolution fusion"
        kind = {"kLoop": "loop", "kInput": "input", "kOutput": "output", "kCustom": "custom"}
        return f"{kind.get(instruction.fusion_kind, instruction.fusion_kind)} fusion"
    return opcode


def _collective_opcode(opcode: str) -> str | None:
    return COLLECTIVES.get(_ASYNC_SUFFIX.sub("", opcode))


class Module:
    """One HLO module, indexed: instructions by id, computations by id, and which computations run as ops."""

    def __init__(self, module):
        self.module = module
        self.computations = {c.id: c for c in module.computations}
        self.instructions = {i.id: i for c in module.computations for i in c.instructions}
        self.frames = module.stack_frame_index

    def op_computations(self):
        """The entry computation and those it runs through control flow, each once."""
        todo, seen = [self.module.entry_computation_id], set()
        while todo:
            cid = todo.pop()
            if cid in seen or cid not in self.computations:
                continue
            seen.add(cid)
            yield self.computations[cid]
            for i in self.computations[cid].instructions:
                if i.opcode in CONTROL_FLOW or _collective_opcode(i.opcode) and i.opcode.endswith("-start"):
                    todo.extend(i.called_computation_ids)

    def called(self, instruction) -> list:
        """Every instruction of the computations `instruction` calls (fused, applied), recursively, in order."""
        out, todo = [], list(instruction.called_computation_ids)
        seen = set()
        while todo:
            cid = todo.pop(0)
            if cid in seen or cid not in self.computations:
                continue
            seen.add(cid)
            for i in self.computations[cid].instructions:
                out.append(i)
                todo.extend(i.called_computation_ids)
        return out

    def root(self, computation_id: int):
        c = self.computations.get(computation_id)
        return self.instructions.get(c.root_id) if c is not None else None

    def source(self, instruction) -> tuple[str | None, int | None]:
        meta = instruction.metadata
        if meta.source_file:
            return meta.source_file, meta.source_line or None
        frame_id = meta.stack_frame_id
        frames, locations = self.frames.stack_frames, self.frames.file_locations
        if 0 < frame_id <= len(frames):  # ids are 1-based
            location = locations[frames[frame_id - 1].file_location_id - 1]
            return self.frames.file_names[location.file_name_id - 1], location.line or None
        return None, None

    def async_start(self, instruction) -> str | None:
        """The -start op of an asynchronous pair's -done half (copy-done -> copy-start, all-reduce-done ->
        all-reduce-start, send-done -> send, recv-done -> recv, async-done -> its async-start through any
        async-update): the op whose operand chain it ends. None for any other op."""
        if not instruction.opcode.endswith("-done"):
            return None
        op = instruction
        while op is not None and op.operand_ids and (op is instruction or op.opcode == "async-update"):
            op = self.instructions.get(op.operand_ids[0])
        return op.name if op is not None and op is not instruction else None

    def flops(self, instruction) -> float | None:
        """FLOPs of one execution, from the shapes (None when tracesql has no formula for the opcode)."""
        opcode = instruction.opcode
        out = _elements(instruction.shape)
        operands = [self.instructions.get(i) for i in instruction.operand_ids]
        if opcode == "fusion":
            parts = [self.flops(i) for i in self.called(instruction)]
            return float(sum(p for p in parts if p))
        if opcode == "dot" and operands and operands[0] is not None:
            return _dot_flops(out, operands[0].shape.dimensions,
                              instruction.dot_dimension_numbers.lhs_contracting_dimensions)
        if opcode == "custom-call" and instruction.custom_call_target in CUSTOM_CALL_FLOPS:
            return custom_call_flops(instruction, operands)
        if (opcode == "convolution" or instruction.convolution_dimension_numbers.kernel_spatial_dimensions) \
                and len(operands) >= 2 and operands[1] is not None:
            numbers, kernel = instruction.convolution_dimension_numbers, operands[1].shape.dimensions
            return 2.0 * _elements(_first_leaf(instruction.shape)) \
                * math.prod(kernel[d] for d in numbers.kernel_spatial_dimensions) \
                * kernel[numbers.kernel_input_feature_dimension]
        if opcode in ELEMENTWISE:
            return 0.0 if opcode in NO_FLOPS else float(out)
        if opcode in ("reduce", "reduce-window") and operands and operands[0] is not None:
            return float(_elements(operands[0].shape) if opcode == "reduce"
                         else out * math.prod(d.size for d in instruction.window.dimensions))
        if _collective_opcode(opcode) in ("all_reduce", "reduce_scatter"):
            return float(_elements(_first_leaf(instruction.shape)))
        if opcode in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "broadcast", "iota",
                      "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "gather",
                      "reshape", "transpose", "copy", "copy-start", "copy-done", "reverse", "after-all",
                      "partition-id", "replica-id", "infeed", "outfeed", "send", "recv", "send-done",
                      "recv-done", "all-gather", "all-to-all", "collective-permute", "all-gather-start",
                      "all-gather-done", "collective-permute-start", "collective-permute-done", "all-reduce-done",
                      "optimization-barrier", "bitcast-convert", "opt-barrier", "domain", "add-dependency"):
            return 0.0
        return None

    def bytes_accessed(self, instruction) -> float:
        """Operands read once plus the output written once."""
        operands = [self.instructions.get(i) for i in instruction.operand_ids]
        return float(sum(shape_bytes(o.shape) for o in operands if o is not None) + shape_bytes(instruction.shape))


def _dot_flops(out_elements: int, lhs_dims, lhs_contracting) -> float:
    """2 FLOPs per multiply-add: each output element sums over the contracted dims of the left operand."""
    return 2.0 * out_elements * math.prod(lhs_dims[int(d)] for d in lhs_contracting)


def backend_config(instruction) -> dict:
    """A custom call's backend config as a dict: JSON (XLA's GPU configs, Pallas/Mosaic's custom_call_config) or
    an MLIR attribute dictionary (FFI calls: `{attn_heads = 16 : i64, is_training = true, ...}`, values as
    numbers and booleans); {} when it is neither."""
    text = instruction.backend_config.decode("utf-8", "replace").strip()
    if text.startswith('{"'):
        try:
            config = json.loads(text)
        except ValueError:
            return {}
        return config if isinstance(config, dict) else {}
    attributes = {}
    for key, value in re.findall(r"(\w+) = ([^,{}]+?)(?: : \w+)?(?=,|}$)", text):
        value = value.strip()
        attributes[key] = value == "true" if value in ("true", "false") else _number(value)
    return attributes


def custom_call_estimate(instruction) -> tuple[float, float] | None:
    """(flops, bytes_accessed) a Pallas/Mosaic kernel declares (pallas_call(cost_estimate=...)), as XLA keeps it in
    the custom call's backend config ({"custom_call_config": {"cost_estimate": {"flops", "transcendentals",
    "bytes_accessed"}}}) and reports it in its cost analysis: flops as declared (XLA counts transcendentals
    apart); None when the call declares none."""
    if instruction.opcode != "custom-call":
        return None
    config = backend_config(instruction).get("custom_call_config")
    estimate = config.get("cost_estimate") if isinstance(config, dict) else None
    if not isinstance(estimate, dict):
        return None
    flops, bytes_ = _number(estimate.get("flops")), _number(estimate.get("bytes_accessed"))
    return (flops, bytes_) if flops is not None and bytes_ is not None else None


def custom_call_flops(instruction, operands) -> float | None:
    """FLOPs of a custom call whose target CUSTOM_CALL_FLOPS names, from its dims; None for any other target or
    when what the formula needs is not recorded.
    gemm: as a dot (2 per multiply-add) over the first output (the second is cuBLAS's workspace).
    attention: 2·B·Hq·Sq·Skv·(d_qk + d_v) forward, 2·B·Hq·Sq·Skv·(3·d_qk + 2·d_v) backward, as
    functions/30_flops.sql's attention; causal masks count half (an XLA op has one number: the default 'flash'
    convention); padding masks and packed sequences (their real lengths are run-time data) and sliding windows are
    not counted."""
    kind = CUSTOM_CALL_FLOPS.get(instruction.custom_call_target)
    config = backend_config(instruction) if kind else {}
    if kind == "gemm":
        numbers = (config.get("gemm_backend_config") or {}).get("dot_dimension_numbers")
        if not operands or operands[0] is None or not isinstance(numbers, dict):
            return None
        return _dot_flops(_elements(_first_leaf(instruction.shape)), operands[0].shape.dimensions,
                          numbers.get("lhs_contracting_dimensions", []))
    if kind in ("attention_forward", "attention_backward"):
        dims = [config.get(k) for k in ("input_batch", "attn_heads", "q_max_seqlen", "kv_max_seqlen",
                                        "qk_head_dim", "v_head_dim")]
        mask = config.get("mask_type")
        if None in dims or mask not in TE_MASK_CAUSAL or config.get("max_segments_per_seq", 1) != 1 \
                or (config.get("window_size_left"), config.get("window_size_right")) not in ((-1, -1), (-1, 0)):
            return None
        batch, heads, sq, skv, d_qk, d_v = dims
        head_dims = d_qk + d_v if kind == "attention_forward" else 3 * d_qk + 2 * d_v
        return 2.0 * batch * heads * sq * skv * head_dims * (0.5 if TE_MASK_CAUSAL[mask] else 1.0)
    return None


def _message_out(collective) -> int:
    """Output elements of a collective; of an async start, the output part of its (operands, outputs, ...) tuple."""
    shape = collective.shape
    if collective.opcode.endswith("-start") and dtype_name(shape.element_type) == "tuple" and len(shape.tuple_shapes) >= 2:
        shape = shape.tuple_shapes[1]
    return _elements(shape)


def _elements(shape) -> int:
    return sum(math.prod(leaf.dimensions) for leaf in _leaves(shape))


def _first_leaf(shape):
    return next(_leaves(shape), shape)


def op_rows(module, program_id: str, trace_costs: dict | None = None) -> list[dict]:
    """The `xla_ops` rows (without run_id and rank) of one HloModuleProto. `trace_costs`: op name -> the
    per-op stats the profile recorded (XLA's cost analysis: flops, bytes_accessed, hlo_category, long_name)."""
    index = Module(module)
    trace_costs = trace_costs or {}
    rows = []
    for computation in index.op_computations():
        entry = computation.id == module.entry_computation_id
        for instruction in computation.instructions:
            if instruction.opcode in ("parameter", "constant", "tuple", "get-tuple-element") and not entry:
                continue
            called = index.called(instruction)
            fused_opcodes = [i.opcode for i in called] if instruction.opcode == "fusion" else []
            collective = _collective_opcode(instruction.opcode) or next(
                (_collective_opcode(o) for o in fused_opcodes if _collective_opcode(o)), None)
            operands = [index.instructions.get(i) for i in instruction.operand_ids]
            groups = replica_groups(instruction) if _collective_opcode(instruction.opcode) else next(
                (replica_groups(i) for i in called if _collective_opcode(i.opcode)), None)
            message = instruction if _collective_opcode(instruction.opcode) else next(
                (i for i in called if _collective_opcode(i.opcode)), None)
            message_operands = [index.instructions.get(i) for i in message.operand_ids] if message else []
            message_operands = [o for o in message_operands if o is not None]
            channel = instruction.channel_id or next(
                (i.channel_id for i in called if _collective_opcode(i.opcode) and i.channel_id), None)
            root = index.root(instruction.called_computation_ids[0]) \
                if instruction.opcode == "fusion" and instruction.called_computation_ids else None
            traced = trace_costs.get(instruction.name, {})
            file, line = index.source(instruction)
            flops, bytes_ = _number(traced.get("flops")), _number(traced.get("bytes_accessed"))
            from_trace = flops is not None and bytes_ is not None
            estimate = None if from_trace else custom_call_estimate(instruction)
            leaf = None if dtype_name(instruction.shape.element_type) == "tuple" else instruction.shape
            rows.append({
                "program_id": program_id,
                "module": module.name,
                "name": instruction.name,
                "opcode": instruction.opcode,
                "fusion_kind": instruction.fusion_kind or None,
                "category": traced.get("hlo_category") or category(instruction, fused_opcodes),
                "collective": collective,
                "async_start": index.async_start(instruction),
                "computation": None if entry else computation.name,
                "output_shape": shape_text(instruction.shape),
                "output_type": dtype_name(leaf.element_type) if leaf is not None else None,
                "output_dims": list(leaf.dimensions) if leaf is not None else None,
                "operand_shapes": [shape_text(o.shape) if o is not None else None for o in operands],
                "operand_types": [dtype_name(o.shape.element_type) if o is not None else None for o in operands],
                "operand_dims": [list(o.shape.dimensions) if o is not None else None for o in operands],
                "fused_root": root.opcode if root is not None else None,
                "fused_ops": len(called) if instruction.opcode == "fusion" else None,
                "replica_groups": groups,
                "group_size": len(groups[0]) if groups and groups[0] else None,
                "channel_id": channel or None,
                "collective_dtype": dtype_name(_first_leaf(message_operands[0].shape).element_type)
                if message_operands else None,
                "collective_in_elems": sum(_elements(o.shape) for o in message_operands) if message else None,
                "collective_out_elems": _message_out(message) if message else None,
                "flops": flops if from_trace else estimate[0] if estimate else index.flops(instruction),
                "bytes_accessed": bytes_ if from_trace else estimate[1] if estimate
                else index.bytes_accessed(instruction),
                "cost_source": "profile" if from_trace else "cost_estimate" if estimate else "shapes",
                "op_name": instruction.metadata.op_name or None,
                "op_type": instruction.metadata.op_type or None,
                "source_file": file,
                "source_line": line,
                "hlo_text": traced.get("long_name"),
            })
    return rows


def _number(value) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
