"""Accuracy of one model (or provider) against another, output by output.

Per output: max/mean/median/p99 absolute and relative error, cosine similarity, SNR in dB,
top-1/top-5 agreement when the output holds class scores, NaN/Inf counts, and the minimum
atol / rtol that would have passed (the line of Polygraphy's comparator people actually read).
Each output is also judged by the one metric a gate or the tuner compares against a limit,
chosen on evidence by ``measure.metrics`` (the choice and its evidence are in the statistics).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ortpilot.errors import InputError, UsageError
from ortpilot.measure.metrics import (
    METRIC_DESCRIPTIONS,
    MetricChoice,
    MetricOverrides,
    choice_for_array,
    choose_from_outputs,
    choose_metric,
    choose_metrics,
    flatten,
    folder_near,
    masked,
    masks_of,
    metric_error,
    refuse_unknown_outputs,
    sequence_figures,
    topk_agreement,
)

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-5
COMPARE_SAMPLES = 4  # generated input sets ``ortpilot compare`` runs when given no inputs
_TINY = np.finfo(np.float64).tiny

Runs = Sequence[Mapping[str, np.ndarray]]


# --------------------------------------------------------------------------- tolerances


@dataclass
class Tolerances:
    """Default atol/rtol plus per-output overrides (``logits:1e-3`` on the command line)."""

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    per_output_atol: dict[str, float] = field(default_factory=dict)
    per_output_rtol: dict[str, float] = field(default_factory=dict)
    explicit: bool = False  # set by the user: a failure is then a verification failure

    def for_output(self, name: str) -> tuple[float, float]:
        return self.per_output_atol.get(name, self.atol), self.per_output_rtol.get(name, self.rtol)

    def check_outputs(self, names: Sequence[str]) -> None:
        """A NAME:VALUE for an output the model lacks would hold nothing to it (a typo passes): refused."""
        for kind, per_output in (("atol", self.per_output_atol), ("rtol", self.per_output_rtol)):
            refuse_unknown_outputs(f"--{kind}", list(per_output), names, "NAME:VALUE", "VALUE")

    @classmethod
    def parse(cls, atol: Sequence[str] | str | None = None, rtol: Sequence[str] | str | None = None) -> Tolerances:
        """Parse ``["1e-4", "logits:1e-3"]``: a bare number is the default, NAME:VALUE one output's."""
        tol = cls()
        for kind, items in (("atol", atol), ("rtol", rtol)):
            if items is None:
                continue
            for item in [items] if isinstance(items, str) else items:
                name, sep, value = str(item).rpartition(":")
                try:
                    number = float(value)
                except ValueError:
                    raise UsageError(f"--{kind} '{item}' is not a number or NAME:NUMBER (e.g. logits:1e-3).") from None
                if not 0 <= number < float("inf"):  # nan passes nothing and inf everything: neither checks
                    raise UsageError(f"--{kind} '{item}' must be a finite number, 0 or more.")
                tol.explicit = True
                if sep:
                    getattr(tol, f"per_output_{kind}")[name] = number
                else:
                    setattr(tol, kind, number)
        return tol


# --------------------------------------------------------------------------- statistics


@dataclass
class OutputStats:
    """Everything measured for one output, over all samples."""

    name: str
    shape: list[int]
    dtype: str
    elements: int
    max_abs: float
    mean_abs: float
    median_abs: float
    p99_abs: float
    max_rel: float
    mean_rel: float
    median_rel: float
    p99_rel: float
    cosine: float
    snr_db: float
    nan_ref: int
    inf_ref: int
    nan_test: int
    inf_test: int
    min_atol: float  # smallest atol that passes with rtol = 0
    min_rtol: float  # smallest rtol that passes with atol = 0
    atol: float
    rtol: float
    passed: bool
    metric: str
    error: float  # value of ``metric``
    top1_agreement: float | None = None
    top5_agreement: float | None = None
    metric_evidence: str = ""  # why ``metric`` (measure.metrics)
    step_top1_agreement: float | None = None  # ``ctc``: the share of steps whose top class agrees
    sequence_exact_match: float | None = None  # ``ctc``: the share of samples whose decoded sequence is identical

    def to_dict(self) -> dict[str, Any]:
        return {k: _jsonable(v) for k, v in asdict(self).items()}


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    return value


def compare_arrays(
    name: str,
    ref: Sequence[np.ndarray],
    test: Sequence[np.ndarray],
    *,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    choice: MetricChoice | None = None,
    masks: Sequence[np.ndarray] | None = None,
) -> OutputStats:
    """Statistics of ``test`` against ``ref`` for one output; each list holds one array per sample.

    ``choice``: the gate metric (default: chosen from the arrays alone); ``masks``: each sample's
    attention mask, for a masked or pooled metric (top-1/top-5 are then counted at real positions)."""
    _check_shapes(name, ref, test)
    a, b = flatten(ref), flatten(test)
    finite = np.isfinite(a) & np.isfinite(b)
    diff, rel = _abs_rel_errors(a, b, finite)
    max_abs, mean_abs, median_abs, p99_abs = _summary(diff)
    max_rel, mean_rel, median_rel, p99_rel = _summary(rel)
    snr = _snr_db(a, b, finite)
    cosine = _cosine(a, b, finite)
    passed = _within(diff, a, atol, rtol)
    choice = choice or (choice_for_array(name, ref[0]) if ref else MetricChoice("rel_l2", "no samples"))
    error = float(metric_error(choice.metric, ref, test, masks, choice.step_axis))
    top1, top5 = _topk_agreements(choice, ref, test, masks)
    sequences = sequence_figures(ref, test, choice.step_axis) if choice.metric == "ctc" else {}
    return OutputStats(
        name=name,
        shape=list(np.shape(ref[0])) if ref else [],
        dtype=str(np.asarray(ref[0]).dtype) if ref else "float32",
        elements=int(a.size),
        max_abs=max_abs,
        mean_abs=mean_abs,
        median_abs=median_abs,
        p99_abs=p99_abs,
        max_rel=max_rel,
        mean_rel=mean_rel,
        median_rel=median_rel,
        p99_rel=p99_rel,
        cosine=cosine,
        snr_db=snr,
        nan_ref=int(np.isnan(a).sum()),
        inf_ref=int(np.isinf(a).sum()),
        nan_test=int(np.isnan(b).sum()),
        inf_test=int(np.isinf(b).sum()),
        min_atol=max_abs,
        min_rtol=max_rel,
        atol=atol,
        rtol=rtol,
        passed=passed,
        metric=choice.metric,
        error=error,
        top1_agreement=top1,
        top5_agreement=top5,
        metric_evidence=choice.evidence,
        step_top1_agreement=sequences.get("step_top1_agreement"),
        sequence_exact_match=sequences.get("sequence_exact_match"),
    )


def _check_shapes(name: str, ref: Sequence[np.ndarray], test: Sequence[np.ndarray]) -> None:
    for r, t in zip(ref, test):
        if np.shape(r) != np.shape(t):
            raise InputError(
                f"Output '{name}' has shape {list(np.shape(r))} in the reference but "
                f"{list(np.shape(t))} in the model under test; they cannot be compared."
            )


def _abs_rel_errors(a: np.ndarray, b: np.ndarray, finite: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Element-wise |a - b| and |a - b| / |a|; equal values (inf == inf too) count 0, other non-finite pairs inf."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(a == b, 0.0, np.where(finite, np.abs(a - b), np.inf))
        rel = np.where(diff == 0, 0.0, diff / np.maximum(np.abs(a), _TINY))
    return diff, rel


def _summary(x: np.ndarray) -> tuple[float, float, float, float]:
    """Max, mean, median and 99th percentile (all 0 when there is nothing to compare)."""
    if x.size == 0:
        return 0.0, 0.0, 0.0, 0.0
    return float(x.max()), float(x.mean()), float(np.median(x)), float(np.percentile(x, 99))


def _snr_db(a: np.ndarray, b: np.ndarray, finite: np.ndarray) -> float:
    """Signal-to-noise ratio of ``b`` against ``a`` over the finite pairs (inf when they agree)."""
    noise = float(np.sum(np.where(finite, a - b, 0.0) ** 2))
    signal = float(np.sum(np.where(finite, a, 0.0) ** 2))
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _cosine(a: np.ndarray, b: np.ndarray, finite: np.ndarray) -> float:
    """Cosine similarity over the finite pairs: 1 when both are zero, 0 when only one is."""
    fa, fb = np.where(finite, a, 0), np.where(finite, b, 0)
    na, nb = float(np.linalg.norm(fa)), float(np.linalg.norm(fb))
    if na == 0 and nb == 0:
        return 1.0
    return float(np.dot(fa, fb) / (na * nb)) if na and nb else 0.0


def _within(diff: np.ndarray, a: np.ndarray, atol: float, rtol: float) -> bool:
    """The verdict: every element within ``atol + rtol * |reference|``."""
    return bool(np.all(diff <= atol + rtol * np.abs(a))) if a.size else True


def _topk_agreements(
    choice: MetricChoice, ref: Sequence[np.ndarray], test: Sequence[np.ndarray], masks: Sequence[np.ndarray] | None
) -> tuple[float | None, float | None]:
    """Top-1 and top-5 agreement when the gate metric reads class scores (at real positions when masked)."""
    if choice.metric not in ("top1", "masked_top1"):
        return None, None
    rows = (masked(ref, masks), masked(test, masks)) if choice.metric == "masked_top1" else (ref, test)
    return topk_agreement(*rows, 1), topk_agreement(*rows, 5)


# --------------------------------------------------------------------------- comparison


@dataclass
class Comparison:
    """The result of comparing a reference run against a test run, output by output."""

    reference: str
    test: str
    samples: int
    outputs: list[OutputStats]
    tolerances_explicit: bool = False
    only_in_reference: list[str] = field(default_factory=list)
    only_in_test: list[str] = field(default_factory=list)
    inputs: str = ""
    gate_data: dict[str, Any] = field(default_factory=dict)  # what the samples were (data.DataSource.describe)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs) and not self.only_in_reference

    def worst_error(self) -> float:
        """The largest per-output ``metric`` error (what an accuracy gate compares)."""
        return max((o.error for o in self.outputs), default=0.0)

    def worst_output(self) -> OutputStats | None:
        return max(self.outputs, key=lambda o: o.error, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "test": self.test,
            "samples": self.samples,
            "inputs": self.inputs,
            "passed": self.passed,
            "tolerances_explicit": self.tolerances_explicit,
            "worst_error": _jsonable(self.worst_error()),
            "outputs": [o.to_dict() for o in self.outputs],
            "only_in_reference": self.only_in_reference,
            "only_in_test": self.only_in_test,
            "gate_data": self.gate_data,
        }


def compare_runs(
    ref_runs: Runs,
    test_runs: Runs,
    tolerances: Tolerances | None = None,
    *,
    reference: str = "reference",
    test: str = "test",
    inputs: str = "",
    choices: Mapping[str, MetricChoice] | None = None,
    samples: Sequence[Mapping[str, np.ndarray]] = (),
) -> Comparison:
    """Compare outputs sample by sample; outputs are matched by name (by position if no name matches).

    ``choices``: each output's gate metric (``measure.metrics.choose_metrics``; missing ones are chosen
    from the arrays); ``samples``: the inputs each run was given (masked metrics read their masks)."""
    tol = tolerances or Tolerances()
    if len(ref_runs) != len(test_runs) or not ref_runs:
        raise UsageError(f"Need the same, non-zero number of runs to compare ({len(ref_runs)} vs {len(test_runs)}).")
    ref_names, test_names = list(ref_runs[0]), list(test_runs[0])
    pairs = [(n, n) for n in ref_names if n in test_names]
    if not pairs and len(ref_names) == len(test_names):
        pairs = list(zip(ref_names, test_names))
    matched_ref, matched_test = {p[0] for p in pairs}, {p[1] for p in pairs}
    stats = []
    for ref_name, test_name in pairs:
        atol, rtol = tol.for_output(ref_name)
        choice = (choices or {}).get(ref_name)
        stats.append(
            compare_arrays(
                ref_name,
                [r[ref_name] for r in ref_runs],
                [t[test_name] for t in test_runs],
                atol=atol,
                rtol=rtol,
                choice=choice,
                masks=masks_of(choice, samples) if choice is not None else None,
            )
        )
    return Comparison(
        reference,
        test,
        len(ref_runs),
        stats,
        tol.explicit,
        [n for n in ref_names if n not in matched_ref],
        [n for n in test_names if n not in matched_test],
        inputs,
    )


def run_samples(session: Any, samples: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Run a (verified or raw ORT) session on each sample, outputs by name."""
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(None, dict(feeds)))) for feeds in samples]


def compare_models(
    model_a: Any,
    model_b: Any = None,
    providers: Sequence[str] | None = None,
    *,
    samples: Sequence[Mapping[str, np.ndarray]] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    n_samples: int = 1,
    tolerances: Tolerances | None = None,
    policy: str = "strict",
    metrics: Any = None,
) -> Comparison:
    """Run two models (or one model on two providers) on the same inputs and compare them.

    With ``model_b``: both run on ``providers`` (a chain, default CPU). Without it,
    ``providers`` must name two providers: the first is the reference, the second the test,
    each loaded with ``policy`` (strict by default, so a silent fallback cannot make the
    comparison compare CPU with CPU). ``metrics``: ``--metric`` overrides of the gate metric
    (``measure.metrics.MetricOverrides.parse`` reads them); the rest is chosen on evidence from
    the reference model and the folder it sits in.
    """
    from ortpilot.graph.feeds import generate_samples, plan_feeds, refuse_all_empty
    from ortpilot.session import load

    providers = list(providers or [])
    if model_b is None:
        if len(providers) != 2:
            raise UsageError(
                "Comparing one model needs exactly two providers (-p REFERENCE -p TEST), "
                f"got {len(providers) or 'none'}; or pass a second model."
            )
        sess_a = load(model_a, [providers[0]], policy, placement=False)
        sess_b = load(model_a, [providers[1]], policy, placement=False)
        labels = (f"{_label(model_a)} on {providers[0]}", f"{_label(model_a)} on {providers[1]}")
    else:
        sess_a = load(model_a, providers or None, policy, placement=False)
        sess_b = load(model_b, providers or None, policy, placement=False)
        labels = (_label(model_a), _label(model_b))
    described = ""
    if samples is None:
        plan = plan_feeds(sess_a.model, shapes)
        samples = generate_samples(sess_a.model, max(1, n_samples), plan=plan)
        described = plan.describe()
    if tolerances is not None:
        tolerances.check_outputs([o.name for o in sess_a.model.graph.output])
    samples = [sess_a.check_feeds(s) for s in samples]
    refuse_all_empty(samples, "the comparison", "input set(s)")
    user = MetricOverrides.parse(metrics)
    choices = choose_metrics(sess_a.model, folder_near(sess_a.model_path), user)
    reference = run_samples(sess_a, samples)
    choices = observed_choices(sess_a.model, choices, user, reference)
    return compare_runs(
        reference,
        run_samples(sess_b, samples),
        tolerances,
        reference=labels[0],
        test=labels[1],
        inputs=described,
        choices=choices,
        samples=samples,
    )


def observed_choices(
    model: Any, choices: Mapping[str, MetricChoice], user: MetricOverrides, reference: Runs
) -> dict[str, MetricChoice]:
    """Each output's metric re-made from what the model returned on the samples (``reference``), as the
    tune's gate makes it: a declared shape the outputs contradict gives way to the actual one, and class
    scores over steps get ``ctc``. The user's ``--metric`` stays as given."""
    from ortpilot.graph.outputs import output_facts

    declared = {f.name: f for f in output_facts(model)}
    out = dict(choices)
    for name, choice in choices.items():
        if user.get(name) is None and reference and all(name in r for r in reference):
            out[name] = choose_from_outputs(name, [r[name] for r in reference], declared.get(name), choice)
    return out


def _label(model: Any) -> str:
    return "<in-memory model>" if hasattr(model, "graph") else str(model)


__all__ = [
    "METRIC_DESCRIPTIONS",
    "Comparison",
    "MetricChoice",
    "OutputStats",
    "Tolerances",
    "choose_metric",
    "choose_metrics",
    "compare_arrays",
    "compare_models",
    "compare_runs",
    "metric_error",
    "run_samples",
]
