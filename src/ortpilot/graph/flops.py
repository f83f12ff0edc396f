"""Estimated FLOPs per node, from shapes inferred for concrete input dims.

Why an estimate: placement reports the share of *work* (not only of nodes) each EP got, and
bench reports achieved GFLOP/s. Counting follows the usual convention (fvcore, thop,
ONNX-tool): a multiply-add is 2 FLOPs, so MatMul/Gemm/Conv/attention count 2*MACs;
elementwise ops count ``ELEMENTWISE_COST`` FLOPs per output element; data-movement ops count
0. Nodes whose op type is not in these tables, or whose shapes could not be inferred, are left
out of the result rather than guessed. Only top-level nodes are counted (If/Loop/Scan bodies
run a data-dependent number of times).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping

import onnx

from ortpilot.graph.check import malformed_einsums
from ortpilot.graph.shapes import graph_inputs, resolve_input_shapes

log = logging.getLogger("ortpilot")

Shape = tuple[int, ...]
Shapes = Mapping[str, Shape]

# Initializers above this many elements lose their data in the copy used for shape
# inference (they become typed graph inputs); small ones keep it because Reshape/Expand/
# Slice read their values.
_KEEP_DATA_ELEMENTS = 4096

# FLOPs per output element. 1 for plain elementwise math; a few more for ops that do several
# passes over each element (softmax: max, subtract, exp, sum, divide; normalizations: mean,
# variance, normalize, scale, shift). These constants are conventions, not measurements.
ELEMENTWISE_COST: dict[str, float] = {
    **dict.fromkeys(
        [
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "Sqrt",
            "Reciprocal",
            "Neg",
            "Abs",
            "Exp",
            "Log",
            "Relu",
            "LeakyRelu",
            "PRelu",
            "Sigmoid",
            "HardSigmoid",
            "HardSwish",
            "Tanh",
            "Erf",
            "Clip",
            "Max",
            "Min",
            "Mean",
            "Sum",
            "Where",
            "Equal",
            "Less",
            "LessOrEqual",
            "Greater",
            "GreaterOrEqual",
            "And",
            "Or",
            "Xor",
            "Not",
            "Sign",
            "Floor",
            "Ceil",
            "Round",
            "Mod",
            "Elu",
            "Selu",
            "Celu",
            "Softplus",
            "Softsign",
            "Sin",
            "Cos",
            "Tan",
            "Atan",
            "IsNaN",
            "IsInf",
            "BitShift",
            "ThresholdedRelu",
            "QuantizeLinear",
            "DequantizeLinear",
            "DynamicQuantizeLinear",
            "QLinearAdd",
            "QLinearMul",
            "QLinearSigmoid",
            "QLinearLeakyRelu",
            "BiasAdd",
            "Swish",
            "Mish",
        ],
        1.0,
    ),
    **dict.fromkeys(["Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Shrink"], 2.0),
    **dict.fromkeys(["BatchNormalization"], 2.0),
    **dict.fromkeys(["RotaryEmbedding"], 3.0),
    **dict.fromkeys(["Softmax", "LogSoftmax", "BiasSoftmax", "QLinearSoftmax"], 5.0),
    **dict.fromkeys(
        [
            "LayerNormalization",
            "SimplifiedLayerNormalization",
            "SkipLayerNormalization",
            "SkipSimplifiedLayerNormalization",
            "RMSNormalization",
            "InstanceNormalization",
            "GroupNormalization",
            "GroupNorm",
            "SkipGroupNorm",
            "EmbedLayerNormalization",
            "LpNormalization",
            "MeanVarianceNormalization",
        ],
        5.0,
    ),
}

# Ops that move or reshape data, or compute shapes: no arithmetic.
ZERO_COST = frozenset(
    [
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Concat",
        "Split",
        "Slice",
        "Gather",
        "GatherElements",
        "GatherND",
        "Scatter",
        "ScatterElements",
        "ScatterND",
        "Shape",
        "Size",
        "Cast",
        "CastLike",
        "Identity",
        "Constant",
        "ConstantOfShape",
        "Expand",
        "Tile",
        "Pad",
        "Range",
        "Dropout",
        "DepthToSpace",
        "SpaceToDepth",
        "NonZero",
        "OneHot",
        "Trilu",
        "EyeLike",
        "Compress",
        "ReverseSequence",
        "Resize",
        "Upsample",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
        "SequenceAt",
        "SequenceConstruct",
        "SequenceInsert",
        "SplitToSequence",
        "ConcatFromSequence",
        "TopK",
        "ArgMax",
        "ArgMin",
        "MemcpyFromHost",
        "MemcpyToHost",
    ]
)

_REDUCE = frozenset(
    [
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "GlobalLpPool",
        "CumSum",
    ]
)


class _Ctx:
    """Shapes known for one node's inputs and outputs, with its attributes."""

    def __init__(self, node: onnx.NodeProto, shapes: Mapping[str, tuple[int | None, ...]]) -> None:
        self.node = node
        self.shapes = shapes
        self.attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    def inp(self, index: int) -> Shape | None:
        return self._known(self.node.input[index] if index < len(self.node.input) else "")

    def out(self, index: int = 0) -> Shape | None:
        return self._known(self.node.output[index] if index < len(self.node.output) else "")

    def _known(self, name: str) -> Shape | None:
        if not name or name not in self.shapes:
            return None
        dims = self.shapes[name]
        if any(d is None or d < 0 for d in dims):
            return None
        return tuple(int(d) for d in dims)  # type: ignore[arg-type]


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _matmul(a_index: int = 0, trans_attr: str = "") -> Callable[[_Ctx], float | None]:
    """2 * output elements * K, with K the contracted dim of input ``a_index``."""

    def count(ctx: _Ctx) -> float | None:
        a, out = ctx.inp(a_index), ctx.out()
        if a is None or out is None or not a:
            return None
        k = a[-2] if (trans_attr and ctx.attrs.get(trans_attr) and len(a) >= 2) else a[-1]
        return 2.0 * _numel(out) * k

    return count


def _gemm(ctx: _Ctx) -> float | None:
    a, out = ctx.inp(0), ctx.out()
    if a is None or out is None or len(a) != 2:
        return None
    k = a[0] if ctx.attrs.get("transA") else a[1]
    bias = _numel(out) if len(ctx.node.input) > 2 and ctx.node.input[2] else 0
    return 2.0 * _numel(out) * k + bias


def _matmul_nbits(ctx: _Ctx) -> float | None:
    a = ctx.inp(0)
    n, k = ctx.attrs.get("N"), ctx.attrs.get("K")
    if a is None or not n or not k:
        return None
    return 2.0 * _numel(a[:-1]) * int(n) * int(k)


def _conv(weight_index: int) -> Callable[[_Ctx], float | None]:
    """Each output element is a dot product of (C/group) * prod(kernel) terms, whatever the layout."""

    def count(ctx: _Ctx) -> float | None:
        w, out = ctx.inp(weight_index), ctx.out()
        if w is None or out is None or len(w) < 2:
            return None
        bias_index = {1: 2, 3: 8}.get(weight_index, 2)
        bias = _numel(out) if len(ctx.node.input) > bias_index and ctx.node.input[bias_index] else 0
        return 2.0 * _numel(out) * _numel(w[1:]) + bias

    return count


def _conv_transpose(ctx: _Ctx) -> float | None:
    """Each input element is scattered through (M/group) * prod(kernel) multiply-adds."""
    x, w = ctx.inp(0), ctx.inp(1)
    if x is None or w is None or len(w) < 2:
        return None
    return 2.0 * _numel(x) * _numel(w[1:])


def _pool(ctx: _Ctx) -> float | None:
    out, kernel = ctx.out(), ctx.attrs.get("kernel_shape")
    if out is None or not kernel:
        return None
    return float(_numel(out) * math.prod(kernel))


def _reduce(ctx: _Ctx) -> float | None:
    x = ctx.inp(0)
    return None if x is None else float(_numel(x))


def _attention_core(batch: int, heads: int, q_len: int, kv_len: int, head_size: int, v_head_size: int) -> float:
    """Q @ K^T and softmax(.) @ V: 2*B*N*S*T*(d + d_v) FLOPs, plus softmax on the scores."""
    scores = batch * heads * q_len * kv_len
    return 2.0 * scores * (head_size + v_head_size) + ELEMENTWISE_COST["Softmax"] * scores


def _attention_contrib(ctx: _Ctx) -> float | None:
    """com.microsoft Attention: input [B,S,H_in] @ weights [H_in, Hq+Hk+Hv], then attention."""
    x, w = ctx.inp(0), ctx.inp(1)
    heads = int(ctx.attrs.get("num_heads", 0) or 0)
    if x is None or w is None or len(x) != 3 or not heads:
        return None
    b, s, _ = x
    sizes = ctx.attrs.get("qkv_hidden_sizes") or [w[1] // 3] * 3
    past = ctx.inp(4)  # [2, B, N, P, d]
    p = past[3] if past is not None and len(past) == 5 else 0
    proj = 2.0 * b * s * w[0] * w[1]
    return proj + _attention_core(b, heads, s, s + p, sizes[0] // heads, sizes[2] // heads)


def _mha(ctx: _Ctx) -> float | None:
    """com.microsoft MultiHeadAttention: query [B,S,Hq], key [B,L,Hk] or [B,N,L,d], optional past."""
    q = ctx.inp(0)
    heads = int(ctx.attrs.get("num_heads", 0) or 0)
    if q is None or not heads:
        return None
    if len(q) == 5:  # packed QKV [B, S, N, 3, d]
        b, s, _, _, d = q
        return _attention_core(b, heads, s, s, d, d)
    if len(q) != 3:
        return None
    b, s, hq = q
    d = hq // heads
    k = ctx.inp(1)
    if k is None:
        kv_len = s
    else:
        kv_len = k[2] if len(k) == 4 else k[1]
    past = ctx.inp(6)  # past_key [B, N, P, d]
    if past is not None and len(past) == 4:
        kv_len += past[2]
    return _attention_core(b, heads, s, kv_len, d, d)


def _gqa(ctx: _Ctx) -> float | None:
    """com.microsoft GroupQueryAttention: query [B,S,Hq] (or packed QKV), past_key [B,N_kv,P,d].

    The total length is a run-time value (``seqlens_k``); past length plus new tokens is used,
    an upper bound when past and present share one preallocated buffer.
    """
    q = ctx.inp(0)
    heads = int(ctx.attrs.get("num_heads", 0) or 0)
    kv_heads = int(ctx.attrs.get("kv_num_heads", 0) or 0)
    if q is None or len(q) != 3 or not heads:
        return None
    b, s, hidden = q
    packed = len(ctx.node.input) < 2 or not ctx.node.input[1]
    d = hidden // (heads + 2 * kv_heads) if packed else hidden // heads
    past, present = ctx.inp(3), ctx.out(1)
    if past is not None and len(past) == 4:
        total = past[2] + s
    elif present is not None and len(present) == 4:
        total = present[2]
    else:
        total = s
    return _attention_core(b, heads, s, total, d, d)


def _onnx_attention(ctx: _Ctx) -> float | None:
    """ONNX Attention (opset 23): Q [B,Nq,S,d] or [B,S,Nq*d] with q_num_heads; K/V likewise."""
    q, k, v = ctx.inp(0), ctx.inp(1), ctx.inp(2)
    if q is None or k is None or v is None:
        return None
    if len(q) == 4:
        b, heads, s, d = q
        kv_len, dv = k[2], v[3]
    elif len(q) == 3:
        heads = int(ctx.attrs.get("q_num_heads", 0) or 0)
        kv_heads = int(ctx.attrs.get("kv_num_heads", 0) or 0)
        if not heads or not kv_heads:
            return None
        b, s, hidden = q
        d, kv_len, dv = hidden // heads, k[1], v[2] // kv_heads
    else:
        return None
    past = ctx.inp(4)
    if past is not None and len(past) == 4:
        kv_len += past[2]
    return _attention_core(b, heads, s, kv_len, d, dv)


def _einsum(ctx: _Ctx) -> float | None:
    """2 * product of every index size (a contraction's MACs); elementwise count without one."""
    raw = ctx.attrs.get("equation", b"")
    eq = (raw.decode() if isinstance(raw, bytes) else str(raw)).replace(" ", "")
    if "..." in eq or "->" not in eq:
        return None
    lhs, rhs = eq.split("->")
    sizes: dict[str, int] = {}
    for index, term in enumerate(lhs.split(",")):
        shape = ctx.inp(index)
        if shape is None or len(shape) != len(term):
            return None
        sizes.update(zip(term, shape))
    contracted = set(sizes) - set(rhs)
    work = math.prod(sizes.values())
    return 2.0 * work if contracted else float(work)


COUNTERS: dict[str, Callable[[_Ctx], float | None]] = {
    "MatMul": _matmul(),
    "MatMulInteger": _matmul(),
    "MatMulIntegerToFloat": _matmul(),
    "DynamicQuantizeMatMul": _matmul(),
    "QLinearMatMul": _matmul(),
    "MatMulFpQ4": _matmul(),
    "FusedMatMul": _matmul(trans_attr="transA"),
    "Gemm": _gemm,
    "QGemm": _gemm,
    "MatMulNBits": _matmul_nbits,
    "Conv": _conv(1),
    "FusedConv": _conv(1),
    "NhwcConv": _conv(1),
    "NhwcFusedConv": _conv(1),
    "ConvInteger": _conv(1),
    "QLinearConv": _conv(3),
    "ConvTranspose": _conv_transpose,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "LpPool": _pool,
    "Attention": _attention_contrib,
    "QAttention": _attention_contrib,
    "MultiHeadAttention": _mha,
    "GroupQueryAttention": _gqa,
    "Einsum": _einsum,
    **dict.fromkeys(_REDUCE, _reduce),
}


def _count(node: onnx.NodeProto, shapes: Mapping[str, tuple[int | None, ...]]) -> float | None:
    op = node.op_type
    if op in ZERO_COST:
        return 0.0
    ctx = _Ctx(node, shapes)
    if op == "Attention" and node.domain in ("", "ai.onnx"):
        return _onnx_attention(ctx)
    if op in COUNTERS:
        return COUNTERS[op](ctx)
    if op in ELEMENTWISE_COST:
        out = ctx.out()
        return None if out is None else ELEMENTWISE_COST[op] * _numel(out)
    return None


def node_key(node: onnx.NodeProto, index: int) -> str:
    """The name a node is reported under: its own, or ``<op_type>_<index>`` when it has none."""
    return node.name or f"{node.op_type}_{index}"


def node_flops(model: onnx.ModelProto, shapes: Shapes | None = None) -> dict[str, float]:
    """Estimated FLOPs of every top-level node whose op and shapes are known.

    ``shapes`` fixes inputs (``{"x": (1, 64)}``) or symbolic dims (``{"batch": (4,)}``) as in
    ``resolve_input_shapes``; other symbolic dims take its defaults. When defaults cannot be
    found the estimate uses what shape inference can still tell (often: nothing).
    """
    inferred = infer_value_shapes(model, shapes)
    out: dict[str, float] = {}
    for index, node in enumerate(model.graph.node):
        try:
            value = _count(node, inferred)
        except (ValueError, TypeError, IndexError, ZeroDivisionError, KeyError) as exc:
            log.debug("FLOPs of %s (%s) skipped: %s", node.name, node.op_type, exc)
            value = None
        if value is not None:
            out[node_key(node, index)] = float(value)
    return out


def total_flops(model: onnx.ModelProto, shapes: Shapes | None = None) -> float:
    """Sum of ``node_flops``: the estimated FLOPs of one inference."""
    return float(sum(node_flops(model, shapes).values()))


def infer_value_shapes(model: onnx.ModelProto, shapes: Shapes | None = None) -> dict[str, tuple[int | None, ...]]:
    """Shape of every value shape inference can find, with inputs fixed to concrete dims.

    onnx's inference (fast, C++) runs first; when it leaves values unknown (contrib ops it does
    not know, shapes computed at run time through Shape/Gather/Range), ORT's symbolic shape
    inference (``onnxruntime.tools``, slower, pure Python) fills in what it can.
    """
    concrete = _concrete_inputs(model, shapes)
    skeleton = _skeleton(model, concrete)
    malformed = malformed_einsums(model)
    if malformed:  # onnx's Einsum inference can loop forever on these: infer nothing
        log.debug("shape inference skipped: %s", "; ".join(malformed))
        return _collect(skeleton)
    try:
        known = _collect(onnx.shape_inference.infer_shapes(skeleton, strict_mode=False, data_prop=True))
    except Exception as exc:  # onnx raises several error types for models it cannot follow
        log.debug("onnx shape inference failed: %s", exc)
        known = _collect(skeleton)
    if _all_known(model, known) or not _inputs_concrete(model, concrete):
        return known  # symbolic inference costs seconds on big graphs and cannot invent missing dims
    deeper = _ort_symbolic_inference(skeleton)
    if deeper is not None:
        merged = {**known, **{k: v for k, v in deeper.items() if None not in v}}
        if _count_known(model, merged) > _count_known(model, known):
            return merged
    return known


def _inputs_concrete(model: onnx.ModelProto, concrete: Mapping[str, Shape]) -> bool:
    return all(info.name in concrete or not info.symbolic for info in graph_inputs(model))


def _count_known(model: onnx.ModelProto, shapes: Mapping[str, tuple[int | None, ...]]) -> int:
    return sum(
        1
        for node in model.graph.node
        for name in node.output
        if name in shapes and all(d is not None for d in shapes[name])
    )


def _all_known(model: onnx.ModelProto, shapes: Mapping[str, tuple[int | None, ...]]) -> bool:
    return _count_known(model, shapes) == sum(1 for node in model.graph.node for name in node.output if name)


def _concrete_inputs(model: onnx.ModelProto, shapes: Shapes | None) -> dict[str, Shape]:
    inputs = graph_inputs(model)
    try:
        resolved, _ = resolve_input_shapes(inputs, shapes)
        return resolved
    except Exception as exc:  # no sensible default for some dim: keep what the caller fixed
        log.debug("FLOPs: input shapes not fully known (%s)", exc)
        names = {i.name for i in inputs}
        return {k: tuple(v) for k, v in (shapes or {}).items() if k in names}


def _skeleton(model: onnx.ModelProto, concrete: Mapping[str, Shape]) -> onnx.ModelProto:
    """A copy that shape inference can chew on cheaply: no big weights, fixed inputs, no stale value_info."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)
    graph.output.extend(model.graph.output)
    init_names = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        copy = graph.input.add()
        copy.CopyFrom(vi)
        if vi.name in concrete and vi.type.HasField("tensor_type"):
            dims = concrete[vi.name]
            shape = copy.type.tensor_type.shape
            shape.Clear()
            for d in dims:
                shape.dim.add().dim_value = int(d)
    for tensor in model.graph.initializer:
        if math.prod(tensor.dims) <= _KEEP_DATA_ELEMENTS and tensor.data_location != onnx.TensorProto.EXTERNAL:
            graph.initializer.add().CopyFrom(tensor)
        else:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    for sparse in model.graph.sparse_initializer:
        graph.sparse_initializer.add().CopyFrom(sparse)
    return light


def _ort_symbolic_inference(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]] | None:
    """Shapes from ORT's symbolic shape inference, partial results included.

    Its public ``infer_shapes`` saves ``sym_shape_infer_temp.onnx`` plus external data files
    into the working directory whenever inference is incomplete, and then raises; driving the
    same steps here keeps the partial result and writes nothing.
    """
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except Exception:  # ORT missing or without its tools: onnx inference still runs
        return None
    inference = SymbolicShapeInference(2**31 - 1, True, False, 0)  # int_max, auto_merge, guess_rank, verbose
    try:
        inference._preprocess(model)
        while inference.run_:
            inference._infer_impl()
    except Exception as exc:  # unknown ops and ORT tool bugs: keep what was inferred so far
        log.debug("ORT symbolic shape inference stopped: %s", exc)
    known = getattr(inference, "known_vi_", None)
    if not known:
        return None
    return _shapes_of(known.values())


def _collect(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    out = _shapes_of([*model.graph.input, *model.graph.value_info, *model.graph.output])
    for tensor in model.graph.initializer:
        out[tensor.name] = tuple(int(d) for d in tensor.dims)
    return out


def _shapes_of(values) -> dict[str, tuple[int | None, ...]]:
    out: dict[str, tuple[int | None, ...]] = {}
    for vi in values:
        ttype = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not ttype.HasField("shape"):
            continue
        out[vi.name] = tuple(int(d.dim_value) if d.HasField("dim_value") else None for d in ttype.shape.dim)
    return out


def flops_by_op_type(model: onnx.ModelProto, shapes: Shapes | None = None) -> dict[str, float]:
    """Estimated FLOPs summed per op type (for ``inspect``)."""
    per_node = node_flops(model, shapes)
    out: dict[str, float] = {}
    for index, node in enumerate(model.graph.node):
        key = node_key(node, index)
        if key in per_node:
            out[node.op_type] = out.get(node.op_type, 0.0) + per_node[key]
    return out


__all__ = [
    "ELEMENTWISE_COST",
    "ZERO_COST",
    "flops_by_op_type",
    "infer_value_shapes",
    "node_flops",
    "node_key",
    "total_flops",
]
