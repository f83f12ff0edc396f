"""What a gate says about a candidate: one ``Check`` per output (or per statistic), and the verdict.

Every gate in ortpilot reports the same shape, Polygraphy-comparator style: for each thing it
judged, the metric, the value measured, the limit and whether it passed. The candidate passes
when every check does. Gates that measured more than the checks (the full per-output statistics
of ``measure.compare``, the per-prompt record of the generation gate) keep it in ``comparison``,
for the tables and documents that show it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ortpilot.errors import AccuracyGateError

# Below this many held-out samples a verdict says little: 4 samples that agree on top-1 leave a
# 1-in-2 disagreement rate plausible, and one unlucky sample rejects a good model.
MIN_GATE_SAMPLES = 16
# A decoded-sequence exact-match rate (``ctc``) counts whole samples, and one changed string in 20 is
# what a user sees. If a model really changes 1 sequence in 20, n held-out samples show no change with
# probability 0.95**n, which falls under 5 % only from n = 59 on (the "rule of three" bound 3/n <= 1/20
# says 60): with fewer, such a model passes more often than 1 time in 20.
MIN_SEQUENCE_SAMPLES = 59
SEQUENCE_SAMPLES_WHY = "to see a model that changes 1 decoded sequence in 20 (ctc)"


# The gate judges continuous outputs by their worst held-out sample. A sample that breaks 1 time in 100 (one
# sentence in 2,000 fell to cosine 0.985 where the worst of 50 held out stayed within the 0.01 gate) is among
# n held-out samples with probability 1 - 0.99**n: 39 % at 50, and 95 % only from n = 299 on.
RARE_BREAK = 0.01
SAMPLES_TO_SEE_RARE = 299


def rare_break_clause(samples: int) -> str:
    """What ``samples`` held-out samples can show of a sample that breaks 1 time in 100 ("" from
    ``SAMPLES_TO_SEE_RARE`` on): the reach of a worst-sample verdict, said beside the gate data."""
    if samples <= 0 or samples >= SAMPLES_TO_SEE_RARE:
        return ""
    chance = 1.0 - (1.0 - RARE_BREAK) ** samples
    return (
        f"The gate judges each output by its worst of {samples} held-out samples: a sample that breaks 1 time in "
        f"100 is among them {chance:.0%} of the time ({SAMPLES_TO_SEE_RARE} show it 95 % of the time: give "
        f"{4 * SAMPLES_TO_SEE_RARE:,} or more real samples, a quarter is held out)."
    )


def few_samples_warning(samples: int, minimum: int = MIN_GATE_SAMPLES, why: str = "") -> str:
    """The warning a gate decided on fewer than ``minimum`` held-out samples carries ("" otherwise);
    ``why``: what that many samples are needed for, when it is more than ``MIN_GATE_SAMPLES``."""
    if samples >= minimum:
        return ""
    return (
        f"decided on only {samples} held-out sample(s), fewer than {minimum}{' ' + why if why else ''}: the verdict "
        f"may not hold on other inputs; give {4 * max(minimum, 16)} or more real samples (--calibration-text, "
        "--calibration-images or --calibration: a quarter of them is held out)"
    )


def gate_data_warning(
    samples: int, synthetic_inputs: str | None = None, minimum: int = MIN_GATE_SAMPLES, why: str = ""
) -> str:
    """The one warning about what a gate decides on ("" for enough real samples): generated inputs
    (``synthetic_inputs``: their shapes, ``x=1x64``), fewer than ``minimum`` samples (``GateResult.min_samples``:
    more for a ``ctc`` output), or both, said once. A clause that follows "the accuracy gate is" / "was"."""
    if synthetic_inputs is None:
        return few_samples_warning(samples, minimum, why)
    few = f", and fewer than {minimum}{' ' + why if why else ''}" if samples < minimum else ""
    return (
        f"decided on {samples} synthetic input{'s' * (samples != 1)} ({synthetic_inputs}): not real data{few}, so "
        f"the verdict says little about real inputs; give {4 * max(minimum, 16)} or more real samples (--calibration-text, "
        "--calibration-images or --calibration: a quarter of them is held out) before trusting an INT8 or fused winner"
    )


@dataclass(frozen=True)
class Check:
    """One output (or one statistic) against its limit. ``limit`` None: measured, not gated."""

    name: str
    metric: str
    value: float
    limit: float | None
    passed: bool
    note: str = ""  # why the value is what it is when it is not a measurement ("output missing")
    figures: Mapping[str, float] = field(default_factory=dict)  # what the value was made of (ctc: its two rates)

    def to_dict(self) -> dict[str, Any]:
        """The per-output record tune journals (``error``: the value; every output metric is an error)."""
        doc: dict[str, Any] = {"name": self.name, "metric": self.metric, "error": self.value}
        if self.note:
            doc["note"] = self.note
        if self.figures:
            doc["figures"] = dict(self.figures)
        return doc


@dataclass
class GateResult:
    """Every check of one candidate, and what the gate measured on the way."""

    checks: list[Check]
    limit: float | None = None  # the one limit an output gate holds every output to (``max_error``)
    samples: int = 0
    summary: str = ""  # one line, written by the gate that checked
    comparison: Any = None  # measure.compare.Comparison, generation.DecoderComparison, or None
    worst_layers: list[Any] = field(default_factory=list)  # filled in when the gate failed and layers were ranked
    choices: Mapping[str, Any] = field(default_factory=dict)  # output gates: name -> measure.metrics.MetricChoice
    min_samples: int = MIN_GATE_SAMPLES  # held-out samples this verdict needs (more for a ctc output)
    min_samples_why: str = ""  # what ``min_samples`` above the default is needed for

    @property
    def warning(self) -> str:
        """Why the verdict deserves less trust than it reads ("" when nothing says so)."""
        return few_samples_warning(self.samples, self.min_samples, self.min_samples_why) if self.samples else ""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def worst(self) -> Check | None:
        """The check with the largest value (for output gates: the largest error)."""
        return max(self.checks, key=lambda c: c.value, default=None)

    @property
    def error(self) -> float:
        worst = self.worst
        return worst.value if worst is not None else 0.0

    @property
    def max_error(self) -> float | None:
        return self.limit

    @property
    def worst_output(self) -> str | None:
        worst = self.worst
        return worst.name if worst is not None else None

    @property
    def metric(self) -> str | None:
        worst = self.worst
        return worst.metric if worst is not None else None

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def describe(self) -> str:
        return self.summary or f"error {self.error:.4g} on '{self.worst_output}'"

    def to_dict(self) -> dict[str, Any]:
        """The compact record: verdict, limit, worst value and each check (what a tune journals per candidate)."""
        return {
            "passed": self.passed,
            "max_error": self.limit,
            "worst_error": self.error,
            "samples": self.samples,
            "outputs": [c.to_dict() for c in self.checks],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> GateResult:
        """A compact record (``to_dict``, a tune journal's ``accuracy``) read back."""
        limit = doc.get("max_error")
        checks = [
            Check(
                str(o.get("name")),
                str(o.get("metric")),
                float(o.get("error", math.inf)),
                limit,
                _within(float(o.get("error", math.inf)), limit),
                str(o.get("note", "")),
                _figures(o.get("figures")),
            )
            for o in doc.get("outputs") or []
        ]
        samples = doc.get("samples")
        return cls(checks, limit, samples if type(samples) is int and samples > 0 else 0)


def _figures(doc: Any) -> dict[str, float]:
    """A check's recorded figures (numbers only; anything else in a journal is dropped)."""
    if not isinstance(doc, Mapping):
        return {}
    return {str(k): float(v) for k, v in doc.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _within(value: float, limit: float | None) -> bool:
    return limit is None or bool(math.isfinite(value) and value <= limit)


def gate_failure(result: GateResult, hint: str = "") -> AccuracyGateError:
    """The error to raise for a failed gate, naming the worst layers when they are known."""
    layers = ""
    if result.worst_layers:
        layers = (
            " Worst layers: "
            + "; ".join(w.describe() if hasattr(w, "describe") else str(w) for w in result.worst_layers)
            + "."
        )
    return AccuracyGateError(
        f"Accuracy gate failed: {result.describe()}. Nothing was written.{layers} "
        + (
            hint
            or "Try --auto-exclude to leave the worst layers in float, per-channel weights (--per-channel), "
            "another calibration --method, or a milder --mode."
        )
    )


__all__ = [
    "MIN_GATE_SAMPLES",
    "MIN_SEQUENCE_SAMPLES",
    "SEQUENCE_SAMPLES_WHY",
    "Check",
    "GateResult",
    "few_samples_warning",
    "gate_data_warning",
    "gate_failure",
]
