"""The output gate: each output of a candidate against the reference's, with the metric that suits it.

The metric per output is a ``measure.metrics.MetricChoice``, chosen on evidence from the model
(``OutputGate.for_model``: the op that made the output, its type, its name, the model folder,
``--metric`` overrides) and carrying that evidence; an output without a choice is judged by the
rule for a bare array. Every metric is an error (0 = identical), so one limit serves them all.
Masked and pooled metrics read each held-out sample's attention mask from ``inputs``, the
samples the outputs were computed on. An output the candidate lacks, or whose shape changed,
fails with an infinite error. ``tune`` holds candidates to 0.01 by default, strict enough that
plain dynamic INT8 of MiniLM (cosine 0.88) fails; ``quantize`` holds them to ``--max-error``.

Outputs travel as ``{name: [array per sample]}``. Two probes make them: :class:`SampleProbe`
runs held-out samples through a strict verified session (``quantize``), :class:`SavedOutputs`
reads the ``{i}/{name}`` npz a tune worker saved.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.errors import UsageError
from ortpilot.gate.result import Check, GateResult, few_samples_warning
from ortpilot.graph.feeds import read_samples
from ortpilot.measure.compare import compare_runs, run_samples
from ortpilot.measure.metrics import (
    METRIC_DESCRIPTIONS,
    MetricChoice,
    choice_for_array,
    choose_metrics,
    masks_of,
    metric_error,
)

DEFAULT_MAX_ERROR = 0.01
Outputs = Mapping[str, Sequence[np.ndarray]]  # output name -> one array per sample


@dataclass(frozen=True)
class OutputGate:
    """Every output's error at most ``max_error`` (None: measured, never refused)."""

    max_error: float | None = DEFAULT_MAX_ERROR
    choices: Mapping[str, MetricChoice] = field(default_factory=dict)  # per output (measure.metrics)
    inputs: Sequence[Mapping[str, np.ndarray]] = ()  # the held-out samples the outputs come from (masks)
    compare: bool = False  # also keep measure.compare's full statistics per output (quantize's table)

    def __post_init__(self) -> None:
        if self.max_error is not None and not (self.max_error >= 0):
            raise UsageError(f"--max-error must be >= 0, got {self.max_error}.")

    @classmethod
    def for_model(
        cls,
        model: Any,
        max_error: float | None = DEFAULT_MAX_ERROR,
        *,
        metrics: Any = None,
        folder: Any = None,
        inputs: Sequence[Mapping[str, np.ndarray]] = (),
        compare: bool = False,
    ) -> OutputGate:
        """The gate for ``model`` (an ``onnx.ModelProto``): each output's metric chosen on evidence,
        ``metrics`` the user's ``--metric`` overrides (bad ones raise UsageError now, before any work)."""
        return cls(max_error, choose_metrics(model, folder, metrics), list(inputs), compare)

    def choice_of(self, name: str, arrays: Sequence[np.ndarray]) -> MetricChoice:
        return self.choices.get(name) or choice_for_array(name, arrays[0])

    def choices_for(self, reference: Outputs) -> dict[str, MetricChoice]:
        """Output name -> the metric and its evidence (printed before a search starts, and in reports)."""
        return {name: self.choice_of(name, arrays) for name, arrays in reference.items()}

    def metrics_for(self, reference: Outputs) -> dict[str, str]:
        """Output name -> metric used."""
        return {name: c.metric for name, c in self.choices_for(reference).items()}

    def check(self, reference: Outputs, candidate: Outputs) -> GateResult:
        checks = []
        choices = self.choices_for(reference)
        for name, choice in choices.items():
            ref, got = reference[name], candidate.get(name)
            note = (
                "output missing"
                if got is None
                else "shape changed"
                if [a.shape for a in ref] != [b.shape for b in got]
                else ""
            )
            error = math.inf if note else metric_error(choice.metric, ref, got, masks_of(choice, self.inputs))
            error = float(error) if math.isfinite(error) else math.inf
            passed = self.max_error is None or error <= self.max_error
            checks.append(Check(name, choice.metric, error, self.max_error, passed, note))
        samples = len(next(iter(reference.values()), ()))
        comparison = None
        if self.compare:
            comparison = compare_runs(
                by_sample(reference),
                by_sample(candidate),
                reference="float",
                test="transformed",
                choices=choices,
                samples=self.inputs,
            )
        result = GateResult(checks, self.max_error, samples, comparison=comparison, choices=choices)
        result.summary = _summary(result)
        return result


def _summary(result: GateResult) -> str:
    what = METRIC_DESCRIPTIONS.get(result.metric or "", result.metric or "error")
    choice = result.choices.get(result.worst_output or "")
    if choice is not None and choice.evidence:
        what += f"; {choice.evidence}"
    limit = "no limit" if result.limit is None else f"limit {result.limit:g}"
    warning = few_samples_warning(result.samples)
    return (
        f"error {result.error:.4g} on output '{result.worst_output}' ({what}) over {result.samples} held-out "
        f"sample(s), {limit}" + (f"; {warning}" if warning else "")
    )


def by_name(runs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
    """Per-sample output dicts (``measure.compare.run_samples``) as name -> one array per sample."""
    out: dict[str, list[np.ndarray]] = {}
    for run in runs:
        for name, value in run.items():
            out.setdefault(name, []).append(value)
    return out


def by_sample(outputs: Outputs) -> list[dict[str, np.ndarray]]:
    count = max((len(v) for v in outputs.values()), default=0)
    return [{name: arrays[i] for name, arrays in outputs.items() if i < len(arrays)} for i in range(count)]


@dataclass
class SampleProbe:
    """A model's outputs on held-out samples, through a strict verified session (no silent fallback)."""

    samples: Sequence[Mapping[str, np.ndarray]]
    providers: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("the accuracy gate needs at least one held-out sample")
        self.samples = [dict(s) for s in self.samples]
        self.providers = list(self.providers) if self.providers else None

    def run(self, model: Any, reference: Any = None) -> dict[str, list[np.ndarray]]:
        from ortpilot.session import load

        return by_name(run_samples(load(model, self.providers, "strict", placement=False), self.samples))


class SavedOutputs:
    """Outputs a tune worker saved (``{i}/{name}`` arrays in one npz); the "model" is that file."""

    def run(self, model: str | Path, reference: Any = None) -> dict[str, list[np.ndarray]]:
        return read_outputs(model)


def read_outputs(path: str | Path) -> dict[str, list[np.ndarray]]:
    """``{i}/{name}`` arrays from the worker's npz into name -> one array per sample."""
    samples = read_samples(path)
    return {name: [sample[name] for sample in samples] for name in (samples[0] if samples else {})}


def describe(metric: str) -> str:
    return METRIC_DESCRIPTIONS.get(metric, metric)


__all__ = [
    "DEFAULT_MAX_ERROR",
    "OutputGate",
    "Outputs",
    "SampleProbe",
    "SavedOutputs",
    "by_name",
    "by_sample",
    "describe",
    "read_outputs",
]
