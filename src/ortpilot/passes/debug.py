"""Where quantization error comes from: each layer's share, for naming the worst and leaving them in float.

For QDQ models, ``onnxruntime.quantization.qdq_loss_debug`` saves every activation of the
float and the quantized model and matches them by name; the SQNR of each quantized
activation against its float twin says how much error has piled up there. A layer's own
contribution is the SQNR its output loses relative to its worst input (dB dropped here),
which ranks the layer that breaks the model above the layers that merely inherit its error.
Static QOperator models are ranked through a QDQ twin built with the same settings (same node
names). Dynamic models have no quantized activations to match: ``passes.sensitivity`` replays
each weighted node's product on the calibration activations with both operands rounded as ORT
rounds them, which finds the layers fed by outliers that weight statistics alone miss.
The loop that leaves them in float until a gate passes is ``gate.exclude`` (these rankings:
``gate.rankings``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ortpilot.artifacts.scratch import scratch_dir
from ortpilot.passes.base import SourceModel
from ortpilot.passes.openvino_int8 import OpenVINOInt8Pass
from ortpilot.passes.quantize import NothingQuantizedError, QuantizePass, full_op_types
from ortpilot.passes.sensitivity import dynamic_op_types, rank_dynamic
from ortpilot.session.ortlog import capture_ort_output

SQNR_CAP_DB = 100.0


@dataclass
class LayerError:
    """One node's share of the quantization error."""

    node: str
    op_type: str
    tensor: str
    sqnr_db: float  # SQNR of this tensor (activation) or of this node's rounded product (dynamic)
    drop_db: float  # SQNR lost at this node; a dynamic node's inputs are float, so CAP - its SQNR
    kind: str  # "activation" (QDQ activation matching) or "dynamic" (product replayed on real inputs)
    exclude: list[str] = field(default_factory=list)  # nodes to leave in float to remove this error
    noise_share: float | None = None  # dynamic: this node's share of the noise all ranked nodes add

    def describe(self) -> str:
        if self.kind == "dynamic":
            share = f", {self.noise_share:.0%} of the added noise" if self.noise_share is not None else ""
            return (
                f"{self.node} ({self.op_type}): dynamic INT8 output SQNR {self.sqnr_db:.1f} dB on the calibration "
                f"activations{share}"
            )
        return (
            f"{self.node} ({self.op_type}): output SQNR {self.sqnr_db:.1f} dB, {self.drop_db:.1f} dB lost at this node"
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(float(v), 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _sqnr(ref: Sequence[np.ndarray], test: Sequence[np.ndarray]) -> float:
    a = np.concatenate([np.asarray(x, np.float64).ravel() for x in ref])
    b = np.concatenate([np.asarray(x, np.float64).ravel() for x in test])
    noise = float(np.sum((a - b) ** 2))
    signal = float(np.sum(a**2))
    if not math.isfinite(noise):
        return -SQNR_CAP_DB
    if noise == 0:
        return SQNR_CAP_DB
    if signal == 0:
        return -SQNR_CAP_DB
    return float(np.clip(10 * math.log10(signal / noise), -SQNR_CAP_DB, SQNR_CAP_DB))


def activation_errors(
    float_model: onnx.ModelProto,
    qdq_model: onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
    op_types: Sequence[str] | None = None,
) -> list[LayerError]:
    """Per-node SQNR drop of a QDQ model against its float model, worst first."""
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        create_activation_matching,
        modify_model_output_intermediate_tensors,
    )

    from ortpilot.passes.calibration import reader_for

    with scratch_dir("ortpilot-debug-") as tmp, capture_ort_output():
        paths = {}
        for tag, model in (("float", float_model), ("qdq", qdq_model)):
            plain, augmented = Path(tmp) / f"{tag}.onnx", Path(tmp) / f"{tag}.aug.onnx"
            onnx.save(model, str(plain))
            modify_model_output_intermediate_tensors(str(plain), str(augmented))
            paths[tag] = str(augmented)
        float_acts = collect_activations(paths["float"], reader_for(samples))
        qdq_acts = collect_activations(paths["qdq"], reader_for(samples))
    matched = create_activation_matching(qdq_acts, float_acts)
    sqnr = {
        name: _sqnr(m["float"], m["post_qdq"]) for name, m in matched.items() if m.get("float") and m.get("post_qdq")
    }
    # Error a tensor inherits when it is not itself matched: the worst of its producer's inputs.
    inherited: dict[str, float] = dict(sqnr)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in float_model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    errors = []
    for node in float_model.graph.node:
        ins = [inherited.get(i, SQNR_CAP_DB) for i in node.input if i]
        in_sqnr = min(ins) if ins else SQNR_CAP_DB
        for out in node.output:
            inherited.setdefault(out, in_sqnr)
        outs = [o for o in node.output if o in sqnr]
        if not outs:
            continue
        tensor = min(outs, key=lambda o: sqnr[o])
        # Leaving this error out means leaving the node and the quantized consumers of its output in float.
        exclude = [node.name] + [c.name for c in consumers.get(tensor, []) if not op_types or c.op_type in op_types]
        errors.append(
            LayerError(
                node.name,
                node.op_type,
                tensor,
                sqnr[tensor],
                max(0.0, in_sqnr - sqnr[tensor]),
                "activation",
                list(dict.fromkeys(exclude)),
            )
        )
    errors.sort(key=lambda e: (-e.drop_db, e.sqnr_db))
    return errors


def dynamic_errors(
    float_model: onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
    *,
    op_types: Sequence[str] | None = None,
    per_channel: bool = False,
    reduce_range: bool = False,
    weight_type: str = "qint8",
) -> list[LayerError]:
    """``passes.sensitivity.rank_dynamic`` as LayerErrors, worst first (``op_types``: ORT's dynamic defaults)."""
    ranking = rank_dynamic(
        float_model,
        samples,
        op_types=op_types or dynamic_op_types(),
        per_channel=per_channel,
        reduce_range=reduce_range,
        weight_type=weight_type,
    )
    total = sum(r["nsr"] for r in ranking)
    errors = []
    for r in ranking:
        sqnr = float(np.clip(r["sqnr_db"], -SQNR_CAP_DB, SQNR_CAP_DB))
        errors.append(
            LayerError(
                r["node"],
                r["op_type"],
                r["tensor"],
                sqnr,
                max(0.0, SQNR_CAP_DB - sqnr),
                "dynamic",
                [r["node"]],
                r["nsr"] / total if total > 0 else None,
            )
        )
    return errors


def layer_errors(
    step: QuantizePass | OpenVINOInt8Pass,
    source: SourceModel,
    quantized: onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
) -> list[LayerError]:
    """Every ranked layer's share of the error in ``quantized`` (made by ``step`` from ``source``), worst
    first, excluded layers included. ``samples`` should be calibration samples, not the gate's held-out ones."""
    prepared, _ = step.prepared(source)
    settings = step.noise_settings()
    if settings is not None:
        return dynamic_errors(prepared, samples, op_types=step.op_types, **settings)
    qdq = quantized
    if not step.config.qdq:  # QOperator ops hide their activations: rank through a QDQ twin
        try:
            qdq = step.qdq_twin().run(source).model
        except NothingQuantizedError:
            return []
    return activation_errors(prepared, qdq, samples, step.op_types_for_mode() or full_op_types())


__all__ = ["LayerError", "activation_errors", "dynamic_errors", "layer_errors"]
