"""The tune's clock: what is left, what the final measurement keeps, what a step is expected to cost.

The deadline excludes the time for writing the outputs. Out of what is left, enough is kept for
the final interleaved measurement of three candidates (leader, runner-up, ORT's default), so no
screening or halving step may eat it: a step runs only when ``affords`` says its estimate fits,
and a candidate's worker is stopped at the reserve. Estimates come from what was measured: the
median preparation time so far and the default session's latency.

Replaying an ended search (``binding=False``) is decided by the journal, not the clock: the
budget then affords everything, and the step runner cuts what the journal lacks.
"""

from __future__ import annotations

import math
import time

import numpy as np

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


class Budget:
    """Seconds left before ``deadline`` (a ``time.monotonic`` value), and the estimates that spend them."""

    def __init__(self, deadline: float, *, binding: bool = True) -> None:
        self.deadline = deadline
        self.binding = binding
        self.latency = 0.01  # ORT's default session's p50 (s), once measured
        self.prep_times: list[float] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def spent(self) -> bool:
        return self.binding and self.left() <= 0

    def est_prepare(self) -> float:
        return float(np.median(self.prep_times)) if self.prep_times else 2.0

    def reserve(self) -> float:
        """Time kept for the final interleaved measurement of three candidates."""
        return (
            (FINAL_MIN_ROUNDS * FINAL_MIN_RUNS + 2) * 3 * self.latency * SAFETY + FINAL_MIN_ROUNDS * 3 * SETTLE_S + 1.0
        )

    def affords(self, seconds: float) -> bool:
        """Whether a step expected to take ``seconds`` fits before the reserve."""
        return not self.binding or self.left() - self.reserve() >= seconds

    def screen_cost(self, runs: int) -> float:
        """A new candidate: its preparation and ``runs`` timed runs (models are slower than the default),
        with as many runs of the anchor beside them."""
        return self.est_prepare() + paired_runs_cost(runs, self.latency * 3, self.latency)

    def candidate_timeout(self, baseline: bool) -> float:
        """A candidate may not eat the final measurement's time: its worker is stopped at that point
        (the baseline, measured first, may use everything)."""
        left = max(1.0, self.left()) if baseline else max(1.0, self.left() - self.reserve())
        return min(left, CANDIDATE_TIMEOUT_S)

    def final_plan(self, per_run: float, screen_runs: int, finalists: int = 3) -> tuple[int, int]:
        """(runs per candidate per round, rounds) of the final that fit in what is left;
        ``per_run``: one run of every finalist (each turn also settles for ``SETTLE_S``)."""
        per_run *= SAFETY
        settle = FINAL_ROUNDS * finalists * SETTLE_S
        budget_runs = max(0.0, self.left() - 1.0 - settle) / max(per_run, 1e-9) - 2  # less the warm-up
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
    "CANDIDATE_TIMEOUT_S",
    "FINAL_MIN_ROUNDS",
    "FINAL_MIN_RUNS",
    "FINAL_ROUNDS",
    "PAIRED_ANCHOR_MIN_RUNS",
    "PAIRED_ANCHOR_SHARE",
    "PAIRED_ROUNDS",
    "PAIRED_SETTLE_SHARE",
    "SETTLE_S",
    "SPIN_S",
    "Budget",
    "paired_anchor_runs",
    "paired_runs_cost",
    "paired_settle_max",
]
