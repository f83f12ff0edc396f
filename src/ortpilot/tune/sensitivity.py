"""Which layers dynamic INT8 hurts most, from the layers' own activations.

Dynamic quantization rounds each weighted node's input activation to uint8 (one scale per
tensor, computed at run time) and its weight to int8 (per channel or per tensor). Its error at
a node is therefore a function of that node's real activations, not of its weights alone: a
layer fed by GELU outputs with a few large outliers (a transformer's second FFN projection)
loses far more than its weight statistics suggest. This module runs the float model once on
the *calibration* samples, replays each weighted node's product in numpy with both operands
rounded as ORT rounds them, and ranks the nodes by the noise-to-signal power they add.

Cosine distance grows with noise power, so leaving nodes in float whose summed noise is a
fraction f of the total cuts the error by about 1 / (1 - f): :func:`nodes_to_exclude` picks the
smallest such set for a wanted reduction.
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

RANKED_OPS = ("MatMul", "Gemm", "Attention")


def _weighted_nodes(model: onnx.ModelProto, op_types: Sequence[str]) -> list[tuple[onnx.NodeProto, np.ndarray]]:
    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type not in op_types or node.op_type not in RANKED_OPS or len(node.input) < 2:
            continue
        if node.input[1] not in inits:
            continue  # an activation x activation product: dynamic mode leaves it float anyway
        w = numpy_helper.to_array(inits[node.input[1]])
        if w.dtype.kind != "f" or w.ndim != 2:
            continue
        if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
            w = w.T
        out.append((node, w.astype(np.float32)))
    return out


def _as_quantizer_sees_it(model: onnx.ModelProto) -> onnx.ModelProto:
    from ortpilot.passes.quantize import constants_to_initializers, prepare

    if any(not n.name for n in model.graph.node if n.op_type in RANKED_OPS):
        return prepare(model)[0]  # names unnamed nodes exactly as the quantize pass will
    work = onnx.ModelProto()
    work.CopyFrom(model)
    constants_to_initializers(work)
    return work


def _dynamic_uint8(a: np.ndarray) -> np.ndarray:
    """DynamicQuantizeLinear then dequantize: asymmetric uint8, one scale per tensor."""
    lo, hi = min(0.0, float(a.min())), max(0.0, float(a.max()))
    scale = (hi - lo) / 255.0 or 1.0
    zero = float(np.clip(np.round(-lo / scale), 0, 255))
    return (np.clip(np.round(a / scale) + zero, 0, 255) - zero) * scale


def _int8_weight(w: np.ndarray, per_channel: bool) -> np.ndarray:
    scale = (np.abs(w).max(axis=0, keepdims=True) if per_channel else np.abs(w).max()) / 127.0
    scale = np.where(scale == 0, 1.0, scale)
    return np.clip(np.round(w / scale), -127, 127) * scale


def rank_dynamic(model: onnx.ModelProto | str | Path, calibration: Sequence[Mapping[str, np.ndarray]], *,
                 op_types: Sequence[str] = RANKED_OPS, per_channel: bool = True, max_samples: int = 4
                 ) -> list[dict[str, Any]]:
    """Weighted nodes with the noise-to-signal power dynamic INT8 adds at each, worst first.

    The products are computed by ORT itself: a probe graph adds, per weighted node, its input
    through ``DynamicQuantizeLinear``/``DequantizeLinear`` times the int8-rounded weight, and the
    summed squares of the difference and of the float product as outputs. Node names are those
    ``QuantizePass`` excludes by (Constant-held weights become initializers first; a graph with
    unnamed weighted nodes goes through the pass's own preparation, which names them).
    """
    import onnxruntime as ort

    proto = model if isinstance(model, onnx.ModelProto) else SourceModel.of(model).proto
    proto = _as_quantizer_sees_it(proto)
    targets = _weighted_nodes(proto, op_types)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not targets or not calibration or opset < 11:
        return []
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    graph = probe.graph
    outputs: list[tuple[str, str, str]] = []
    for i, (node, w) in enumerate(targets):
        p = f"_ortpilot_probe{i}_"
        graph.initializer.extend([numpy_helper.from_array(w, p + "w"),
                                  numpy_helper.from_array(_int8_weight(w, per_channel).astype(np.float32), p + "wq")])
        graph.node.extend([
            helper.make_node("DynamicQuantizeLinear", [node.input[0]], [p + "q", p + "s", p + "z"]),
            helper.make_node("DequantizeLinear", [p + "q", p + "s", p + "z"], [p + "aq"]),
            helper.make_node("MatMul", [node.input[0], p + "w"], [p + "ref"]),
            helper.make_node("MatMul", [p + "aq", p + "wq"], [p + "got"]),
            helper.make_node("Sub", [p + "ref", p + "got"], [p + "diff"]),
            helper.make_node("ReduceSumSquare", [p + "diff"], [p + "noise"], keepdims=0),
            helper.make_node("ReduceSumSquare", [p + "ref"], [p + "signal"], keepdims=0),
        ])
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
    for (name, n, s), (node, _) in zip(outputs, targets):
        nsr = totals[n] / totals[s] if totals[s] > 0 else 0.0
        ranked.append({"node": name, "op_type": node.op_type, "nsr": nsr,
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
