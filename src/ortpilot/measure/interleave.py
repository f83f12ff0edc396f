"""Side-by-side benchmarks: configurations interleaved A B A B ... in one process.

Run back to back, A and B meet different machines: a neighbour's build starts, the CPU clock
drops, and a 10% "speedup" is drift. Interleaved in short turns, every stretch of the machine
is shared by all configurations; turn order alternates (A B, then B A) so that neither always
runs first. The ratio of medians gets a paired block-bootstrap CI over rounds, so drift shared
by a round cancels in the ratio instead of widening it.
"""

from __future__ import annotations

import math
import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortpilot.errors import UsageError
from ortpilot.measure import placement
from ortpilot.measure.bench import (
    MIN_RUNS,
    BenchmarkRunError,
    BenchResult,
    Progress,
    Runner,
    _Failed,
    environment,
    failure_of,
    reset_peak_rss,
)
from ortpilot.measure.options import BenchConfig, BenchOptions, bench_records, check_concurrency
from ortpilot.measure.stats import bootstrap_ratio_ci, paired_ratio_ci

TURN_S = 0.02  # auto block: runs per turn so that one turn takes about this long
MAX_BLOCK = 100
SETTLED_TURNS = 4  # with settling, an auto turn lasts this many settle times: settling stays a fifth of the time


@dataclass(frozen=True)
class Ratio:
    """How ``config`` compares with ``baseline``; below 1 is faster.

    ``ratio`` is the median, over A B B A pairs of rounds, of median(config) / median(baseline)
    within the pair (CI: bootstrap over pairs). Each pair sees one machine state and puts each
    configuration once first and once second, so drift and turn order cancel; the verdict
    follows this CI. ``pooled`` is median(all config runs) / median(all baseline runs) with a
    paired block-bootstrap CI: the classic figure, which a machine that switches between a
    fast and a slow state makes wide.
    """

    config: str
    baseline: str
    ratio: float
    ci_low: float
    ci_high: float
    pooled: float
    pooled_low: float
    pooled_high: float

    @property
    def verdict(self) -> str:
        if self.ci_high < 1.0:
            return "faster"
        if self.ci_low > 1.0:
            return "slower"
        return "same within noise"

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "baseline": self.baseline,
            "ratio": self.ratio,
            "ci95": [self.ci_low, self.ci_high],
            "pooled_ratio": self.pooled,
            "pooled_ci95": [self.pooled_low, self.pooled_high],
            "speedup": 1.0 / self.ratio if self.ratio else None,
            "verdict": self.verdict,
        }


@dataclass
class ComparisonResult:
    """Each configuration's ``BenchResult`` and every ratio against the first (the baseline)."""

    results: list[BenchResult]
    ratios: list[Ratio]
    block: int
    rounds: int
    drift: float | None
    failure: dict[str, Any] | None = None
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def baseline(self) -> str:
        return self.results[0].name if self.results else ""

    def to_dict(self, *, samples: bool = True) -> dict[str, Any]:
        return {
            "kind": "comparison",
            "baseline": self.baseline,
            "block": self.block,
            "rounds": self.rounds,
            "order": "alternating: rounds go A B C, then C B A",
            "drift": self.drift,
            "ratios": [r.to_dict() for r in self.ratios],
            "configs": [r.to_dict(samples=samples) for r in self.results],
            "failure": self.failure,
            "environment": self.environment,
        }


def default_names(count: int) -> list[str]:
    letters = string.ascii_uppercase
    return [letters[i] if i < len(letters) else f"C{i}" for i in range(count)]


def bench_interleaved(
    configs: Sequence[BenchConfig],
    options: BenchOptions | None = None,
    *,
    progress: Progress | None = None,
    **keywords: Any,
) -> ComparisonResult:
    """Benchmark ``configs`` interleaved in turns of ``block`` runs; the first is the baseline. ``options``: a
    ``BenchOptions``, or its fields as keywords (``runs=500``, ``duration_s``, ``warmup``, ``block``,
    ``policy``, ``roofline``, ``seed``, ``settle_s``).

    ``settle_s``: untimed runs for about this long at the start of each turn, while the thread pool of the
    session that ran before spins down (as tune's final measurement does: ``tuning.budget.SETTLE_S``).
    The turns hold the calling thread away from CPUs with a pinned ORT pool thread (``_caller_cpus``;
    ``environment["caller_cpus"]`` says where).

    ``runs`` is per configuration; ``duration_s`` (default 5 s) is for all of them together.
    ``block`` defaults to the runs that take about 20 ms (1 to 100), at least the concurrency.
    Sessions are created and warmed up one after another before the first timed turn.
    """
    _, options = bench_records(BenchConfig(), options, keywords)
    names = _checked_inputs(configs)
    runners = _make_runners(configs, names, options.policy, options.seed)
    caller_cpus = _caller_cpus(runners)
    turn, rounds = _measure_all(runners, options, progress, caller_cpus)
    result = _comparison(runners, turn, rounds, options.seed, None)
    result.environment["caller_cpus"] = sorted(caller_cpus) if caller_cpus else None
    if options.roofline:
        from ortpilot.measure.roofline import roofline_for

        for runner, res in zip(runners, result.results):
            res.roofline = roofline_for(runner.vs.model, res)
    return result


def _caller_cpus(runners: Sequence[Runner]) -> frozenset[int] | None:
    """Where the timed turns run the calling thread: away from the CPUs ORT's default session pinned its pool
    threads to, so a default-threaded configuration is timed at its faster placement (``measure.placement``;
    beside a pinned thread the demo encoder's default ran 1.6x slower). None where a configuration runs
    several callers: threads started inside the turns would inherit the narrowed CPUs."""
    if any(r.concurrency > 1 for r in runners):
        return None
    return placement.away_from_pinned()


def _checked_inputs(configs: Sequence[BenchConfig]) -> list[str]:
    """Refuse a bad request before any session is made (``BenchOptions`` checked the budget); each
    configuration's name."""
    if len(configs) < 1:
        raise UsageError("bench_interleaved() needs at least one configuration.")
    names = [c.name or d for c, d in zip(configs, default_names(len(configs)))]
    if len(set(names)) != len(names):
        raise UsageError(f"Configuration names must be unique, got {names}.")
    for config in configs:
        check_concurrency(config.concurrency)
    return names


def _make_runners(configs: Sequence[BenchConfig], names: Sequence[str], policy: str, seed: int) -> list[Runner]:
    """One runner per configuration; peak memory is scoped to the benchmark when it could be reset."""
    reset = reset_peak_rss()
    runners: list[Runner] = []
    for config, name in zip(configs, names):
        runners.append(Runner.of(config, name, policy, seed))
        if reset:
            runners[-1].memory.peak_scope = "benchmark"
    return runners


def _measure_all(
    runners: Sequence[Runner],
    options: BenchOptions,
    progress: Progress | None,
    caller_cpus: frozenset[int] | None = None,
) -> tuple[int, int]:
    """First runs and warm-ups one after another, then the interleaved turns: (runs per turn, rounds).

    The turns run with the calling thread on ``caller_cpus`` (None: where the OS puts it).
    A failing run raises ``BenchmarkRunError`` carrying the statistics of the runs that completed.
    """
    runs, duration_s = options.budget
    block, settle_s = options.block, options.settle_s
    current, phase = runners[0], "first_run"
    rounds = 0
    try:
        for current in runners:
            phase = "first_run"
            current.first_run()
        for current in runners:
            phase = "warmup"
            current.warm_up(options.warmup)
        phase = "runs"
        turn = block or _auto_block(runners, max(TURN_S, SETTLED_TURNS * settle_s))
        turn = max(turn, max(r.concurrency for r in runners))
        with placement.caller_on(caller_cpus):
            rounds = _run_rounds(runners, turn, runs, duration_s, progress, settle_s)
    except _Failed as exc:
        failure = {**failure_of(exc, phase), "config": current.name}
        partial = _comparison(runners, block or 0, rounds, options.seed, failure)
        where = "the first run" if phase == "first_run" else f"{phase} run {exc.index}"
        raise BenchmarkRunError(
            f"Configuration '{current.name}' failed at {where} ({failure['error']}: {failure['message']}). "
            "The statistics of the runs that completed are reported.",
            phase=phase,
            run_index=exc.index,
            partial=partial,
        ) from exc.error
    return turn, rounds


def _auto_block(runners: Sequence[Runner], turn_s: float = TURN_S) -> int:
    """Runs per turn so that the slowest configuration's turn takes about ``turn_s`` (from the warm-up
    median: a mean would shrink the turns whenever a neighbour's load slows a few runs)."""
    per_run = max((r.warmup.median_s or r.first_run_s or 0.0) for r in runners)
    if per_run <= 0:
        return 1
    return int(min(MAX_BLOCK, max(1, math.ceil(turn_s / per_run))))


def _run_rounds(
    runners: Sequence[Runner],
    block: int,
    runs: int | None,
    duration_s: float | None,
    progress: Progress | None,
    settle_s: float = 0.0,
) -> int:
    """Alternate turns until every runner has ``runs`` samples, or ``duration_s`` has passed."""
    start = time.perf_counter()
    origin = time.perf_counter_ns()
    for runner in runners:  # one time axis for every configuration's time series
        runner.origin_ns = origin
    total = float(runs * len(runners)) if runs is not None else float(duration_s or 0)
    last_tick = 0.0
    round_id = 0
    while True:
        if runs is not None:
            if all(len(r.samples) >= runs for r in runners):
                break
        elif time.perf_counter() - start >= (duration_s or 0) and all(len(r.samples) >= MIN_RUNS for r in runners):
            break
        order = runners if round_id % 2 == 0 else list(reversed(runners))
        for runner in order:
            n = block if runs is None else min(block, runs - len(runner.samples))
            if n > 0:
                _settle(runner, settle_s if len(runners) > 1 else 0.0)
                runner.measure(n, round_id=round_id)
        round_id += 1
        now = time.perf_counter()
        if progress and now - last_tick >= 0.1:
            last_tick = now
            done = sum(len(r.samples) for r in runners) if runs is not None else now - start
            progress("runs", min(done, total), total)
    return round_id


def _settle(runner: Runner, settle_s: float) -> None:
    """Untimed runs for about ``settle_s`` (none for 0)."""
    if settle_s > 0:
        settle(runner.step_fn(), settle_s)


def settle(
    step: Callable[[], Any], seconds: float, most: int | None = None, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Untimed runs at the start of a turn, by the clock: at least one, until ``seconds`` have passed or
    ``most`` runs are done; the seconds they took (the last run can end past ``seconds``). ORT's pool of the
    session before keeps spinning for about 30 ms after its last run (the demo CNN's default session: 31.75 ms
    of CPU on its pinned thread per run, runs 50 ms apart), so a count of runs is too short on a fast model: 50
    runs of the 0.05-ms CNN settled 2.5 ms, and its final timed ORT's default at 0.085 ms and the winner at
    0.055 ms, both beside a spinning pool (settled: 0.050 and 0.038 ms). ``clock`` is read before the first run
    and after each (tests give one that steps, so the logic is checked without timing the machine)."""
    start = clock()
    end, done = start + seconds, 0
    while True:
        step()
        done += 1
        now = clock()
        if now >= end or (most is not None and done >= most):
            return now - start


def _comparison(
    runners: Sequence[Runner], block: int, rounds: int, seed: int, failure: dict[str, Any] | None
) -> ComparisonResult:
    results = [r.result(seed=seed, keep_rounds=True) for r in runners]
    ratios: list[Ratio] = []
    base = results[0]
    for res in results[1:]:
        if not base.samples_s or not res.samples_s:
            continue
        pairs_a = [r // 2 for r in base.rounds]  # rounds 2k (A B) and 2k+1 (B A) form one pair
        pairs_b = [r // 2 for r in res.rounds]
        paired = paired_ratio_ci(base.samples_s, res.samples_s, pairs_a, pairs_b, seed=seed)
        pooled = bootstrap_ratio_ci(base.samples_s, res.samples_s, a_blocks=pairs_a, b_blocks=pairs_b, seed=seed)
        ratios.append(Ratio(res.name, base.name, *paired, *pooled))
    return ComparisonResult(
        results=results,
        ratios=ratios,
        block=block,
        rounds=rounds,
        drift=_drift(base),
        failure=failure,
        environment=environment(),
    )


def _drift(result: BenchResult) -> float | None:
    """Baseline median over the last quarter of rounds / over the first quarter (1.0 = no drift)."""
    if not result.rounds:
        return None
    rounds = np.asarray(result.rounds)
    samples = np.asarray(result.samples_s)
    last = int(rounds.max())
    if last < 3:
        return None
    early = samples[rounds <= last // 4]
    late = samples[rounds >= last - last // 4]
    if early.size == 0 or late.size == 0:
        return None
    return float(np.median(late) / np.median(early))
