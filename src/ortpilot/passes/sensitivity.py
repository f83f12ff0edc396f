"""Which layers dynamic INT8 hurts most, from the layers' own activations and ORT's own INT8 kernels.

Dynamic quantization rounds each weighted node's input activation to uint8 (one scale per
tensor, computed at run time) and its weight to int8 (per channel or per tensor), then runs an
integer GEMM. Its error at a node is therefore a function of that node's real activations and
of the kernel this CPU runs, not of the weights alone: a layer fed by GELU outputs with a few
large outliers loses far more than its weight statistics suggest, and on x86 without VNNI the
u8 x s8 kernel (``vpmaddubsw``) clips int16 pair sums, an error no float model of rounding sees.

So nothing is modelled. The float model runs once on the *calibration* samples inside a probe
graph that adds, per weighted node, the product ORT's dynamic quantizer would emit, computed by
ORT's own integer kernels: ``DynamicQuantizeLinear`` of the real activation, then
``MatMulInteger`` (``ConvInteger`` for Conv) with the weight quantized by ORT's own
``quantize_data`` exactly as ``quantize_dynamic`` stores it (symmetric int8 or asymmetric uint8,
per column or per tensor, 7-bit with ``reduce_range``), scaled back to float. The noise-to-signal
power of each product against the float one ranks the nodes. Whatever MLAS does on this CPU
(VNNI, AMX, AVX2's saturation, Arm dot products) is in the numbers because MLAS computed them.
Embedding tables (``Gather``), which the quantizer stores as uint8 and reads without a GEMM, are
ranked by the rows actually read. How this was checked: ``tests/passes/test_passes_sensitivity.py``
asserts that the top-ranked layer is the one whose exclusion cuts the quantized model's error
most; it passes natively on an AVX-512 VNNI CPU and under ``qemu-x86_64 -cpu Haswell`` (AVX2,
where ORT's u8s8 kernel saturates: the same test failed with the earlier float replay).

Cosine distance grows with noise power, so leaving nodes in float whose summed noise is a
fraction f of the total cuts the error by about 1 / (1 - f): :func:`nodes_to_exclude` picks the
smallest such set for a wanted reduction. ``quantize --auto-exclude`` (``passes.debug``) and the
tuner's follow-up candidates both rank with :func:`rank_dynamic`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortpilot.eps import CPU_EP
from ortpilot.passes.base import SourceModel

# Ops whose dynamic-INT8 error the probe measures (ORT's dynamic quantizer also knows LSTM,
# EmbedLayerNormalization and Transpose; those are not ranked; it leaves Gemm in float).
RANKED_OPS = ("MatMul", "Attention", "Conv", "Gather")
_PRODUCTS = ("MatMul", "Attention")
_PER_CHANNEL = ("MatMul", "Attention")  # ConvInteger weights are per tensor even with per_channel


def dynamic_op_types() -> list[str]:
    """The op types ``quantize_dynamic`` quantizes when it is given none (ORT's IntegerOps registry)."""
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    return sorted(IntegerOpsRegistry)


def _weighted_nodes(model: onnx.ModelProto, op_types: Sequence[str]) -> list[tuple[onnx.NodeProto, str, np.ndarray]]:
    """(node, name of its weight initializer, the weight)."""
    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type not in op_types or node.op_type not in RANKED_OPS or len(node.input) < 2:
            continue
        weight = node.input[0] if node.op_type == "Gather" else node.input[1]
        if weight not in inits:
            continue  # an activation x activation product: dynamic mode leaves it float anyway
        w = numpy_helper.to_array(inits[weight])
        if w.dtype != np.float32:
            continue  # DynamicQuantizeLinear takes float32 only; other dtypes stay float
        if (node.op_type in _PRODUCTS and w.ndim != 2) or (node.op_type == "Conv" and w.ndim < 3):
            continue
        out.append((node, weight, w))
    return out


def _as_quantizer_sees_it(model: onnx.ModelProto) -> onnx.ModelProto:
    from ortpilot.passes.quantize import constants_to_initializers, prepare

    if any(not n.name for n in model.graph.node if n.op_type in RANKED_OPS):
        return prepare(model)[0]  # names unnamed nodes exactly as the quantize pass will
    work = onnx.ModelProto()
    work.CopyFrom(model)
    constants_to_initializers(work)
    return work


def _quantized_weight(
    w: np.ndarray, op_type: str, *, per_channel: bool, reduce_range: bool, weight_type: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(integer weight, zero point, scale) as ``quantize_dynamic`` stores ``w``, from ORT's own ``quantize_data``.

    Symmetric for int8, asymmetric for uint8 (the quantizer's ``is_weight_symmetric``); per
    output column (the last axis) for MatMul and Attention with ``per_channel``, per tensor for
    ConvInteger; Gather tables as asymmetric uint8 activations, never reduced.
    """
    from onnxruntime.quantization.quant_utils import quantize_data

    if op_type == "Gather":
        zero, scale, q = quantize_data(w.ravel(), onnx.TensorProto.UINT8, False)
        return np.asarray(q).reshape(w.shape), np.asarray(zero), np.asarray(scale, np.float32)
    qtype = onnx.TensorProto.INT8 if weight_type == "qint8" else onnx.TensorProto.UINT8
    symmetric = qtype == onnx.TensorProto.INT8
    if per_channel and op_type in _PER_CHANNEL:
        zeros, scales, columns = [], [], []
        for i in range(w.shape[-1]):
            zero, scale, q = quantize_data(w[..., i].ravel(), qtype, symmetric, reduce_range=reduce_range)
            zeros.append(np.asarray(zero).reshape(()))
            scales.append(np.asarray(scale, np.float32).reshape(()))
            columns.append(np.asarray(q).reshape(w[..., i].shape))
        return np.stack(columns, axis=-1), np.stack(zeros), np.stack(scales)
    zero, scale, q = quantize_data(w.ravel(), qtype, symmetric, reduce_range=reduce_range)
    return np.asarray(q).reshape(w.shape), np.asarray(zero), np.asarray(scale, np.float32)


def _quantized_twin(node: onnx.NodeProto, weight: str, p: str, outputs: Sequence[str]) -> list[onnx.NodeProto]:
    """The nodes ``quantize_dynamic`` emits for ``node``, writing ``outputs`` (``p``-prefixed temporaries).

    The activation goes through ``DynamicQuantizeLinear``; the integer weight ``{p}wq`` (zero
    point ``{p}wz``, scale ``{p}ws``) through ``MatMulInteger``, ``ConvInteger`` (bias added in
    float) or ``QAttention`` (the quantizer's own op for a fused Attention); a Gather reads its
    table through ``DequantizeLinear``. ORT's integer kernels compute the products.
    """
    if node.op_type == "Gather":
        axis = {a.name: a.i for a in node.attribute}.get("axis", 0)
        return [
            helper.make_node("DequantizeLinear", [p + "wq", p + "ws", p + "wz"], [p + "table"]),
            helper.make_node("Gather", [p + "table", node.input[1]], [outputs[0]], axis=axis),
        ]
    quantize = helper.make_node("DynamicQuantizeLinear", [node.input[0]], [p + "q", p + "s", p + "z"])
    if node.op_type == "Attention":
        inputs = [
            p + "q",
            p + "wq",
            node.input[2],
            p + "s",
            p + "ws",
            node.input[3] if len(node.input) > 3 else "",
            p + "z",
            p + "wz",
            node.input[4] if len(node.input) > 4 else "",
        ]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return [quantize, helper.make_node("QAttention", inputs, list(outputs), domain="com.microsoft", **attrs)]
    if node.op_type == "Conv":
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        product = helper.make_node("ConvInteger", [p + "q", p + "wq", p + "z", p + "wz"], [p + "int"], **attrs)
    else:
        product = helper.make_node("MatMulInteger", [p + "q", p + "wq", p + "z", p + "wz"], [p + "int"])
    has_bias = node.op_type == "Conv" and len(node.input) > 2 and bool(node.input[2])
    scaled = p + "got" if has_bias else outputs[0]
    nodes = [
        quantize,
        product,
        helper.make_node("Cast", [p + "int"], [p + "intf"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", [p + "s", p + "ws"], [p + "scale"]),
        helper.make_node("Mul", [p + "intf", p + "scale"], [scaled]),
    ]
    if has_bias:  # Conv's bias, [C] broadcast over [N, C, spatial...]
        nodes += [
            helper.make_node("Unsqueeze", [node.input[2], p + "axes"], [p + "bias"]),
            helper.make_node("Add", [scaled, p + "bias"], [outputs[0]]),
        ]
    return nodes


def _switched(node: onnx.NodeProto, weight: str, p: str) -> onnx.NodeProto:
    """``node`` as an ``If`` on the boolean input ``{p}on``: its quantized twin when true, itself when false.

    One probe session then measures every layer's effect on the model's outputs alone: each run
    switches one layer to ORT's integer kernels and leaves the rest in float.
    """

    def branch(name: str, nodes: list[onnx.NodeProto], outs: list[str]) -> onnx.GraphProto:
        return helper.make_graph(
            nodes, name, [], [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outs]
        )

    real = [o for o in node.output if o]
    then_outs = [f"{p}then{i}" for i in range(len(real))]
    else_outs = [f"{p}else{i}" for i in range(len(real))]
    original = onnx.NodeProto()
    original.CopyFrom(node)
    del original.output[:]
    original.output.extend(else_outs)
    original.name = p + "float"
    return helper.make_node(
        "If",
        [p + "on"],
        real,
        name=node.name + "_ortpilot_probe",
        then_branch=branch(p + "quantized", _quantized_twin(node, weight, p, then_outs), then_outs),
        else_branch=branch(p + "original", [original], else_outs),
    )


def rank_dynamic(
    model: onnx.ModelProto | str | Path,
    calibration: Sequence[Mapping[str, np.ndarray]],
    *,
    op_types: Sequence[str] = RANKED_OPS,
    per_channel: bool = True,
    reduce_range: bool = False,
    weight_type: str = "qint8",
    max_samples: int = 4,
) -> list[dict[str, Any]]:
    """Weighted nodes with the noise-to-signal power dynamic INT8 adds at each, worst first.

    Each entry: ``node``, ``op_type``, ``tensor`` (the rounded activation, or a Gather's table),
    ``nsr`` and ``sqnr_db``. The products are computed by ORT itself: a probe graph adds, per
    weighted node, the integer product ``quantize_dynamic`` would emit for it (see the module
    docstring), and the summed squares of its difference to the float product, and of the float
    product, as outputs. Only op types the dynamic quantizer quantizes are ranked.
    Node names are those ``QuantizePass`` excludes by (Constant-held weights become initializers
    first; a graph with unnamed weighted nodes goes through the pass's own preparation, which
    names them).
    """
    proto = model if isinstance(model, onnx.ModelProto) else SourceModel.of(model).proto
    proto = _as_quantizer_sees_it(proto)
    quantized_ops = set(dynamic_op_types())
    targets = _weighted_nodes(proto, [op for op in op_types if op in quantized_ops])
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not targets or not calibration or opset < 11:
        return []
    # proto is a private copy already (_as_quantizer_sees_it): the probe nodes go straight into it
    switches = _add_probes(proto, targets, per_channel=per_channel, reduce_range=reduce_range, weight_type=weight_type)
    removed = _noise_removed(proto, switches, list(calibration)[:max_samples])
    return _ranking(targets, removed)


def _add_probes(
    probe: onnx.ModelProto,
    targets: Sequence[tuple[onnx.NodeProto, str, np.ndarray]],
    *,
    per_channel: bool,
    reduce_range: bool,
    weight_type: str,
) -> dict[str, str]:
    """Turn ``probe`` into the probe graph: each target node ``_switched`` on its own
    boolean input, its quantized weight added as initializers. Returns node name -> its switch input."""
    graph = probe.graph
    switches: dict[str, str] = {}
    by_node = {id(node): i for i, (node, _, _) in enumerate(targets)}
    rewritten = []
    for node in graph.node:
        i = by_node.get(id(node))
        if i is None:
            rewritten.append(node)
            continue
        _, weight, w = targets[i]
        p = f"_ortpilot_probe{i}_"
        q, zero, scale = _quantized_weight(
            w, node.op_type, per_channel=per_channel, reduce_range=reduce_range, weight_type=weight_type
        )
        graph.initializer.extend(
            [
                numpy_helper.from_array(q, p + "wq"),
                numpy_helper.from_array(zero, p + "wz"),
                numpy_helper.from_array(scale, p + "ws"),
                numpy_helper.from_array(np.arange(1, w.ndim - 1, dtype=np.int64), p + "axes"),
            ]
        )
        graph.input.append(helper.make_tensor_value_info(p + "on", onnx.TensorProto.BOOL, []))
        rewritten.append(_switched(node, weight, p))
        switches[node.name] = p + "on"
    del graph.node[:]
    graph.node.extend(rewritten)
    if not any(o.domain == "com.microsoft" for o in probe.opset_import):
        probe.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return switches


def _noise_removed(
    probe: onnx.ModelProto, switches: Mapping[str, str], samples: Sequence[Mapping[str, np.ndarray]]
) -> dict[str, float]:
    """Node name -> the noise power switching it back to float removes from the all-quantized outputs,
    summed over ``samples``: one probe session, every layer quantized, then each one in float in turn."""
    import onnxruntime as ort

    float_outputs = [o.name for o in probe.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), options, providers=[CPU_EP])
    on = {switch: np.array(True) for switch in switches.values()}
    off = {switch: np.array(False) for switch in switches.values()}
    removed = dict.fromkeys(switches, 0.0)
    for feeds in samples:
        reference = sess.run(float_outputs, {**feeds, **off})
        quantized = sess.run(float_outputs, {**feeds, **on})
        everything = sum(_nsr(r, q) for r, q in zip(reference, quantized))
        for name, switch in switches.items():
            got = sess.run(float_outputs, {**feeds, **on, switch: np.array(False)})
            removed[name] += max(0.0, everything - sum(_nsr(r, g) for r, g in zip(reference, got)))
    return removed


def _ranking(
    targets: Sequence[tuple[onnx.NodeProto, str, np.ndarray]], removed: Mapping[str, float]
) -> list[dict[str, Any]]:
    """``rank_dynamic``'s entries, worst (most noise) first."""
    ranked = []
    for node, _, _ in targets:
        nsr = removed[node.name]
        ranked.append(
            {
                "node": node.name,
                "op_type": node.op_type,
                "tensor": node.input[0],
                "nsr": nsr,
                "sqnr_db": round(10 * math.log10(1 / nsr), 2) if nsr > 0 else math.inf,
            }
        )
    ranked.sort(key=lambda r: -r["nsr"])
    return ranked


def _nsr(reference: np.ndarray, got: np.ndarray) -> float:
    """Noise-to-signal power of ``got`` against ``reference`` (0 for an all-zero reference)."""
    ref, out = np.asarray(reference, np.float64), np.asarray(got, np.float64)
    signal = float(np.sum(ref * ref))
    return float(np.sum((ref - out) ** 2)) / signal if signal > 0 else 0.0


def nodes_to_exclude(
    ranking: Sequence[Mapping[str, Any]], reduction: float, *, already: Sequence[str] = (), max_share: float = 0.5
) -> list[str]:
    """The fewest nodes (worst first) whose removal cuts the summed noise by ``reduction``x.

    Returns [] when even ``max_share`` of the ranked nodes would not do (the variant is hopeless).
    """
    left = [r for r in ranking if r["node"] not in set(already)]
    total = sum(r["nsr"] for r in left)
    if total <= 0 or reduction <= 1:
        return []
    chosen: list[str] = []
    removed = 0.0
    for r in left[: max(1, int(len(ranking) * max_share)) - len(already)]:
        chosen.append(r["node"])
        removed += r["nsr"]
        if total / max(total - removed, 1e-30) >= reduction:
            return chosen
    return []


__all__ = ["RANKED_OPS", "dynamic_op_types", "nodes_to_exclude", "rank_dynamic"]
