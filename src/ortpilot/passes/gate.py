"""The accuracy gate: a transformed model may only be written if it still gives the right answers.

The float (source) and transformed model run on held-out samples; each output's error is
measured with the metric that suits it (``ortpilot.measure.compare.choose_metric``: cosine
distance for embeddings, top-1 disagreement for class scores, relative L2 otherwise) and the
worst one is compared with ``max_error``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ortpilot.errors import AccuracyGateError
from ortpilot.measure.compare import METRIC_DESCRIPTIONS, Comparison, compare_runs, run_samples


@dataclass
class GateResult:
    """What the gate measured and whether the model passed."""

    max_error: float | None
    error: float
    worst_output: str | None
    metric: str | None
    samples: int
    comparison: Comparison
    worst_layers: list[Any] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.max_error is None or bool(math.isfinite(self.error) and self.error <= self.max_error)

    def describe(self) -> str:
        what = METRIC_DESCRIPTIONS.get(self.metric or "", self.metric or "error")
        limit = "no limit" if self.max_error is None else f"limit {self.max_error:g}"
        return (f"error {self.error:.4g} on output '{self.worst_output}' ({what}) over {self.samples} held-out "
                f"sample(s), {limit}")

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "max_error": self.max_error,
                "error": self.error if math.isfinite(self.error) else "inf", "worst_output": self.worst_output,
                "metric": self.metric, "samples": self.samples, "comparison": self.comparison.to_dict(),
                "worst_layers": [w.to_dict() if hasattr(w, "to_dict") else w for w in self.worst_layers]}


class AccuracyGate:
    """Reference outputs of the float model on held-out samples, computed once, reused per candidate."""

    def __init__(self, float_model: Any, heldout: Sequence[Mapping[str, np.ndarray]], max_error: float | None,
                 providers: Sequence[str] | None = None) -> None:
        from ortpilot.session import load

        if not heldout:
            raise ValueError("the accuracy gate needs at least one held-out sample")
        self.heldout = [dict(s) for s in heldout]
        self.max_error = max_error
        self.providers = list(providers) if providers else None
        self.reference = run_samples(load(float_model, self.providers, "strict", placement=False), self.heldout)

    def measure(self, model: onnx.ModelProto | str) -> GateResult:
        from ortpilot.session import load

        test = run_samples(load(model, self.providers, "strict", placement=False), self.heldout)
        comparison = compare_runs(self.reference, test, reference="float", test="transformed")
        worst = comparison.worst_output()
        return GateResult(self.max_error, float(comparison.worst_error()), worst.name if worst else None,
                          worst.metric if worst else None, len(self.heldout), comparison)


def gate_failure(result: GateResult, hint: str = "") -> AccuracyGateError:
    """The error to raise for a failed gate, naming the worst layers when they are known."""
    layers = ""
    if result.worst_layers:
        layers = " Worst layers: " + "; ".join(w.describe() if hasattr(w, "describe") else str(w)
                                                for w in result.worst_layers) + "."
    return AccuracyGateError(
        f"Accuracy gate failed: {result.describe()}. Nothing was written.{layers} "
        + (hint or "Try --auto-exclude to leave the worst layers in float, per-channel weights (--per-channel), "
           "another calibration --method, or a milder --mode."))


__all__ = ["AccuracyGate", "GateResult", "gate_failure"]
