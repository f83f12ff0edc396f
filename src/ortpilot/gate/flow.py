"""One gated quantization: quantize, gate, rescue, and write only what passes (every ``quantize`` mode).

Every mode of ``ortpilot quantize`` is the same story: build the quantized candidate, measure it
with a gate against its source, and with a failing gate leave layers in higher precision try by
try (the one auto-exclude loop, ``gate.exclude``); a model that still fails is not written
(``AccuracyGateError``, exit 1), one that passes is written atomically and reported. What
differs is a :class:`QuantizeFlow`: the step (``QuantizePass`` or the weight-only pass), the gate
(the output gate on held-out samples, ``gate.quantize``; the generation gate on a teacher-forced
decoder, ``decode.gate``), the ranking and schedule of the rescue, and the words: the tries'
history, the failure and the document ``--json`` prints. :class:`QuantizeReport` is the one
report of every mode.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ortpilot.artifacts.atomic import save_model
from ortpilot.gate.core import ModelGate
from ortpilot.gate.exclude import ExcludeResult, ExcludeStep, Ranking, Schedule
from ortpilot.gate.exclude import auto_exclude as run_auto_exclude
from ortpilot.gate.result import GateResult
from ortpilot.passes.base import PassRecord, PassResult


@dataclass
class QuantizeReport:
    """What one gated quantization did: where the model went, the gate's result, the auto-exclude
    tries, and ``document``, the JSON-ready report the mode's flow laid out (``to_dict``, what
    ``quantize --json`` prints). ``report["gate"]`` reads the document."""

    output: Path | None
    gate: GateResult
    history: list[dict[str, Any]]
    document: dict[str, Any]
    record: PassRecord | None = None  # the pass's record, where the step made one

    def to_dict(self) -> dict[str, Any]:
        return dict(self.document)

    def __getitem__(self, key: str) -> Any:
        return self.document[key]

    @property
    def calibration(self) -> str:
        """Where the samples came from (INT8 modes)."""
        return self.document.get("calibration", "")

    @property
    def synthetic(self) -> bool:
        """Calibration and gate ran on generated inputs (INT8 modes)."""
        return bool(self.document.get("synthetic_calibration", False))

    @property
    def gate_data(self) -> dict[str, Any]:
        """What the gate ran on (``CalibrationSet.gate_data``; INT8 modes)."""
        return self.document.get("gate_data", {})

    @property
    def calibration_data(self) -> dict[str, Any]:
        """What the calibration ran on (INT8 modes)."""
        return self.document.get("calibration_data", {})


class QuantizeFlow(Protocol):
    """What one quantize mode brings to the flow: the step, the gate, the rescue and the words."""

    step: ExcludeStep
    gate: ModelGate
    ranking: Ranking
    schedule: Schedule

    @property
    def max_tries(self) -> int | None:
        """Tries of the auto-exclude loop, the step as it is included (1: no rescue)."""

    def history(self, outcome: ExcludeResult) -> list[dict[str, Any]]:
        """The tries as the report lists them (empty without a rescue)."""

    def failure(self, outcome: ExcludeResult, history: Sequence[dict[str, Any]]) -> Exception:
        """The error for a best try that still fails the gate (nothing is written)."""

    def finish(
        self, outcome: ExcludeResult, history: list[dict[str, Any]], output: Any, written: Path | None
    ) -> dict[str, Any]:
        """The document of a passing try (``output`` as given, ``written`` where it went)."""


def search(flow: QuantizeFlow) -> ExcludeResult:
    """The flow's step measured by its gate and, while its schedule goes on, rescued try by try."""
    return run_auto_exclude(flow.step, flow.gate, flow.ranking, flow.schedule, max_tries=flow.max_tries)


def quantize_and_gate(flow: QuantizeFlow, output: str | os.PathLike | None) -> QuantizeReport:
    """Run ``flow``; write its best try to ``output`` (None: nowhere) only if it passes the gate."""
    outcome = search(flow)
    history = flow.history(outcome)
    if not outcome.passed:
        raise flow.failure(outcome, history)
    best = outcome.best
    written = _save(best.built, output) if output is not None else None
    document = flow.finish(outcome, history, output, written)
    return QuantizeReport(written, best.result, history, document, getattr(best.built, "record", None))


def _save(built: Any, output: str | os.PathLike) -> Path:
    """Atomically: a ``PassResult`` reuses the bytes its pass serialized; a search's ``Outcome`` is saved whole."""
    if isinstance(built, PassResult):
        return built.save(output)
    return save_model(built.model, output)


__all__ = ["QuantizeFlow", "QuantizeReport", "quantize_and_gate", "search"]
