"""The output gate: each output of a candidate against the reference's, with the metric that suits it.

The metric per output is a ``measure.metrics.MetricChoice``, chosen on evidence from the model
(``OutputGate.for_model``: the op that made the output, its type, its name, the model folder,
``--metric`` overrides) and carrying that evidence, then re-made from what the reference really
returned on the held-out samples (``measure.metrics.choose_from_outputs``): a declared shape the
outputs contradict gives way to the actual one, and class scores over steps with a CTC blank are
gated on ``ctc`` (per-step top-1 and the decoded sequences; such a gate needs 59 held-out samples
and says so below that). An output without a choice is judged by what its arrays show. Every metric is an error (0 = identical), so one limit serves them all.
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
from ortpilot.gate.result import MIN_GATE_SAMPLES, MIN_SEQUENCE_SAMPLES, SEQUENCE_SAMPLES_WHY, Check, GateResult
from ortpilot.graph.feeds import read_samples
from ortpilot.graph.outputs import OutputFacts, output_facts
from ortpilot.measure.compare import compare_runs, run_samples
from ortpilot.measure.metrics import (
    METRIC_DESCRIPTIONS,
    MetricChoice,
    MetricOverrides,
    choose_from_outputs,
    choose_metrics,
    describe_figures,
    masks_of,
    metric_error,
    sequence_figures,
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
    # What the graph declares of the outputs whose metric was chosen from it (not set by --metric or
    # recorded by a tune): those choices are re-made from what the reference really returns.
    declared: Mapping[str, OutputFacts] = field(default_factory=dict)

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
        user = MetricOverrides.parse(metrics)
        choices = choose_metrics(model, folder, user)
        declared = {f.name: f for f in output_facts(model) if user.get(f.name) is None}
        return cls(max_error, choices, list(inputs), compare, declared)

    def choice_of(self, name: str, arrays: Sequence[np.ndarray]) -> MetricChoice:
        """The metric for one output: the given choice, re-made from ``arrays`` (the reference's) where it
        came from the graph, or made from them where there is none (``measure.metrics.choose_from_outputs``)."""
        choice = self.choices.get(name)
        if choice is not None and name not in self.declared:
            return choice  # the user's --metric, or what a tune recorded
        return choose_from_outputs(name, arrays, self.declared.get(name), choice)

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
            figures: dict[str, float] = {}
            if note:
                error = math.inf
            elif choice.metric == "ctc":
                figures = sequence_figures(ref, got, choice.step_axis)
                error = max(1.0 - figures["step_top1_agreement"], 1.0 - figures["sequence_exact_match"])
            else:
                error, figures = worst_sample_error(choice.metric, ref, got, masks_of(choice, self.inputs))
            error = float(error) if math.isfinite(error) else math.inf
            passed = self.max_error is None or error <= self.max_error
            checks.append(Check(name, choice.metric, error, self.max_error, passed, note, figures))
        samples = len(next(iter(reference.values()), ()))
        minimum, why = samples_needed(choices)
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
        result = GateResult(
            checks,
            self.max_error,
            samples,
            comparison=comparison,
            choices=choices,
            min_samples=minimum,
            min_samples_why=why,
        )
        result.summary = _summary(result)
        return result


# Metrics that count agreements (a share of samples or steps that changed) are judged over all samples; any
# other error is judged on the worst sample alone: a mean over samples hides the one sentence INT8 broke.
SHARE_METRICS = frozenset({"top1", "masked_top1", "exact", "masked_exact", "ctc"})


def worst_sample_error(
    metric: str, ref: Sequence[np.ndarray], got: Sequence[np.ndarray], masks: Sequence[np.ndarray] | None
) -> tuple[float, dict[str, float]]:
    """(error, figures): ``metric`` over all samples for a share metric (``SHARE_METRICS``); else the worst
    sample's error, with the mean over samples and the worst sample's index beside it (when there are several)."""
    if metric in SHARE_METRICS or len(ref) < 2:
        return metric_error(metric, ref, got, masks), {}
    errors = [
        metric_error(metric, [r], [g], None if masks is None else [masks[i]]) for i, (r, g) in enumerate(zip(ref, got))
    ]
    worst = int(np.argmax(errors))
    return float(errors[worst]), {"mean_error": float(np.mean(errors)), "worst_sample": float(worst)}


def samples_needed(choices: Mapping[str, MetricChoice]) -> tuple[int, str]:
    """The held-out samples a verdict on these metrics needs, and what for (``gate.result``: more for
    ``ctc``), as ``gate_data_warning(samples, ..., *samples_needed(choices))`` takes them."""
    if any(c.metric == "ctc" for c in choices.values()):
        return MIN_SEQUENCE_SAMPLES, SEQUENCE_SAMPLES_WHY
    return MIN_GATE_SAMPLES, ""


def _summary(result: GateResult) -> str:
    what = METRIC_DESCRIPTIONS.get(result.metric or "", result.metric or "error")
    choice = result.choices.get(result.worst_output or "")
    if choice is not None and choice.evidence:
        what += f"; {choice.evidence}"
    worst = result.worst
    figures = describe_figures(worst.figures) if worst is not None else ""
    limit = "no limit" if result.limit is None else f"limit {result.limit:g}"
    warning = result.warning
    return (
        f"error {result.error:.4g} on output '{result.worst_output}' ({what})"
        + (f": {figures}" if figures else "")
        + f" over {result.samples} held-out sample(s), {limit}"
        + (f"; {warning}" if warning else "")
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
    "samples_needed",
]
