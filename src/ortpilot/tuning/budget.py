"""The tune's clock: what is left, what the final measurement keeps, what a step is expected to cost.

The deadline excludes the time for writing the outputs. Out of what is left, enough is kept for
the final interleaved measurement of three candidates (leader, runner-up, ORT's default), so no
screening or halving step may eat it: a step runs only when ``affords`` says its estimate fits,
and a candidate's worker is stopped at the reserve. Estimates come from what was measured: the
preparation times so far and the default session's latency. A model variant's preparation is
estimated before it runs (``prepare_estimate``): from the model's size, the calibration and gate
samples and the default session's latency (``PrepCosts``, measured), scaled by how the variants
prepared so far in this tune compared with their estimates. The clock is injected (``clock``), so
the policy is tested without timing the machine.

Replaying an ended search (``binding=False``) is decided by the journal, not the clock: the
budget then affords everything, and the step runner cuts what the journal lacks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortpilot.quantmodes import CALIBRATED_MODES, DYNAMIC

OUTPUT_RESERVE_S = 5.0  # writing the model, profile and reports (matplotlib) after the search
CANDIDATE_TIMEOUT_S = 600.0  # a candidate's child that takes longer is taken to hang
FINAL_ROUNDS = 8
FINAL_MIN_RUNS = 2  # per candidate per final round
FINAL_MIN_ROUNDS = 4  # the final shrinks to this when time is short (slow models, small budgets)
SAFETY = 1.3  # estimates are scaled by this much
# Untimed runs at the start of each finalist's turn in the final (and of verify --bench's turns): the
# session before it keeps spinning its thread pool after its last run, which doubled the first 2-3 runs
# of every 5-run turn on a 2-core CPU and made ORT's default "win" against 1.3x faster candidates. The
# spin measured 30-32 ms of a pool thread's CPU per run (ORT's default and an intra=2 session, the demo
# encoder and CNN, runs 40-100 ms apart; BENCHMARKS.md "ORT's default timed at its faster placement").
SPIN_S = 0.03  # a search bench whose every turn settled this long reads the machine's state (search.PairedBench)
SETTLE_S = 0.05
# A screening or halving bench times its candidate round-robin with ORT's default session (the
# search's anchor) in this many rounds; each turn settles like the final's, with at most this share
# of the runs it times (a small model's screen would otherwise be mostly settling).
PAIRED_ROUNDS = 2
PAIRED_SETTLE_SHARE = 0.25
# The anchor times a quarter of the candidate's runs per turn (at least this many): ORT's default is
# often the slowest session of all (2-4x a demo candidate), and its median needs fewer runs than a leader's.
PAIRED_ANCHOR_SHARE = 0.25
PAIRED_ANCHOR_MIN_RUNS = 3


# A model variant's preparation, measured with benchmarks/bench_prep_time.py (the tune's own worker preparing each
# INT8 step in a fresh model cache; AMD EPYC, 2 CPUs, load average 1.5, 2026-12-05):
#   PP-OCRv6 det small (9.5 MB, default 16.8-24 ms at 480x480) and NudeNet 320n (11.6 MB, 5.6-8 ms):
#   - the quantizer's model preparation, once per model: 1.0-1.2 s, 0.09-0.12 s per MB;
#   - a quantization step on it: 0.02-0.15 s per MB (dynamic 0.2 s, QDQ 0.8-1.1 s, full 1.3-1.4 s for 10-12 MB);
#   - calibration (static, QDQ, full): 42-50 ms (det) and 10-14 ms (NudeNet) per calibration sample, 1.9-3.0x the
#     default's latency (64 samples against 8: QDQ 3.75 s against 1.4 s on the det);
#   - the gate's held-out runs: dynamic INT8 (ConvInteger) on a conv net ran them 12-25x slower than the default
#     (16 samples: 3.4 s on the det, 2.2 s on NudeNet), QDQ ones about 1.5x;
#   - the 2-3 MB demo encoder and Magika: 0.1-0.35 s a step, the default's session 0.3-0.5 s.
# Issue 48 saw 13-30 s per INT8 preparation of a 416x416 detector calibrated on 72 real
# images: the calibration term (72 samples x 2-3 latencies) dominates there.
PREPARE_S_PER_MB = 0.12
QUANTIZE_S_PER_MB = 0.15
CALIBRATION_LATENCIES = 3.0  # per calibration sample
GATE_LATENCIES = 2.0  # per held-out sample, a variant as fast as the default or up to 2x slower
GATE_LATENCIES_CONV_DYNAMIC = 25.0  # per held-out sample, dynamic INT8 on a conv net


@dataclass(frozen=True)
class PrepCosts:
    """What a model variant's preparation time is estimated from: the model's size and the samples it runs."""

    model_mb: float
    calibration: int  # calibration samples (static, QDQ and full run every one)
    heldout: int  # held-out samples every candidate's outputs are computed on
    conv_heavy: bool = False

    def estimate(
        self, steps: Sequence[Any], session_s: float, latency: float, built: Sequence[Sequence[Any]] = ()
    ) -> tuple[float, str]:
        """(seconds, basis in words) for a candidate with pass ``steps`` (``passes.registry.Step``): ``session_s``
        (a session and its held-out outputs, as ORT's default measured) plus each step's rewrite, calibration and
        slower gate runs (module constants). ``built``: the pipelines whose models the model cache holds, with their
        prefixes (and the quantizer's preparation of each; a pipeline ending in a ``prepare`` step holds that
        preparation alone), which cost nothing again."""
        steps = list(steps)
        done = max((_common(steps, b) for b in built), default=0)
        if done == len(steps):
            return session_s, "its model is built already: one session"
        seconds, parts = session_s, []
        mb = self.model_mb
        for i, step in enumerate(steps[done:], done):
            name, mode = step.name, step.get("mode")
            if name in ("quantize", "openvino_int8"):
                prepared = name == "quantize" and any(
                    _common(steps[:i], b) == i and len(b) > i and b[i].name in ("quantize", "prepare") for b in built
                )
                seconds += (0.0 if prepared else PREPARE_S_PER_MB * mb) + QUANTIZE_S_PER_MB * mb
                parts.append(f"{mb:.0f} MB to quantize" if prepared else f"{mb:.0f} MB to prepare and quantize")
                if name == "openvino_int8" or mode in CALIBRATED_MODES:
                    seconds += self.calibration * CALIBRATION_LATENCIES * latency
                    parts.append(f"{self.calibration} calibration samples")
                if name == "quantize" and mode == DYNAMIC and self.conv_heavy:
                    seconds += self.heldout * GATE_LATENCIES_CONV_DYNAMIC * latency
                    parts.append("held-out runs of a dynamic-INT8 conv net")
                else:
                    seconds += self.heldout * (GATE_LATENCIES - 1) * latency
            else:  # fusion, decoder fusion, weight-only: a rewrite of the graph, like a quantization step
                seconds += QUANTIZE_S_PER_MB * mb
                parts.append(f"{mb:.0f} MB to rewrite")
        return seconds, ", ".join(dict.fromkeys(parts))


def _common(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading steps two pipelines share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Budget:
    """Seconds left before ``deadline`` (a ``clock`` value, ``time.monotonic`` unless a test gives its own), and
    the estimates that spend them."""

    def __init__(
        self,
        deadline: float,
        *,
        binding: bool = True,
        clock: Callable[[], float] = time.monotonic,
        costs: PrepCosts | None = None,
        after_final: Callable[[float], float] | None = None,
    ) -> None:
        self.deadline = deadline
        # seconds the steps after the final need (the other batch sizes' timings), from the default's latency
        self.after_final = after_final
        self.binding = binding
        self.clock = clock
        self.costs = costs  # None: variants are estimated like sessions (the median preparation so far)
        self.latency = 0.01  # ORT's default session's p50 (s) of a timed run (the replay set), once measured
        # ... and of one sample, as a calibration or held-out run has it (``Search`` sets both)
        self.sample_latency = 0.01
        self.prep_times: list[float] = []
        self.session_times: list[float] = []  # preparations of candidates without passes (ORT's default first)
        self.ratios: list[float] = []  # measured / estimated, each model variant prepared so far
        # The final as it stands (``Search``): one run of each likely finalist, and the seconds to create again the
        # sessions of those the worker let go (it loads them before the final's plan is made)
        self.final_per_run: float | None = None
        self.final_scale = 1.0  # a run of the final over a run of the search (a batch size's every call over 4)
        self.reload_s = 0.0

    def left(self) -> float:
        return self.deadline - self.clock()

    def spent(self) -> bool:
        return self.binding and self.left() <= 0

    def est_prepare(self) -> float:
        return float(np.median(self.prep_times)) if self.prep_times else 2.0

    def est_session(self) -> float:
        """A candidate without passes: its session and held-out outputs, as those measured so far took."""
        return float(np.median(self.session_times)) if self.session_times else self.est_prepare()

    def prepare_estimate(self, steps: Sequence[Any], built: Sequence[Sequence[Any]] = ()) -> tuple[float, str]:
        """(seconds, basis) a candidate with pass ``steps`` is expected to take to prepare: a session's time without
        steps (or with steps whose model is ``built`` already); else ``PrepCosts.estimate`` scaled by the median
        measured / estimated ratio of the variants prepared so far in this tune (build times vary more between
        machines and model caches than between variants)."""
        if not steps:
            return self.est_session(), "one session, as the sessions so far took"
        if self.costs is None:
            return self.est_prepare(), "the median preparation so far"
        seconds, basis = self.costs.estimate(steps, self.est_session(), self.sample_latency, built)
        if self.ratios and seconds > self.est_session():
            ratio = float(np.median(self.ratios))
            return seconds * ratio, f"{basis}; x{ratio:.2f}, as the {len(self.ratios)} variant(s) prepared so far ran"
        return seconds, basis

    def record_prepare(self, steps: Sequence[Any], seconds: float, built: Sequence[Sequence[Any]] = ()) -> None:
        """A preparation that ran (``steps``: its passes; ``built``: the pipelines built before it): it refines the
        estimates of those after it."""
        self.prep_times.append(seconds)
        if not steps:
            self.session_times.append(seconds)
        elif self.costs is not None:
            base, _ = self.costs.estimate(steps, self.est_session(), self.sample_latency, built)
            if base > self.est_session():  # a build, not a session on a model built already
                self.ratios.append(max(0.05, min(20.0, seconds / max(base, 1e-6))))

    def after_final_s(self) -> float:
        """Seconds kept after the final for the steps that follow it (0 without them, or replaying a journal)."""
        return float(self.after_final(self.latency)) if self.after_final is not None and self.binding else 0.0

    def reserve(self) -> float:
        """Time kept for the final interleaved measurement of three candidates: its shortest plan (at the likely
        finalists' latencies, three times the default's until they are known) and their sessions' reloads;
        and the time the steps after it need (``after_final``)."""
        per_run = self.final_per_run or 3 * self.latency * self.final_scale
        return (
            (FINAL_MIN_ROUNDS * FINAL_MIN_RUNS + 2) * per_run * SAFETY
            + FINAL_MIN_ROUNDS * 3 * SETTLE_S
            + 1.0
            + self.reload_s
            + self.after_final_s()
        )

    def keep(self, seconds: float) -> None:
        """Keep ``seconds`` more after the search (writing the outputs of a model that takes longer to write)."""
        self.deadline -= max(0.0, seconds)

    def affords(self, seconds: float) -> bool:
        """Whether a step expected to take ``seconds`` fits before the reserve."""
        return not self.binding or self.left() - self.reserve() >= seconds

    def candidate_timeout(self, baseline: bool, extra: float = 0.0) -> float:
        """A candidate may not eat the final measurement's time: its worker is stopped at that point, ``extra``
        seconds sooner (what the stop itself costs the final: sessions created again); the baseline, measured
        first, may use everything. Capped at ``CANDIDATE_TIMEOUT_S``, which alone reads as a hang."""
        left = max(1.0, self.left()) if baseline else max(1.0, self.left() - self.reserve() - extra)
        return min(left, CANDIDATE_TIMEOUT_S)

    def final_plan(self, per_run: float, screen_runs: int, finalists: int = 3) -> tuple[int, int]:
        """(runs per candidate per round, rounds) of the final that fit in what is left;
        ``per_run``: one run of every finalist (each turn also settles for ``SETTLE_S``)."""
        per_run *= SAFETY
        settle = FINAL_ROUNDS * finalists * SETTLE_S
        left = self.left() - self.after_final_s()  # what the steps after the final keep is not the final's
        budget_runs = max(0.0, left - 1.0 - settle) / max(per_run, 1e-9) - 2  # less the warm-up
        rounds = FINAL_ROUNDS if budget_runs >= FINAL_ROUNDS * FINAL_MIN_RUNS else FINAL_MIN_ROUNDS
        return max(FINAL_MIN_RUNS, min(screen_runs * 2, int(budget_runs / rounds))), rounds


def paired_runs_cost(runs: int, latency: float, anchor_latency: float) -> float:
    """``runs`` timed runs of a candidate, the anchor's runs beside them, and their settle runs."""
    per_turn = max(1, math.ceil(runs / PAIRED_ROUNDS))
    anchor = PAIRED_ROUNDS * paired_anchor_runs(per_turn)
    return (runs * latency + anchor * anchor_latency) * (1 + PAIRED_SETTLE_SHARE)


def paired_anchor_runs(runs_per_turn: int) -> int:
    """The anchor's timed runs in a turn of a bench beside it."""
    return max(PAIRED_ANCHOR_MIN_RUNS, math.ceil(runs_per_turn * PAIRED_ANCHOR_SHARE))


def paired_settle_max(runs_per_turn: int) -> int:
    """The most untimed runs a turn of a bench beside the anchor starts with."""
    return max(1, int(runs_per_turn * PAIRED_SETTLE_SHARE))


__all__ = [
    "CALIBRATION_LATENCIES",
    "CANDIDATE_TIMEOUT_S",
    "FINAL_MIN_ROUNDS",
    "FINAL_MIN_RUNS",
    "FINAL_ROUNDS",
    "GATE_LATENCIES",
    "GATE_LATENCIES_CONV_DYNAMIC",
    "PAIRED_ANCHOR_MIN_RUNS",
    "PAIRED_ANCHOR_SHARE",
    "PAIRED_ROUNDS",
    "PAIRED_SETTLE_SHARE",
    "PREPARE_S_PER_MB",
    "QUANTIZE_S_PER_MB",
    "SETTLE_S",
    "SPIN_S",
    "Budget",
    "PrepCosts",
    "paired_anchor_runs",
    "paired_runs_cost",
    "paired_settle_max",
]
