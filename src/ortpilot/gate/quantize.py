"""The INT8 modes of ``ortpilot quantize`` in the one gated-quantization flow (``gate.flow``).

Calibration data is split into calibration and held-out samples; the quantized model is
compared with its source on the held-out ones (``OutputGate``); a model that fails ``max_error``
is not written (AccuracyGateError, exit 1) and the worst layers are named, or, with
``auto_exclude``, left in float try by try until it passes (``gate.exclude.auto_exclude`` with
``Rounds``). Layers are ranked on the calibration samples (``gate.rankings``), not on the
held-out samples that decide the gate. Weight-only modes (decoders) are gated on generation:
``decode.gate.quantize_weight_only_gated``; ``ortpilot.api.quantize_gated`` takes every mode.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ortpilot.errors import UsageError
from ortpilot.gate.core import ModelGate
from ortpilot.gate.exclude import ExcludeResult, Ranking, Rounds, finite
from ortpilot.gate.flow import QuantizeReport, quantize_and_gate
from ortpilot.gate.options import GateOptions, gate_keywords
from ortpilot.gate.outputs import SampleProbe
from ortpilot.gate.rankings import int8_ranking
from ortpilot.gate.result import GateResult, gate_failure
from ortpilot.graph.feeds import generate_samples, plan_feeds, refuse_all_empty
from ortpilot.graph.prune import prune_to_outputs
from ortpilot.measure.metrics import folder_near
from ortpilot.passes.base import ModelLike, PassResult, SourceModel
from ortpilot.passes.calibration import CalibrationSet, load_calibration
from ortpilot.passes.options import OpenVINOInt8Options, QuantizeOptions, quantize_options
from ortpilot.passes.quantize import NothingQuantizedError, QuantizePass

log = logging.getLogger("ortpilot")
# ``full`` leaves no float islands: it is always gated, by this much unless told otherwise.
DEFAULT_FULL_MAX_ERROR = 0.05
Int8Options = QuantizeOptions | OpenVINOInt8Options  # the records of the INT8 modes (ORT's, NNCF's)


def _gate_doc(result: GateResult) -> dict[str, Any]:
    """``quantize --json``'s ``gate``: the worst output, the full comparison, the worst layers."""
    return {
        "passed": result.passed,
        "max_error": result.limit,
        "error": finite(result.error),
        "worst_output": result.worst_output,
        "metric": result.metric,
        "metrics": {name: choice.to_dict() for name, choice in result.choices.items()},
        "samples": result.samples,
        "warning": result.warning or None,
        "comparison": result.comparison.to_dict() if result.comparison is not None else None,
        "worst_layers": [w.to_dict() if hasattr(w, "to_dict") else w for w in result.worst_layers],
    }


@dataclass
class QuantizeStep:
    """``QuantizePass`` on one source, as the auto-exclude loop builds it (``gate.exclude.ExcludeStep``)."""

    pass_: QuantizePass
    source: SourceModel
    base: QuantizePass | None = None  # the pass before the loop excluded anything

    @property
    def excluded(self) -> list[str]:
        return list(self.pass_.nodes_to_exclude)

    def excluding(self, nodes: Sequence[str]) -> QuantizeStep:
        base = self.base or self.pass_
        return QuantizeStep(base.with_excluded(nodes), self.source, base)

    def build(self) -> PassResult | None:
        try:
            return self.pass_.run(self.source)
        except NothingQuantizedError:
            if self.base is None:
                raise  # the step itself quantizes nothing: the pass's own message says why
            return None  # everything quantizable is already in float


def _samples(
    source: SourceModel, options: Int8Options, gate: GateOptions, shapes: Mapping[str, tuple[int, ...]] | None
) -> CalibrationSet:
    if gate.calibration is not None or options.calibrated or gate.max_error is not None:
        return load_calibration(gate.calibration, source.proto, shapes=shapes)
    # Dynamic quantization does not calibrate; accuracy is still reported, on generated inputs.
    plan = plan_feeds(source.proto, shapes)
    log.info("Measuring accuracy on 4 generated inputs (%s); pass --calibration for real ones.", plan.describe())
    return CalibrationSet(
        generate_samples(source.proto, 4, plan=plan), "generated inputs", synthetic=True
    )  # its split holds one of the four out for the gate; dynamic mode calibrates on none


@dataclass
class Int8Flow:
    """The INT8 modes in the one flow (``gate.flow.QuantizeFlow``): ``QuantizePass`` as the step, the
    output gate on held-out samples, the layers ranked on the calibration samples, ``Rounds``."""

    step: QuantizeStep
    gate: ModelGate
    ranking: Ranking
    schedule: Rounds
    max_tries: int
    data: CalibrationSet
    rescue: bool  # --auto-exclude with a limit to work towards
    worst_n: int = 5

    def history(self, outcome: ExcludeResult) -> list[dict[str, Any]]:
        if not self.rescue:
            return []
        return [
            {
                "round": i,
                "excluded": t.excluded,
                "error": finite(t.result.error),
                "passed": t.passed,
                "quantized_nodes": t.built.record.quantized_nodes,
            }
            for i, t in enumerate(outcome.tries)
        ]

    def failure(self, outcome: ExcludeResult, history: Sequence[dict[str, Any]]) -> Exception:
        best, measured = outcome.best, outcome.best.result
        measured.worst_layers = outcome.worst_layers(self.worst_n)
        hint = (
            f"--auto-exclude left {len(best.excluded)} layer(s) in float over {len(history)} round(s) "
            f"({', '.join(best.excluded) or 'none'}) and the gate still fails; raise --max-error, use "
            "real --calibration data, or a milder --mode."
        )
        return gate_failure(measured, hint=hint if self.rescue else "")

    def finish(
        self, outcome: ExcludeResult, history: list[dict[str, Any]], output: Any, written: Path | None
    ) -> dict[str, Any]:
        result: PassResult = outcome.best.built
        measured: GateResult = outcome.best.result
        data = self.data
        result.record.notes.append(f"accuracy: {measured.describe()}")
        if data.synthetic:
            result.record.notes.append("calibration/accuracy on synthetic inputs: not representative of real data")
        calibrated = data.calibration_data()
        if not self.step.pass_.calibrated:
            calibrated = {**calibrated, "samples": 0}
        return {
            "output": str(written) if written else None,
            "record": result.record.to_dict(),
            "gate": _gate_doc(measured),
            "calibration": data.describe(),
            "synthetic_calibration": data.synthetic,
            "gate_data": data.gate_data(),
            "calibration_data": calibrated,
            "auto_exclude": history,
        }


def quantize_int8_gated(
    model: ModelLike,
    output: str | os.PathLike | None,
    options: Int8Options | str | None = None,
    gate: GateOptions | None = None,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    providers: Sequence[str] | None = None,
    worst_n: int = 5,
    holdout_fraction: float = 0.25,
    **keywords: Any,
) -> QuantizeReport:
    """Quantize ``model`` as ``options`` says, gate it on held-out samples, write it to ``output`` if it passes.

    ``options``: a ``QuantizeOptions`` (ORT's INT8 modes) or ``OpenVINOInt8Options`` (NNCF's), or the mode's
    name with its settings as keywords (``per_channel=True``); ``gate``: a ``GateOptions``, or its fields as
    keywords (``max_error=0.01``, ``metric="cosine"``, ``calibration=...``, ``auto_exclude=True``). With
    ``gate.outputs`` (``--outputs``) the model is pruned to them first (``graph.prune.prune_to_outputs``), so
    the quantizer, the gate and the written model see only them. ``providers``: where the gate runs both
    models; ``worst_n`` layers a failure names; ``holdout_fraction`` of the samples the gate holds out."""
    options, gate = int8_records(options, gate, keywords)
    source = SourceModel.of(model)
    folder = folder_near(source.path)
    if gate.outputs:  # a name the model lacks: UsageError (exit 2) before any work
        source = SourceModel.of(prune_to_outputs(source.proto, list(gate.outputs)))
    if gate.max_error is None and isinstance(options, QuantizeOptions) and options.always_gated:
        gate = replace(gate, max_error=DEFAULT_FULL_MAX_ERROR)
        log.info("--mode full is always gated: using --max-error %g.", gate.max_error)
    # A bad --max-error or --metric is refused before any work.
    gate_spec = gate.output_gate(source.proto, folder, compare=True)
    data = _samples(source, options, gate, shapes)
    refuse_all_empty(data.samples, "the gate", f"samples ({data.source})")
    calib, heldout = data.split(holdout_fraction)
    step, providers = int8_step(options, calib, providers)
    judge = ModelGate.of(
        replace(gate_spec, inputs=heldout),
        SampleProbe(heldout, providers),
        str(source.path) if source.path else source.proto,
    )
    flow = Int8Flow(
        QuantizeStep(step, source),
        judge,
        int8_ranking(step, source, calib),
        Rounds(gate.per_round),
        gate.max_rounds + 1 if gate.rescue else 1,
        data,
        gate.rescue,
        worst_n,
    )
    return quantize_and_gate(flow, output or None)


def int8_records(
    options: Int8Options | str | None, gate: GateOptions | None, keywords: dict[str, Any]
) -> tuple[Int8Options, GateOptions]:
    """The records ``quantize_int8_gated`` takes, from themselves or from their fields as keywords."""
    gate, settings = gate_keywords(gate, keywords)
    if not isinstance(options, (QuantizeOptions, OpenVINOInt8Options)):
        options = quantize_options(options or QuantizeOptions.mode, **settings)
    elif settings:
        raise UsageError(f"Give the {type(options).__name__} or its settings as keywords, not both.")
    if not isinstance(options, (QuantizeOptions, OpenVINOInt8Options)):
        raise UsageError(
            f"--mode {options.mode} is weight-only, gated on generation: decode.gate.quantize_weight_only_gated "
            "(or ortpilot.api.quantize_gated, which takes every mode)."
        )
    return options, gate


def int8_step(
    options: Int8Options, calib: Sequence[Mapping[str, Any]], providers: Sequence[str] | None
) -> tuple[Any, Sequence[str] | None]:
    """The pass ``options`` describe, calibrated on ``calib`` where it calibrates, and the providers its gate runs on.

    ``--mode openvino``: NNCF's QDQ model (``passes.openvino_int8``), gated on OpenVINO where it runs here
    (its kernels are what the model is for; NNCF's QDQ model on the CPU EP runs slower than float), else
    on the CPU EP, which computes the same quantized values."""
    if isinstance(options, QuantizeOptions):
        return QuantizePass(options, calibration=calib if options.calibrated else None), providers
    from ortpilot.passes.openvino_int8 import OpenVINOInt8Pass
    from ortpilot.providers.openvino import OPENVINO
    from ortpilot.providers.plugins import compute_providers

    step = OpenVINOInt8Pass(options, calibration=list(calib))
    if providers is None and OPENVINO in compute_providers():
        providers = ["openvino", "cpu"]
    elif providers is None:
        log.info("OpenVINO does not run here: the gate runs NNCF's model on the CPU EP (the same quantized values).")
    return step, providers


__all__ = [
    "DEFAULT_FULL_MAX_ERROR",
    "Int8Flow",
    "Int8Options",
    "QuantizeReport",
    "QuantizeStep",
    "int8_records",
    "int8_step",
    "quantize_int8_gated",
]
