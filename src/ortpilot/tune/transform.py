"""Build a candidate's model: its passes applied to the source, through the model cache.

This is the one place the tuner couples to the passes layer. It uses ``ortpilot.passes``
(fusion, quantize) when they are importable and falls back to ORT's own tools
(``onnxruntime.transformers.optimizer``, ``onnxruntime.quantization``) otherwise, so the
search works while the passes layer is still landing. Results are content-addressed in
``artifacts.store``: a candidate id seen before costs a hash check, not a rebuild.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ortpilot.artifacts.store import ModelStore, cache_key
from ortpilot.modelio import file_sha256, load_model, save_model

log = logging.getLogger("ortpilot")
Feeds = Mapping[str, np.ndarray]


class NothingToDo(Exception):
    """A pass left the model unchanged (e.g. fusion found no pattern): the candidate is a duplicate."""


def samples_digest(samples: Sequence[Feeds]) -> str:
    digest = hashlib.sha256()
    for feeds in samples:
        for name in sorted(feeds):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(feeds[name]).tobytes())
    return digest.hexdigest()[:16]


def build_model(source: Path, passes: Sequence[Mapping[str, Any]], calibration: Sequence[Feeds]
                ) -> tuple[Path, list[dict[str, Any]], bool]:
    """Return (model path, pass records, cache hit). The source itself when there are no passes."""
    if not passes:
        return source, [], True
    calibrated = any(p.get("mode") in ("qdq", "static", "full") for p in passes)
    key = cache_key(model_sha256=file_sha256(source), ort_version=ort.__version__, providers=[],
                    level="offline-passes", extra={"passes": list(passes), "tuner": 1,
                                                   "calibration": samples_digest(calibration) if calibrated else None})
    records: list[dict[str, Any]] = []

    def build(out: Path) -> None:
        current = source
        for i, step in enumerate(passes):
            target = out if i == len(passes) - 1 else out.with_name(f"step{i}.onnx")
            start = time.perf_counter()
            info = _apply(step, current, target, calibration)
            records.append({"pass": step.get("pass"), "options": dict(step), "seconds": round(time.perf_counter() - start, 3),
                            **info})
            current = target

    store = ModelStore()
    path, hit = store.get_or_create(key, build, meta={"passes": list(passes)})
    if hit:
        records = store.read_entry(key).get("meta", {}).get("records", [{"pass": p.get("pass"), "options": dict(p)}
                                                                       for p in passes])
    else:
        _remember_records(store, key, records)
    return path, records, hit


def _remember_records(store: ModelStore, key: str, records: list[dict[str, Any]]) -> None:
    from ortpilot.artifacts.atomic import atomic_write_json

    entry = store.read_entry(key)
    entry.setdefault("meta", {})["records"] = records
    atomic_write_json(store.entry_dir(key) / "entry.json", entry)


def _apply(step: Mapping[str, Any], src: Path, dst: Path, calibration: Sequence[Feeds]) -> dict[str, Any]:
    kind = step.get("pass")
    if kind == "fusion":
        return _fusion(src, dst, str(step.get("model_type", "bert")))
    if kind == "quantize":
        return _quantize(src, dst, step, calibration)
    raise ValueError(f"unknown pass {kind!r}")


def _fusion(src: Path, dst: Path, model_type: str) -> dict[str, Any]:
    from onnxruntime.transformers import optimizer

    optimized = optimizer.optimize_model(str(src), model_type=model_type, num_heads=0, hidden_size=0, opt_level=0)
    fused = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
    if not fused:
        raise NothingToDo(f"transformer fusion ({model_type}) found no pattern to fuse")
    model = optimized.model
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))  # fused ops live there
    save_model(model, dst)
    return {"fused": fused}


# Weight-carrying ops only: activations x activations products (attention scores) stay float,
# which is what keeps a sentence embedding's direction through INT8.
_WEIGHT_OPS = ["MatMul", "Gemm", "Conv"]


def _quantize(src: Path, dst: Path, step: Mapping[str, Any], calibration: Sequence[Feeds]) -> dict[str, Any]:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    mode = step.get("mode", "dynamic")
    per_channel = bool(step.get("per_channel", False))
    if mode == "dynamic":
        weights_only = bool(step.get("weights_only", False))
        quantize_dynamic(str(src), str(dst), per_channel=per_channel, weight_type=QuantType.QInt8,
                         op_types_to_quantize=_WEIGHT_OPS if weights_only else None,
                         extra_options={"MatMulConstBOnly": weights_only,
                                        # fused contrib ops defeat ONNX shape inference; they are float
                                        "DefaultTensorType": onnx.TensorProto.FLOAT})
    else:
        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self._it = iter([dict(f) for f in calibration])

            def get_next(self):  # noqa: ANN201 - ORT's interface
                return next(self._it, None)

        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=None if mode == "full" else _WEIGHT_OPS,
                        extra_options={"ActivationSymmetric": False, "DefaultTensorType": onnx.TensorProto.FLOAT})
    model = load_model(dst)
    save_model(model, dst)  # lowers the IR version for the running ORT, atomically
    return {"quantized_nodes": sum(1 for n in model.graph.node if n.op_type in _INT_OPS)}


_INT_OPS = {"MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "QLinearMatMul", "QLinearConv", "QGemm",
            "QAttention", "DequantizeLinear", "MatMulIntegerToFloat"}


def detect_transformer(model: onnx.ModelProto) -> str | None:
    """The ``onnxruntime.transformers`` model type worth trying, from the graph's op pattern."""
    ops = {n.op_type for n in model.graph.node}
    if "Softmax" in ops and "MatMul" in ops and ({"LayerNormalization", "ReduceMean", "SimplifiedLayerNormalization",
                                                  "SkipLayerNormalization"} & ops):
        return "bert"
    return None
