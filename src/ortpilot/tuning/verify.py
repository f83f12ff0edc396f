"""Re-verify a tune profile on this machine: the session it names, the outputs it recorded, and
(on request) the speedup it promised.

``load_profile`` proves the environment (model hash, ORT build, providers, placement, the
machine). This adds the outputs: the profile's winner, run on the reference input sample the
tune kept (``reference.npz`` beside ``profile.json``), must give what it gave there. Bit for
bit is only a fair demand where the same kernels run (same ORT version, CPU architecture,
kernel-choosing ISA flags and INT8 exactness): there each output's sha256 must match. Elsewhere
ORT's kernels legitimately round differently, so each output is compared with the recorded
one by the tune's own gate metric and limit, and the result says which check it was.

With ``bench`` or ``max_slowdown_pct`` the profile's session and ORT's default session (on the tune's
source model) are timed interleaved in this process, and the speedup (the ratio of the two p50s) is held
to the profile's headline by one rule (``tuning.reproduction``): ``reproduced`` at 0.9 of it or more,
never with a CI entirely below 1; with ``max_slowdown_pct`` the check fails when even the CI's upper end
is below the headline divided by 1 + PCT/100 (slower than promised by more than PCT, beyond the noise).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ortpilot.artifacts.bundle import bundle_path
from ortpilot.artifacts.profile import profile_file
from ortpilot.eps import CPU_EP
from ortpilot.errors import UsageError, VerificationError
from ortpilot.gate.outputs import OutputGate
from ortpilot.graph.outputs import mask_input
from ortpilot.measure.metrics import (
    METRIC_DESCRIPTIONS,
    MetricChoice,
    choose_metrics,
    needs_mask,
)
from ortpilot.session.binding import run_session
from ortpilot.session.bundle import BundleChoice, choose_profile
from ortpilot.session.profile import load_profile
from ortpilot.session.verified import VerifiedSession
from ortpilot.tuning.machinestates import state_of
from ortpilot.tuning.reference import REFERENCE_FILE, array_digest, read_reference, reference_feeds
from ortpilot.tuning.reproduction import SpeedupVerdict, ms_text
from ortpilot.tuning.result import STATE_CAUSES, state_changed

LATENCY_DURATION_S = 8.0  # the interleaved timing of profile vs default, both together


@dataclass
class LatencyCheck:
    """The speedup over ORT's default measured here, held to the profile's headline by one rule
    (``tuning.reproduction``); a gate only with ``max_slowdown_pct`` (``verify --max-slowdown``), a
    reproduction figure without (``verify --bench``)."""

    recorded: float  # the profile's headline: latency.speedup_vs_default.ratio
    ratio: float  # ORT's default's p50 / the profile's p50, here
    ci_low: float  # its 95% CI (paired block bootstrap over the interleaved rounds)
    ci_high: float
    max_slowdown_pct: float | None
    default_p50_ms: float
    profile_p50_ms: float
    recorded_default_p50_ms: float | None = None  # ORT's default in the tune's final measurement
    # the machine state (tuning.machinestates) nearest this run's, where the tune saw two, and the tune's
    # figure in it: context for a figure that differs from the headline, never what the verdict holds to
    state: str | None = None
    state_speedup: float | None = None
    # the tune saw two states but timed the winner only in the other one than this run's: its figure here is unknown
    untimed_state: str | None = None
    # where the timed turns ran the calling thread: off the CPUs ORT's default pinned its pool threads to
    # (measure.placement, as in the tune); None where there was no such choice
    caller_cpus: list[int] | None = None
    default_ships: bool = False  # the profile is ORT's default session (the tune's ``default_best``)

    @property
    def verdict(self) -> SpeedupVerdict:
        """The figures as printed and the verdict on them."""
        return SpeedupVerdict.of(
            self.default_p50_ms,
            self.profile_p50_ms,
            self.ci_low,
            self.ci_high,
            self.recorded,
            max_slowdown_pct=self.max_slowdown_pct,
            default_ships=self.default_ships,
        )

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    @property
    def share(self) -> float:
        """The speedup measured here as a share of the headline (1.0: reproduced exactly), as printed."""
        return self.verdict.share

    @property
    def machine_speed(self) -> float | None:
        """How much faster ORT's default runs here than in the tune (1.0: the same; None: not recorded)."""
        if not self.recorded_default_p50_ms or not self.default_p50_ms:
            return None
        return self.recorded_default_p50_ms / self.default_p50_ms

    @property
    def state_note(self) -> str:
        """One clause when ORT's default ran at another speed here than in the tune, else ""."""
        speed = self.machine_speed
        if speed is None or not state_changed(speed):
            return ""
        return (
            f"ORT's default ran {ms_text(self.recorded_default_p50_ms)} ms in the tune and "
            f"{ms_text(self.default_p50_ms)} ms here: the machine was in another state ({STATE_CAUSES}), and a "
            "speedup can differ between states; compare figures taken in the same one"
        )

    @property
    def detail(self) -> str:
        verdict = self.verdict
        parts = [verdict.figures, verdict.why]
        if self.state and self.state_speedup is not None:
            parts.append(
                f"the tune recorded {self.state_speedup:.2f}x in the machine state nearest this one ({self.state}); "
                "the verdict holds to the headline"
            )
        if self.state_note:
            parts.append(self.state_note)
        if self.untimed_state:
            parts.append(
                f"ORT's default ran here as in the tune's {self.untimed_state} state, where the tune never "
                "timed the profile beside it"
            )
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.verdict.to_dict(),
            "max_slowdown_pct": self.max_slowdown_pct,
            "recorded_default_p50_ms": self.recorded_default_p50_ms,
            "machine_speed": self.machine_speed,
            "state": self.state,
            "state_speedup": self.state_speedup,
            "untimed_state": self.untimed_state,
            "caller_cpus": self.caller_cpus,
            "passed": self.passed,
            "detail": self.detail,
        }


@dataclass
class OutputCheck:
    name: str
    passed: bool
    detail: str
    metric: str = ""
    error: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "detail": self.detail,
            "metric": self.metric,
            "error": self.error,
        }


MISSING = "reference missing"  # the profile names a reference sample that is not beside it: a failure


@dataclass
class ProfileVerification:
    """What ``verify_profile`` found: the session, how the machine compares, and the outputs."""

    profile: str
    session: VerifiedSession
    mode: str  # "bit-exact" | "tolerance" | "not checked" | MISSING
    why: str
    outputs: list[OutputCheck] = field(default_factory=list)
    latency: LatencyCheck | None = None
    bundle: BundleChoice | None = None  # which class's profile a bundle gave (None for a profile.json)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs) and (self.latency is None or self.latency.passed)

    def failure(self) -> VerificationError | None:
        """The error to raise (exit 1) when an output was not reproduced, else None."""
        if self.passed:
            return None
        if self.mode == MISSING:
            return VerificationError(
                f"Profile '{self.profile}': {self.why}, so its outputs cannot be checked. Copy the tune's whole "
                "output folder (or bundle) with it, or re-run 'ortpilot tune'."
            )
        if not all(o.passed for o in self.outputs):
            failed = "; ".join(f"{o.name}: {o.detail}" for o in self.outputs if not o.passed)
            return VerificationError(
                f"Profile '{self.profile}' does not reproduce its reference outputs ({self.mode} "
                f"check: {failed}). The model, ORT build or machine changed what it computes; "
                "re-run 'ortpilot tune' here."
            )
        return VerificationError(
            f"Profile '{self.profile}' is slower than it was tuned: {self.latency.detail}. "
            "The machine, its load or the ORT build changed; re-run 'ortpilot tune' here."
        )

    def to_dict(self) -> dict[str, Any]:
        check = getattr(self.session, "machine_check", None)
        return {
            "profile": self.profile,
            "passed": self.passed,
            "providers": self.session.providers,
            "placement": self.session.placement.to_dict() if self.session.placement else None,
            "machine": check.to_dict() if check else None,
            "reference": {"mode": self.mode, "why": self.why, "outputs": [o.to_dict() for o in self.outputs]},
            "latency": self.latency.to_dict() if self.latency else None,
            "bundle": self.bundle.to_dict() if self.bundle else None,
            "warmed": warmed.to_dict() if (warmed := getattr(self.session, "warmed", None)) else None,
        }


def verify_profile(
    path: str | os.PathLike,
    policy: str = "strict",
    *,
    accept_machine: bool = False,
    max_slowdown_pct: float | None = None,
    bench: bool = False,
    duration_s: float = LATENCY_DURATION_S,
    intra_op_threads: int | None = None,
    optimized: bool = False,
    machine_class: str | None = None,
    node_cpus: int | None = None,
    check_all: bool = False,
) -> ProfileVerification:
    """Load ``path`` with ``load_profile`` (its errors raise) and reproduce its reference outputs.

    ``path`` may be a bundle: the profile of this machine's class (``session.bundle.choose_profile``
    with ``machine_class``, ``node_cpus`` and ``accept_machine``) is verified, and with ``check_all``
    the files of every class are checked against bundle.json first.

    The result says which check ran and whether each output held; ``result.failure()`` is the
    VerificationError to raise when one did not. ``max_slowdown_pct`` adds the latency check; ``bench``
    times it too, as a figure beside the recorded one, not a gate.
    ``intra_op_threads`` and ``optimized`` go to ``load_profile`` (a serving replica verifies the
    session it will serve with, on its own CPUs).
    """
    choice = None
    if machine_class is not None and bundle_path(path) is None:
        raise UsageError(
            f"machine_class {machine_class!r} (--class) picks one class's profile in a bundle (what 'ortpilot tune "
            f"--ray' writes), and '{path}' is a single profile, of one class. Leave it out."
        )
    if bundle_path(path) is not None:
        choice = choose_profile(
            path,
            policy=policy,
            machine_class=machine_class,
            node_cpus=node_cpus,
            accept_machine=accept_machine,
            check_all=check_all,
        )
        path = choice.profile
    path = profile_file(path)
    if max_slowdown_pct is not None:
        from ortpilot.measure.regression import check_max_slowdown

        max_slowdown_pct = check_max_slowdown(max_slowdown_pct)
    if max_slowdown_pct is not None or bench:  # a bad --duration before the profile loads, named
        from ortpilot.measure.options import check_budget

        try:
            check_budget(None, duration_s, "auto")
        except UsageError as exc:
            raise UsageError(f"--duration: {exc}") from None
    result = _verify_outputs(path, policy, accept_machine, intra_op_threads, optimized)
    result.bundle = result.session.bundle = choice
    if max_slowdown_pct is not None or bench:
        result.latency = check_latency(result.session, path, max_slowdown_pct, duration_s)
    return result


def _verify_outputs(
    path: Path, policy: str, accept_machine: bool, intra_op_threads: int | None = None, optimized: bool = False
) -> ProfileVerification:
    session = load_profile(
        path, policy, accept_machine=accept_machine, intra_op_threads=intra_op_threads, optimized=optimized
    )
    doc = session.profile
    if doc.get("text"):  # a text profile's tokenizer is part of what it serves: the recorded one, unchanged
        from ortpilot.session.text import text_task_of_profile

        text_task_of_profile(doc, path)
    reference = doc.get("reference_outputs") or {}
    file = path.parent / str(reference.get("file") or REFERENCE_FILE)
    if reference.get("file") and not file.is_file():  # a failed row, so the other PROFILES are still checked
        return ProfileVerification(
            str(path),
            session,
            MISSING,
            f"the profile names its reference sample ({file.name}, reference_outputs.file) and it is missing",
            [OutputCheck(name, False, f"{file.name} is missing") for name in reference.get("sha256") or {file.name: 0}],
        )
    if not reference or not file.is_file():
        return ProfileVerification(
            str(path),
            session,
            "not checked",
            (
                f"the profile keeps no reference sample ({file.name} is missing): only the environment was verified; "
                "re-run 'ortpilot tune' to record one"
            ),
        )
    inputs, recorded = read_reference(file)
    got = run_session(session, session.check_feeds(inputs), iobinding=bool(doc.get("iobinding")))
    check = session.machine_check
    same_ort = str((doc.get("onnxruntime") or {}).get("version")) == ort.__version__
    if check.same_kernels and same_ort:
        expected = reference.get("sha256") or {name: array_digest(value) for name, value in recorded.items()}
        outputs = [
            OutputCheck(
                name,
                array_digest(got[name]) == digest if name in got else False,
                "identical bytes"
                if name in got and array_digest(got[name]) == digest
                else "differs from the recorded output",
            )
            for name, digest in expected.items()
        ]
        result = ProfileVerification(
            str(path),
            session,
            "bit-exact",
            (
                "same ORT version and the same kernels (CPU architecture, ISA flags, INT8 exactness) as the tune: "
                "outputs must match bit for bit"
            ),
            outputs,
        )
    else:
        accuracy = doc.get("accuracy") or {}
        limit = float(accuracy.get("max_error", 0.01))
        gate = OutputGate(limit, _recorded_choices(session, accuracy), [inputs])
        checked = gate.check({n: [v] for n, v in recorded.items()}, {n: [v] for n, v in got.items()})
        outputs = [
            OutputCheck(c.name, False, "missing or of another shape")
            if c.note
            else OutputCheck(
                c.name,
                c.passed,
                f"{c.metric} error {c.value:.3g} {'<=' if c.passed else '>'} {limit:g}",
                c.metric,
                c.value,
            )
            for c in checked.checks
        ]
        why = (
            "another ORT version"
            if not same_ort
            else f"other kernels than the tune's machine ({check.recorded} vs {check.here})"
        )
        result = ProfileVerification(
            str(path),
            session,
            "tolerance",
            (
                f"{why}: bit-exact outputs are not expected, so each output is held to the tune's gate "
                f"(max error {limit:g}) against the recorded one"
            ),
            outputs,
        )
    return result


def _recorded_choices(session: VerifiedSession, accuracy: dict[str, Any]) -> dict[str, MetricChoice]:
    """The metric the tune's gate held each output to, as its profile recorded it; the mask input a masked
    metric reads is the model's own. Outputs the profile records no metric for get today's choice."""
    choices = choose_metrics(session.model)
    mask = mask_input(session.model)
    for o in accuracy.get("outputs") or []:
        if isinstance(o, dict) and o.get("name") in choices and o.get("metric") in METRIC_DESCRIPTIONS:
            metric = o["metric"]
            choices[o["name"]] = MetricChoice(
                metric, "recorded by the tune", mask.name if mask and needs_mask(metric) else None
            )
    return choices


def check_latency(
    session: VerifiedSession, path: Path, max_slowdown_pct: float | None, duration_s: float = LATENCY_DURATION_S
) -> LatencyCheck:
    """Time the profile's session and ORT's default session on the source model, interleaved."""
    from ortpilot.measure.interleave import BenchConfig, bench_interleaved
    from ortpilot.modelio import file_sha256
    from ortpilot.providers.cpubudget import default_threads_in_budget
    from ortpilot.session import SessionSettings
    from ortpilot.tuning.budget import SETTLE_S

    doc = session.profile
    tuned = (doc.get("latency") or {}).get("speedup_vs_default") or {}
    recorded = tuned.get("ratio")
    if not isinstance(recorded, (int, float)) or not recorded > 0:
        raise UsageError(
            f"Profile '{path}' records no speedup over ORT's default (latency.speedup_vs_default), so "
            "--max-slowdown and --bench have nothing to hold it to; re-run 'ortpilot tune' to record one."
        )
    source = Path(str((doc.get("source_model") or {}).get("path") or ""))
    if not source.is_file() or file_sha256(source) != (doc.get("source_model") or {}).get("sha256"):
        raise UsageError(
            f"--max-slowdown and --bench time the profile against ORT's default session on the model it was "
            f"tuned from, and that model ('{source}') is missing here or changed. Copy it to that path, or "
            "verify without them."
        )
    if doc.get("outputs"):  # the tune timed ORT's default on the source pruned to its outputs
        from ortpilot.tuning.pruned import pruned_model

        source = pruned_model(source, list(doc["outputs"]))
    feeds = _timed_requests(doc, path)
    providers = [(p["name"], dict(p.get("options") or {})) for p in doc["providers"]]
    configs = [
        BenchConfig(  # capped at this process's CPUs where ORT's default pool would take others (as the tune did)
            "ORT default",
            str(source),
            [CPU_EP],
            SessionSettings(intra_op_threads=default_threads_in_budget()),
            feeds=feeds,
        ),
        BenchConfig(
            "profile",
            str(session.model_path),
            providers,
            session.settings,
            feeds=feeds,
            iobinding=bool(doc.get("iobinding")),
        ),
    ]
    # each turn settled as in the tune's final: the idle pool of the session before it spins for tens of ms
    comparison = bench_interleaved(configs, duration_s=duration_s, policy="strict", settle_s=SETTLE_S)
    ratio = comparison.ratios[0]  # profile / default latency: pooled is the ratio of the two p50s printed
    default, profile = (r.stats.p50 * 1e3 for r in comparison.results)
    baseline = (doc.get("latency") or {}).get("baseline") or {}
    recorded_default = baseline.get("p50_ms") if isinstance(baseline.get("p50_ms"), (int, float)) else None
    # a tune that saw the machine in two states recorded the speedup in each: named beside the verdict as
    # context, while the verdict holds to the headline
    by_state = tuned.get("by_state") or {}
    state = state_of(default, {s: f["default_p50_ms"] for s, f in by_state.items()}) if len(by_state) == 2 else None
    state_speedup = by_state[state].get("speedup") if state else None
    seen = tuned.get("states_seen_ms") or {}
    nearest = state_of(default, seen) if len(seen) == 2 else None
    untimed = nearest if nearest and nearest not in by_state else None
    return LatencyCheck(
        float(recorded),
        default / profile,
        1 / ratio.pooled_high,
        1 / ratio.pooled_low,
        max_slowdown_pct,
        default,
        profile,
        float(recorded_default) if recorded_default else None,
        state,
        float(state_speedup) if isinstance(state_speedup, (int, float)) else None,
        untimed,
        comparison.environment.get("caller_cpus"),
        bool(doc.get("default_best")),
    )


def _timed_requests(doc: dict[str, Any], path: Path) -> Any:
    """What the tune timed: the workload's replay set (``workload.npz``) where its requests differ in size, else
    the reference sample (or, without one, the sample regenerated from the profile's seed)."""
    from ortpilot.graph.feeds import read_samples

    workload = doc.get("workload") or {}
    replay = path.parent / str(workload.get("file") or "")
    if workload.get("file") and not replay.is_file():
        raise UsageError(
            f"The profile was tuned on the requests in '{replay}', which is missing: verify --bench replays them "
            "to check the headline (any other input would time another mix of sizes). Copy the tune's OUTDIR "
            "whole, or re-tune."
        )
    if workload.get("file"):
        from ortpilot.modelio import file_sha256

        if file_sha256(replay) != workload.get("file_sha256"):
            raise UsageError(
                f"'{replay}' is not the workload this profile was tuned on (its sha256 differs from the profile's "
                "workload.file_sha256): it was changed or replaced. Copy the tune's OUTDIR again, or re-tune."
            )
        return read_samples(replay)
    file = path.parent / str((doc.get("reference_outputs") or {}).get("file") or REFERENCE_FILE)
    return read_reference(file)[0] if file.is_file() else reference_feeds(doc)


__all__ = [
    "REFERENCE_FILE",
    "LatencyCheck",
    "OutputCheck",
    "ProfileVerification",
    "check_latency",
    "read_reference",
    "verify_profile",
]
