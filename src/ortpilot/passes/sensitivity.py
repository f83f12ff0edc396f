"""Which layers dynamic INT8 hurts most, from the layers' own activations.

Dynamic quantization rounds each weighted node's input activation to uint8 (one scale per
tensor, computed at run time) and its weight to int8 (per channel or per tensor). Its error at
a node is therefore a function of that node's real activations, not of its weights alone: a
layer fed by GELU outputs with a few large outliers (a transformer's second FFN projection)
loses far more than its weight statistics suggest. This module runs the float model once on
the *calibration* samples, replays each weighted node's product with both operands rounded as
ORT rounds them, and ranks the nodes by the noise-to-signal power they add. Embedding tables
(``Gather``), whose rows the quantizer stores as uint8, are ranked by the rows actually read.

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

from ortpilot.passes.base import SourceModel

# Ops whose dynamic-INT8 error the probe can replay (ORT's dynamic quantizer also knows LSTM,
# EmbedLayerNormalization and Transpose; those are not ranked).
RANKED_OPS = ("MatMul", "Gemm", "Attention", "Conv", "Gather")
_PRODUCTS = ("MatMul", "Gemm", "Attention")
_PER_CHANNEL = ("MatMul", "Attention")  # ConvInteger weights are per tensor even with per_channel


def dynamic_op_types() -> list[str]:
    """The op types ``quantize_dynamic`` quantizes when it is given none (ORT's IntegerOps registry)."""
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    return sorted(IntegerOpsRegistry)


def _weighted_nodes(model: onnx.ModelProto, op_types: Sequence[str]
                    ) -> list[tuple[onnx.NodeProto, str | None, np.ndarray]]:
    """(node, name of its weight initializer or None when transposed here, weight as the product uses it)."""
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
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        name: str | None = weight
        if node.op_type in _PRODUCTS:
            if w.ndim != 2 or attrs.get("transA"):
                continue
            if attrs.get("transB"):
                w, name = w.T, None
        elif node.op_type == "Conv" and w.ndim < 3:
            continue
        out.append((node, name, w))
    return out


def _as_quantizer_sees_it(model: onnx.ModelProto) -> onnx.ModelProto:
    from ortpilot.passes.quantize import constants_to_initializers, prepare

    if any(not n.name for n in model.graph.node if n.op_type in RANKED_OPS):
        return prepare(model)[0]  # names unnamed nodes exactly as the quantize pass will
    work = onnx.ModelProto()
    work.CopyFrom(model)
    constants_to_initializers(work)
    return work


def _uint8(a: np.ndarray) -> np.ndarray:
    """Asymmetric uint8 round trip, one scale per tensor (how dynamic mode stores Gather tables)."""
    lo, hi = min(0.0, float(a.min())), max(0.0, float(a.max()))
    scale = (hi - lo) / 255.0 or 1.0
    zero = float(np.clip(np.round(-lo / scale), 0, 255))
    return (np.clip(np.round(a / scale) + zero, 0, 255) - zero) * scale


def _round_weight(w: np.ndarray, op_type: str, *, per_channel: bool, reduce_range: bool, weight_type: str
                  ) -> np.ndarray:
    """The weight as the dynamic quantizer stores it: int8 symmetric (or uint8 asymmetric), per
    output channel (the last axis of a MatMul weight) or per tensor, 7-bit with ``reduce_range``."""
    if op_type == "Gather":
        return _uint8(w)
    axes = tuple(range(w.ndim - 1)) if per_channel and op_type in _PER_CHANNEL else None
    hi, lo = np.max(w, axis=axes, keepdims=True), np.min(w, axis=axes, keepdims=True)
    if weight_type == "quint8":
        levels = 127.0 if reduce_range else 255.0
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
        scale = np.where(hi > lo, (hi - lo) / levels, 1.0)
        zero = np.round(-lo / scale)
        return (np.clip(np.round(w / scale) + zero, 0, levels) - zero) * scale
    qmax = 64.0 if reduce_range else 127.0
    scale = np.maximum(np.abs(hi), np.abs(lo)) / qmax
    scale = np.where(scale == 0, 1.0, scale)
    return np.clip(np.round(w / scale), -qmax, qmax) * scale


def _probe_nodes(node: onnx.NodeProto, weight: str, p: str) -> list[onnx.NodeProto]:
    """Float and rounded twins of ``node``'s product (``p``-prefixed names), and their summed squares."""
    if node.op_type == "Gather":
        axis = {a.name: a.i for a in node.attribute}.get("axis", 0)
        pair = [helper.make_node("Gather", [weight, node.input[1]], [p + "ref"], axis=axis),
                helper.make_node("Gather", [p + "wq", node.input[1]], [p + "got"], axis=axis)]
    else:
        quantize = [helper.make_node("DynamicQuantizeLinear", [node.input[0]], [p + "q", p + "s", p + "z"]),
                    helper.make_node("DequantizeLinear", [p + "q", p + "s", p + "z"], [p + "aq"])]
        if node.op_type == "Conv":  # the product without the bias, which ConvInteger adds in float
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            pair = [helper.make_node("Conv", [node.input[0], weight], [p + "ref"], **attrs),
                    helper.make_node("Conv", [p + "aq", p + "wq"], [p + "got"], **attrs)]
        else:
            pair = [helper.make_node("MatMul", [node.input[0], weight], [p + "ref"]),
                    helper.make_node("MatMul", [p + "aq", p + "wq"], [p + "got"])]
        pair = quantize + pair
    return pair + [helper.make_node("Sub", [p + "ref", p + "got"], [p + "diff"]),
                   helper.make_node("ReduceSumSquare", [p + "diff"], [p + "noise"], keepdims=0),
                   helper.make_node("ReduceSumSquare", [p + "ref"], [p + "signal"], keepdims=0)]


def rank_dynamic(model: onnx.ModelProto | str | Path, calibration: Sequence[Mapping[str, np.ndarray]], *,
                 op_types: Sequence[str] = RANKED_OPS, per_channel: bool = True, reduce_range: bool = False,
                 weight_type: str = "qint8", max_samples: int = 4) -> list[dict[str, Any]]:
    """Weighted nodes with the noise-to-signal power dynamic INT8 adds at each, worst first.

    Each entry: ``node``, ``op_type``, ``tensor`` (the rounded activation, or a Gather's table),
    ``nsr`` and ``sqnr_db``. The products are computed by ORT itself: a probe graph adds, per
    weighted node, its input through ``DynamicQuantizeLinear``/``DequantizeLinear`` times the
    rounded weight, and the summed squares of the difference and of the float product as outputs.
    Node names are those ``QuantizePass`` excludes by (Constant-held weights become initializers
    first; a graph with unnamed weighted nodes goes through the pass's own preparation, which
    names them).
    """
    import onnxruntime as ort

    proto = model if isinstance(model, onnx.ModelProto) else SourceModel.of(model).proto
    proto = _as_quantizer_sees_it(proto)
    targets = _weighted_nodes(proto, op_types)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not targets or not calibration or opset < 11:
        return []
    probe = proto  # a private copy already: the probe nodes go straight into it
    graph = probe.graph
    outputs: list[tuple[str, str, str]] = []
    for i, (node, weight, w) in enumerate(targets):
        p = f"_ortpilot_probe{i}_"
        rounded = _round_weight(w, node.op_type, per_channel=per_channel, reduce_range=reduce_range,
                                weight_type=weight_type)
        graph.initializer.append(numpy_helper.from_array(rounded.astype(np.float32), p + "wq"))
        if weight is None:  # a transposed Gemm weight: the float product needs its own copy
            weight = p + "w"
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w), weight))
        graph.node.extend(_probe_nodes(node, weight, p))
        graph.output.extend([helper.make_tensor_value_info(p + "noise", onnx.TensorProto.FLOAT, []),
                             helper.make_tensor_value_info(p + "signal", onnx.TensorProto.FLOAT, [])])
        outputs.append((node.name, p + "noise", p + "signal"))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = [name for _, n, s in outputs for name in (n, s)]
    totals = dict.fromkeys(wanted, 0.0)
    for feeds in list(calibration)[:max_samples]:
        for name, value in zip(wanted, sess.run(wanted, dict(feeds))):
            totals[name] += float(value)
    ranked = []
    for (name, n, s), (node, _, _) in zip(outputs, targets):
        nsr = totals[n] / totals[s] if totals[s] > 0 else 0.0
        ranked.append({"node": name, "op_type": node.op_type,
                       "tensor": node.input[0], "nsr": nsr,
                       "sqnr_db": round(10 * math.log10(1 / nsr), 2) if nsr > 0 else math.inf})
    ranked.sort(key=lambda r: -r["nsr"])
    return ranked


def nodes_to_exclude(ranking: Sequence[Mapping[str, Any]], reduction: float, *, already: Sequence[str] = (),
                     max_share: float = 0.5) -> list[str]:
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
