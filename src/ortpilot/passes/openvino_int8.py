"""INT8 for the OpenVINO EP: a QDQ model placed the way OpenVINO's own quantizer places it.

OpenVINO runs a QDQ model as INT8 only where the QuantizeLinear/DequantizeLinear pairs sit where its
kernels expect them: on the activations and weights of MatMul/Gemm/Conv, with softmax and layer norms
left in float. A QDQ model from ORT's ``quantize_static`` over every op it supports loses the answers
there (measured on MiniLM: cosine -0.09), and the same QDQ model on ORT's CPU EP runs slower than
float (0.46x). NNCF's ONNX backend (``nncf.quantize``, the transformer preset for attention graphs)
writes the placement OpenVINO's team tunes for, so this pass calls it, with the calibration samples
every calibrated pass gets, and leaves ``exclude`` nodes in float through NNCF's ignored scope.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import onnx

from ortpilot.errors import UsageError
from ortpilot.passes.base import Outcome, Pass, Setting, SourceModel, quantized_node_count
from ortpilot.passes.options import WEIGHT_OPS, OpenVINOInt8Options
from ortpilot.passes.quantize import constants_to_initializers, name_nodes
from ortpilot.quantmodes import OPENVINO_INT8

EXTRA = "openvino-plugin"


def nncf_module() -> Any:
    """NNCF, or a ``UsageError`` naming the extra that installs it."""
    try:
        import nncf
    except ImportError:
        raise UsageError(
            "INT8 for OpenVINO needs NNCF, which is not installed: pip install 'ortpilot[openvino-plugin]' "
            "(or pip install nncf)."
        ) from None
    nncf.set_log_level(logging.ERROR)
    return nncf


def is_transformer(model: onnx.ModelProto) -> bool:
    """Attention graphs (Softmax beside MatMul) get NNCF's transformer preset."""
    ops = {n.op_type for n in model.graph.node}
    return "Softmax" in ops and "MatMul" in ops


class OpenVINOInt8Pass(Pass):
    """``nncf.quantize`` on the ONNX model: a QDQ model for the OpenVINO EP (``int8-openvino``)."""

    name = "openvino-int8"
    calibrated = True
    mode = OPENVINO_INT8  # ``ortpilot quantize --mode openvino``; the gated flow ranks layers by dynamic INT8 noise

    def __init__(
        self,
        options: OpenVINOInt8Options | None = None,
        *,
        calibration: Sequence[Mapping[str, np.ndarray]] | None = None,
        **settings: Any,
    ) -> None:
        """``options`` (None: the defaults) and ``settings``, its fields or changes to it (``model_type``,
        ``nodes_to_exclude``, ``fast_bias_correction``, ``smooth_quant``, ``activation_ranges``)."""
        self.config = replace(options or OpenVINOInt8Options(), **settings)
        self.calibration = list(calibration or [])

    @classmethod
    def from_options(
        cls, options: OpenVINOInt8Options, *, calibration: Sequence[Mapping[str, Any]] = (), prepared: bool = False
    ) -> OpenVINOInt8Pass:
        """A tune step: its ``OpenVINOInt8Options`` and the calibration samples."""
        return cls(options, calibration=list(calibration))

    model_type = Setting()
    nodes_to_exclude = Setting()
    fast_bias_correction = Setting()
    smooth_quant = Setting()
    activation_ranges = Setting()

    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {
            "model_type": self.model_type,
            "calibration_samples": len(self.calibration),
            "fast_bias_correction": self.fast_bias_correction,
            "smooth_quant": self.smooth_quant,
            "activation_ranges": self.activation_ranges,
        }
        if self.nodes_to_exclude:
            opts["nodes_to_exclude"] = list(self.nodes_to_exclude)
        return opts

    # The weighted ops NNCF quantizes (its graph has no fused Attention): the ones its layer ranking covers.
    op_types = tuple(op for op in WEIGHT_OPS if op != "Attention")

    def noise_settings(self) -> dict[str, Any]:
        """The weight settings its layers are ranked with by the noise dynamic INT8 adds at each
        (``passes.sensitivity``): per-channel signed 8-bit weights, as NNCF's transformer preset writes them.
        A proxy (NNCF's activations are static): on MiniLM both put the feed-forward projections first."""
        return {"per_channel": True, "reduce_range": False, "weight_type": "qint8"}

    def with_excluded(self, nodes: Sequence[str]) -> OpenVINOInt8Pass:
        """The same pass, leaving ``nodes`` in float too (NNCF's ignored scope): the auto-exclude loop's step."""
        return OpenVINOInt8Pass(self.config.excluding(nodes), calibration=self.calibration)

    def label(self) -> str:
        return (
            "int8-openvino" + self.recipe_label() + (f"-x{len(self.nodes_to_exclude)}" if self.nodes_to_exclude else "")
        )

    def recipe_label(self) -> str:
        """What differs from NNCF's own recipe, as labels say it (``-sq0.8-minmax``)."""
        smooth = "" if self.smooth_quant is None else f"-sq{self.smooth_quant:g}"
        return smooth + ("" if self.activation_ranges == "nncf" else f"-{self.activation_ranges}")

    def advanced_parameters(self, nncf: Any) -> dict[str, Any]:
        """``nncf.quantize``'s ``advanced_parameters`` for this recipe ({} for NNCF's own)."""
        from nncf.quantization.range_estimator import RangeEstimatorParametersSet

        advanced: dict[str, Any] = {}
        if self.smooth_quant is not None:
            advanced["smooth_quant_alphas"] = nncf.AdvancedSmoothQuantParameters(matmul=self.smooth_quant)
        if self.activation_ranges == "minmax":
            advanced["activations_range_estimator_params"] = RangeEstimatorParametersSet.MINMAX
        return {"advanced_parameters": nncf.AdvancedQuantizationParameters(**advanced)} if advanced else {}

    def prepared(self, source: SourceModel) -> tuple[onnx.ModelProto, list[str]]:
        """The model NNCF quantizes (Constant weights as initializers, every node named: its ignored scope and
        the layer ranking name the same nodes), and what changed."""
        model = onnx.ModelProto()
        model.CopyFrom(source.proto)
        notes = []
        if constants_to_initializers(model):
            notes.append("Constant weights turned into initializers")
        if name_nodes(model):
            notes.append("unnamed nodes named")
        return model, notes

    def transform(self, source: SourceModel) -> Outcome:
        if not self.calibration:
            raise UsageError("INT8 for OpenVINO is calibrated: it needs calibration samples (--calibration ...).")
        nncf = nncf_module()
        model, notes = self.prepared(source)
        transformer = self.model_type == "transformer" or (self.model_type == "auto" and is_transformer(model))
        kwargs: dict[str, Any] = {
            "subset_size": len(self.calibration),
            "fast_bias_correction": self.fast_bias_correction,
        }
        if transformer:
            kwargs.update(model_type=nncf.ModelType.TRANSFORMER, preset=nncf.QuantizationPreset.MIXED)
        kwargs.update(self.advanced_parameters(nncf))
        if self.nodes_to_exclude:
            kwargs["ignored_scope"] = nncf.IgnoredScope(names=list(self.nodes_to_exclude), validate=False)
        try:
            # NNCF draws its progress bars on stdout, where --json prints its one document: they go to stderr.
            with contextlib.redirect_stdout(sys.stderr):
                quantized = nncf.quantize(model, nncf.Dataset(list(self.calibration)), **kwargs)
        except Exception as exc:
            raise UsageError(
                f"NNCF could not quantize this model for OpenVINO ({type(exc).__name__} in nncf.quantize: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no message'})."
            ) from None
        count = quantized_node_count(quantized)
        notes.append(
            f"{count} node(s) quantized by NNCF {nncf.__version__} "
            f"({'transformer preset, mixed' if transformer else 'default preset'}"
            f"{self._recipe_note(transformer)})"
        )
        return Outcome(
            quantized,
            notes=notes,
            level=None,
            providers=None,
            ep_specific=False,
            extra={"nodes_excluded": list(self.nodes_to_exclude), "nncf": nncf.__version__},
        )

    def _recipe_note(self, transformer: bool) -> str:
        parts = []
        if self.smooth_quant is not None:
            parts.append(
                f"SmoothQuant alpha {self.smooth_quant:g}" if transformer else "no SmoothQuant: not a transformer"
            )
        if self.activation_ranges == "minmax":
            parts.append("activation ranges from the calibration's min and max")
        return "".join(f"; {p}" for p in parts)


__all__ = ["EXTRA", "OpenVINOInt8Pass", "is_transformer", "nncf_module"]
