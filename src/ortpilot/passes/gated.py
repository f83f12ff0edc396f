"""Quantize, measure, explain, and only then write: what ``ortpilot quantize`` runs.

Calibration data is split into calibration and held-out samples; the quantized model is
compared with its source on the held-out ones; a model that fails ``max_error`` is not
written (AccuracyGateError, exit 1) and the worst layers are named, or, with
``auto_exclude``, left in float round by round until it passes. Layers are ranked on the
calibration samples (dynamic mode: each weighted node's product replayed on its real input
activations, ``passes.sensitivity``), not on the held-out samples that decide the gate.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortpilot.graph.feeds import make_feeds, plan_feeds
from ortpilot.passes.base import ModelLike, PassRecord, SourceModel
from ortpilot.passes.calibration import CalibrationSet, load_calibration
from ortpilot.passes.debug import auto_exclude as run_auto_exclude
from ortpilot.passes.debug import worst_layers
from ortpilot.passes.gate import AccuracyGate, GateResult, gate_failure
from ortpilot.passes.quantize import QuantizePass

log = logging.getLogger("ortpilot")
# ``full`` leaves no float islands: it is always gated, by this much unless told otherwise.
DEFAULT_FULL_MAX_ERROR = 0.05


@dataclass
class QuantizeReport:
    output: Path | None
    record: PassRecord
    gate: GateResult
    calibration: str
    synthetic: bool
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"output": str(self.output) if self.output else None, "record": self.record.to_dict(),
                "gate": self.gate.to_dict(), "calibration": self.calibration, "synthetic_calibration": self.synthetic,
                "auto_exclude": self.history}


def _samples(source: SourceModel, mode: str, calibration: Any, shapes: Mapping[str, tuple[int, ...]] | None,
             max_error: float | None) -> CalibrationSet:
    if calibration is not None or mode != "dynamic" or max_error is not None:
        return load_calibration(calibration, source.proto, shapes=shapes)
    # Dynamic quantization does not calibrate; accuracy is still reported, on generated inputs.
    plan = plan_feeds(source.proto, shapes)
    log.info("Measuring accuracy on 4 generated inputs (%s); pass --calibration for real ones.", plan.describe())
    return CalibrationSet([make_feeds(source.proto, plan=plan, seed=i) for i in range(4)], "generated inputs",
                          synthetic=True)


def quantize_gated(model: ModelLike, output: str | os.PathLike | None, mode: str = "dynamic", *,
                   calibration: Any = None, max_error: float | None = None,
                   shapes: Mapping[str, tuple[int, ...]] | None = None, auto_exclude: bool = False,
                   max_rounds: int = 6, per_round: int = 2, worst_n: int = 5, holdout_fraction: float = 0.25,
                   providers: Sequence[str] | None = None, **pass_options: Any) -> QuantizeReport:
    """Quantize ``model`` in ``mode``, gate it on held-out samples, write it to ``output`` if it passes."""
    source = SourceModel.of(model)
    if mode == "full" and max_error is None:
        max_error = DEFAULT_FULL_MAX_ERROR
        log.info("--mode full is always gated: using --max-error %g.", max_error)
    data = _samples(source, mode, calibration, shapes, max_error)
    calib, heldout = data.split(holdout_fraction)
    step = QuantizePass(mode, calibration=calib if mode != "dynamic" else None, **pass_options)
    gate = AccuracyGate(str(source.path) if source.path else source.proto, heldout, max_error, providers)
    history: list[dict[str, Any]] = []
    if auto_exclude and max_error is not None:
        result, measured, history = run_auto_exclude(step, source, gate, calib, max_rounds=max_rounds,
                                                     per_round=per_round, worst_n=worst_n)
    else:
        result = step.run(source)
        measured = gate.measure(result.model)
        if not measured.passed:
            measured.worst_layers = worst_layers(step, source, result.model, calib, worst_n)
            raise gate_failure(measured)
    result.record.notes.append(f"accuracy: {measured.describe()}")
    if data.synthetic:
        result.record.notes.append("calibration/accuracy on synthetic inputs: not representative of real data")
    written = result.save(output) if output else None
    return QuantizeReport(written, result.record, measured, data.describe(), data.synthetic, history)


__all__ = ["DEFAULT_FULL_MAX_ERROR", "QuantizeReport", "quantize_gated"]
