"""The search: a cheap pass over every candidate, then successive halving, then a final
interleaved measurement of the finalists against ORT's default session.

Cheap pass: each candidate is prepared in the worker (built, loaded strict, checked against
the gate) and timed with a few runs, round-robin with ORT's default session (the *anchor*) in
the same worker: candidates are ranked by their cost relative to the anchor's in the same
stretch of time, so a machine that slows down for a few seconds (a shared host) no longer
ranks the candidate timed then below one timed in a quiet minute.

What the budget buys first (the budget policy): the model as given on every other provider, then the model
variants (fusion, INT8) by expected gain per second of preparation (``space.expected_gain`` over
``budget.Budget.prepare_estimate``, which grows with the model's size and its calibration samples) and, where
their prior per second of a session and its screening (``space.KNOB_GAIN``) is due, the session knobs on the
model as given (threads, level, IOBinding, arena, spinning), then session knobs around the best variants. A
candidate whose estimate does not fit in what is left (with the likely finalists' sessions the worker holds,
which a stopped step loses) is not started, and its reason says the estimate and what was left; a later,
cheaper one may still run. A dynamic
INT8 variant that misses the gate by a little is followed at once by the same variant with its
most sensitive layers left in float: one more try of the gate's auto-exclude loop
(``gate.exclude``, layers ranked by ``passes.sensitivity`` in the worker), so the search
reaches a fast variant that passes within the budget. Halving: the better half of the
candidates that passed gets twice the runs, until the leader's confidence interval separates
from the runner-up's or the budget ends. Final: leader, runner-up and the baseline are timed
round-robin in one process, so a slow stretch of the machine hits all of them alike.

This module is the policy only. What each step costs and whether it still fits is
``tune.budget``; running a step, or replaying it from the journal on ``--resume``, is
``tune.steps`` (whose docstring explains resume).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from ortpilot.errors import UsageError
from ortpilot.gate.exclude import Layer, NoiseShare, Try, nodes_of, propose
from ortpilot.gate.rankings import noise_layers
from ortpilot.gate.result import SAMPLES_TO_SEE_RARE, Check, GateResult
from ortpilot.measure.stats import bootstrap_median_ci, bootstrap_ratio_ci
from ortpilot.passes.registry import Step
from ortpilot.tuning.budget import OUTPUT_RESERVE_S, SAFETY, SPIN_S, Budget, paired_runs_cost
from ortpilot.tuning.candidate import Candidate
from ortpilot.tuning.request import OBJECTIVES
from ortpilot.tuning.space import (
    EXCLUDING_PASSES,
    KNOB_GAIN,
    Facts,
    combine,
    default_stand_in,
    expected_gain,
    first_candidates,
    knob_variants,
    with_exclusions,
    within_budget,
)
from ortpilot.tuning.steps import StepRunner
from ortpilot.tuning.worker import MAX_LIVE_SESSIONS

SCREEN_RUNS_BASELINE = 10
KNOB_BASES = 2  # model variants whose session knobs are explored
MIN_GAIN = 0.03  # a knob "wins" on its own when it beats its base by this much in the cheap pass
MAX_ROUNDS = 6
# Writing the outputs, measured (``tune``'s write_outputs, 2026-12-05, 2 CPUs, load 2.8-3.5): 1.4 s for PP-OCRv6 det
# (its sessions 0.1 s each), 1.9-2.1 s for the demo encoder at batch 8 (0.2 s): about 1 s of reports and files plus
# four sessions (the optimized model saved, loaded and run; the reference outputs). A model whose sessions take
# longer keeps that much more than OUTPUT_RESERVE_S (``_keep_for_outputs``); copying it, 1 s per 200 MB.
OUTPUT_FIXED_S = 1.0
OUTPUT_SESSIONS = 4
OUTPUT_MB_PER_S = 200.0
# A rejected dynamic INT8 (or OpenVINO INT8) variant within this factor of the limit gets layers left in float,
# aiming this much below the limit, at most this many times. The aim is half the limit because the
# gate sees the worst of its held-out samples, not of the traffic: on MiniLM the worst of 2,000 other
# sentences was 1.5-2.2x the worst of 50 held out (BENCHMARKS.md, issue 46), and a variant aimed at
# 1/1.3 of the limit passed on 50 and left 3 of 2,000 sentences under cosine 0.99.
# INT8 variants are held to the same aim: one that passes the gate between the aim and the limit is rejected
# (and followed up), since traffic's worst would likely break it. The aim loosens with the samples held out, as
# the worst of more of them comes nearer traffic's: NNCF's INT8 on MiniLM passed at 0.0048 on 50 held out and
# at 0.0074 on 299, and its worst of 2,000 other sentences was 0.0132 and 0.0121 (limit 0.01): 2.8x and 1.6x.
FOLLOWUP_WITHIN = 4.0
FOLLOWUP_MARGIN = 2.0  # up to FEW_HELD_OUT samples held out
FOLLOWUP_MARGIN_MANY = 1.6  # from SAMPLES_TO_SEE_RARE (299, the most a split holds out) on; log-linear between
FEW_HELD_OUT = 50
FOLLOWUP_TRIES = 2
RANK_OPS = ["MatMul", "Attention"]


class PairedBench(NamedTuple):
    """One bench of a candidate timed round-robin beside the anchor."""

    ratio: float  # its cost / the anchor's cost
    runs: int  # its timed runs
    anchor_s: float  # the anchor's p50 in s
    seq: int  # the search's bench count then: when it ran
    # Every turn started after ``SPIN_S`` of untimed runs (journal ``settled_s``): the other session's pool had
    # stopped spinning. Short turns do not (a bench settles at most a quarter of the runs it times): on a
    # 0.05-ms model ORT's default read 0.065-0.094 ms beside candidates there and 0.049 ms settled in the final,
    # so only settled benches say which state the machine ran in (``tuning.machinestates``).
    settled: bool = False


def settled_anchor_speeds(entries: Sequence[Entry]) -> list[tuple[int, float]]:
    """(when, the anchor's p50 in s) in every settled bench of the search: the machine's state then."""
    return [(b.seq, b.anchor_s) for e in entries for b in e.paired if b.settled]


# How far apart two search estimates can be and still be one speed: a search estimate comes from a few runs and
# missed the final's figure by up to 5 % on MiniLM's OpenVINO candidates (2.76x searched for 2.94x final).
SEARCH_ALIKE = 0.10


def leaders(
    ranked: Sequence[Entry], score: Callable[[Entry], float], reference: Entry | None = None, count: int = 2
) -> list[Entry]:
    """The first ``count`` of ``ranked`` (fastest first), except that the second place goes to the most accurate
    entry within the search's noise of the first (``SEARCH_ALIKE``) where one is more accurate than the first:
    the knobs explored and the final then weigh speed against margin (``reference``, ORT's default, is added to
    the final anyway and never takes that place)."""
    if len(ranked) < 2:
        return list(ranked)
    first = ranked[0]
    near = [
        e
        for e in ranked[1:]
        if e is not reference and score(e) <= score(first) * (1 + SEARCH_ALIKE) and e.error_share < first.error_share
    ]
    second = min(near, key=lambda e: e.error_share) if near else ranked[1]
    return [first, second, *[e for e in ranked[1:] if e is not second]][:count]


@dataclass
class Entry:
    """Everything known about one candidate during the search."""

    candidate: Candidate
    phase: str
    status: str = "pending"  # ok | rejected | failed | crashed | skipped | budget
    reason: str = ""
    prepared: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] | None = None
    samples: list[float] = field(default_factory=list)
    final: list[float] = field(default_factory=list)
    final_blocks: list[int] = field(default_factory=list)
    paired: list[PairedBench] = field(default_factory=list)  # its benches beside the anchor
    anchor: bool = False  # ORT's default session, which every other bench runs beside

    @property
    def measured(self) -> bool:
        return self.status == "ok" and bool(self.samples)

    @property
    def error_share(self) -> float:
        """The worst held-out error the gate found, as a share of its limit (0 where it did not judge): which of
        two candidates alike in speed is the more accurate (``Search._finalists``, ``tune._pick``)."""
        accuracy = self.accuracy or {}
        error, limit = accuracy.get("worst_error"), accuracy.get("max_error")
        if error is None:
            return 0.0
        return float(error) / float(limit) if limit else float(error)

    def paired_cost(self) -> float | None:
        """Its cost relative to the anchor's, timed side by side (runs-weighted geometric mean over its
        benches): 1.0 for the anchor itself, None when it never ran beside it."""
        if self.anchor:
            return 1.0
        if not self.paired:
            return None
        logs, weights = zip(*((math.log(b.ratio), b.runs) for b in self.paired))
        return float(math.exp(np.average(logs, weights=weights)))

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.candidate.to_dict(),
            "phase": self.phase,
            "status": self.status,
            "reason": self.reason,
            "accuracy": self.accuracy,
            "prepared": self.prepared,
            "samples_s": self.samples,
            "final_samples_s": self.final,
            "final_blocks": self.final_blocks,
            "paired_cost": self.paired_cost(),
        }


@dataclass
class Progress:
    done: int
    total: int
    best: str
    best_ms: float | None
    time_left_s: float
    phase: str


def cost(samples: list[float], objective: str) -> float:
    """Lower is better: median for p50, the 99th percentile for p99, mean latency for throughput."""
    if not samples:
        return math.inf
    x = np.asarray(samples)
    if objective == "p99":
        return float(np.percentile(x, 99))
    if objective == "throughput":
        return float(x.mean())
    return float(np.median(x))


def cost_ci(samples: list[float], objective: str, seed: int = 0, n_boot: int = 1000) -> tuple[float, float]:
    if objective == "p50":
        return bootstrap_median_ci(samples, seed=seed, n_boot=n_boot)
    x = np.asarray(samples)
    if x.size < 2:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    stats = [cost(list(x[rng.integers(0, x.size, x.size)]), objective) for _ in range(n_boot)]
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(lo), float(hi)


class Search:
    """One tune's search policy over a step runner and a budget."""

    def __init__(
        self,
        steps: StepRunner,
        budget: Budget,
        *,
        objective: str,
        progress: Callable[[Progress], None] | None = None,
        requests_per_run: int = 1,
        samples_per_request: int = 1,
        final_replay: tuple[str, int] | None = None,
        cached: Callable[[Sequence[Step]], tuple[Step, ...]] | None = None,
    ) -> None:
        if objective not in OBJECTIVES:
            raise UsageError(f"Unknown objective '{objective}'; use one of {', '.join(OBJECTIVES)}.")
        self.steps = steps
        self.budget = budget
        self.objective = objective
        self.progress = progress or (lambda p: None)
        self.entries: dict[str, Entry] = {}
        self.planned = 0
        self.screen_runs = 5
        self.reference: Entry | None = None  # what the winner is measured against (``_reference``), once run
        self.anchor: Entry | None = None  # ORT's default session, timed beside every later bench
        self.benches = 0  # benches timed beside the anchor so far: when each one ran (tuning.machinestates)
        # A timed run replays the workload's replay set: its samples are per request, a run costs this many.
        self.requests_per_run = max(1, requests_per_run)
        self.samples_per_request = max(1, samples_per_request)  # a request's batch (the server's batches of B)
        # (the worker's replay set, its requests) the final times where the search screened a part of it
        self.final_replay = final_replay
        if final_replay:
            budget.final_scale = final_replay[1] / self.requests_per_run
        self.final_replayed: str | None = None  # the replay set the final timed (its record's), None: the search's
        # the leading part of a pipeline the model cache holds from before this tune (transform.cached_prefix)
        self.cached = cached
        self._cached: dict[str, tuple[Step, ...]] = {}  # candidate's model key -> ``cached`` of its passes
        self.knobbed: set[str] = set()  # candidates whose session knobs were explored
        # why no later candidate gets buckets: padding to them changed the outputs of the model as given
        self.padding_leaks = ""
        # (model, provider) -> the candidate whose model has the same graph with more accurate values (``_dominated``)
        self.less_accurate: dict[tuple[str, str], Candidate] = {}

    @property
    def gate(self) -> Any:
        return self.steps.gate

    def run(self, baseline: Candidate, facts: Facts) -> list[Entry]:
        """Baseline; the model as given on every other provider; model variants and the baseline's knobs by
        expected gain per second (each rejected dynamic INT8 one followed up); knobs around the best; halving; final."""
        baseline = replace(baseline, given=facts.model_label)  # its id stays: labels name the model truly
        queue = first_candidates(facts, baseline)
        sessions = [c for c in queue if not c.passes]
        variants = [c for c in queue if c.passes]
        knobs_per_base = 6 if facts.session_knobs else 1  # the session knobs, or the model knob alone
        self.planned = 1 + len(queue) + len(knob_variants(baseline, facts)) + KNOB_BASES * knobs_per_base
        base = self._baseline(baseline)
        self._keep_for_outputs(base, facts)
        for cand in sessions:  # the model as given on every other provider (and the capped default)
            if cand.id not in self.entries:
                self.evaluate(Entry(cand, "sessions"))
        self._model_variants(variants, facts, knobs_of=base)  # and each session knob on it, when it is due
        self._explore_knobs(facts)
        self._halve()
        self.reference = self._reference(base, facts)
        return self._final(self.reference)

    def _model_variants(self, queue: list[Candidate], facts: Facts, knobs_of: Entry | None = None) -> None:
        """Every model variant, the most expected gain per second of preparation first (``_next``); a dynamic INT8
        one just over the gate is followed at once by its follow-up. The session knobs on ``knobs_of`` (the model
        as given) run as soon as a knob's prior per second (``_knob_value``) is at least the next variant's: first
        where sessions and timed runs are cheap, after the INT8 variants where a screening bench costs more than
        a knob is expected to give (a server's batches of 32 on a slow CPU: 10 s a knob, MiniLM)."""
        first: list[Candidate] = []  # follow-ups: tried next, whatever their estimate
        while queue or first or knobs_of is not None:
            if first:
                cand = first.pop(0)
            else:
                cand, value = self._next(queue, facts) if queue else (None, 0.0)
                if knobs_of is not None and (cand is None or self._knob_value() >= value):
                    self._knobs_around(knobs_of, facts, "sessions")
                    knobs_of = None
                    continue
            if cand in queue:
                queue.remove(cand)
            if cand is None or cand.id in self.entries:
                continue
            entry = self.evaluate(Entry(cand, "model variants"))
            if facts.fusion_step and cand.passes == (facts.fusion_step,) and entry.status == "skipped":
                queue = self._drop_fused(queue, facts.fusion_step)
            queue = self._drop_hopeless_twins(queue, entry)
            follow = self._followup(entry)
            if follow is not None:
                first.append(follow)
                self.planned += 1

    def _next(self, queue: list[Candidate], facts: Facts) -> tuple[Candidate, float]:
        """The variant with the most expected gain per second of preparation and screening, and that figure; ties
        keep the space's order (the INT8 rule's). A variant waits for those of its prefixes that are candidates too
        (the fused model before the fused INT8 ones): the cache then holds the prefix, and a prefix that changes
        nothing (fusion finding no pattern) drops them (``_drop_fused``) before each tries it again."""
        built = self._built(*queue)
        pending = [c.passes for c in queue]
        ready = [
            (i, c) for i, c in enumerate(queue) if not any(c.passes[:k] in pending for k in range(1, len(c.passes)))
        ]

        def value(item: tuple[int, Candidate]) -> tuple[float, int]:
            index, cand = item
            seconds = self.budget.prepare_estimate(cand.passes, built)[0] + self._screen_s()
            return expected_gain(cand, facts) / max(seconds, 1e-3), -index

        best = max(ready or list(enumerate(queue)), key=value)
        return best[1], value(best)[0]

    def _knob_value(self) -> float:
        """A session knob's expected gain (``space.KNOB_GAIN``) per second of a session and its screening bench."""
        return KNOB_GAIN / max(self.budget.prepare_estimate(())[0] + self._screen_s(), 1e-3)

    def _built(self, *also: Candidate) -> list[tuple[Step, ...]]:
        """The pass pipelines whose models the cache holds, with every prefix: those this tune has built, and the
        parts an earlier tune built (``cached``) of ``also``'s and of every candidate read so: a second tune
        estimated MiniLM's OpenVINO INT8 at 38 s to build, left it untried, and its model was there to load in
        1.2 s. (An entry found so is not read again: this tune's own builds are counted above.)"""
        built = [
            e.candidate.passes for e in self.entries.values() if e.candidate.passes and e.prepared.get("status") == "ok"
        ]
        for cand in also if self.cached is not None else ():
            if cand.passes and cand.model_key not in self._cached:
                self._cached[cand.model_key] = self.cached(cand.passes)
        return built + [held for held in self._cached.values() if held]

    @property
    def screened(self) -> tuple[int, int] | None:
        """(requests a run of the search replayed, a run of the final) where the final replayed more (its record
        says so); None where both replayed the same requests."""
        return (self.requests_per_run, self.final_replay[1]) if self.final_replayed and self.final_replay else None

    def _run_s(self, entry: Entry, *, final: bool = False) -> float:
        """Seconds one timed run of ``entry`` takes: its samples are per request, a run replays the workload's
        replay set (``requests_per_run`` requests; the final's, ``final_replay``, may hold more)."""
        requests = self.final_replay[1] if final and self.final_replay else self.requests_per_run
        return cost(entry.samples, "p50") * requests

    def _screen_s(self, runs: int | None = None) -> float:
        """A screening bench's expected seconds (its runs and the anchor's beside them)."""
        return paired_runs_cost(runs or self.screen_runs, self.budget.latency * 3, self.budget.latency)

    # ------------------------------------------------------------------ the policy's parts

    def _baseline(self, baseline: Candidate) -> Entry:
        base = self.evaluate(Entry(baseline, "baseline"), SCREEN_RUNS_BASELINE)
        if base.status in ("timeout", "budget") or self.budget.spent():
            raise BudgetTooSmall()
        if base.status != "ok":
            raise UsageError(
                f"ORT's default session could not be measured ({base.status}: {base.reason}); "
                "ortpilot tune needs the model to run with ORT's defaults first, on the inputs it times: "
                "the --workload's requests or the calibration samples where given (their values too, such as "
                "token ids within the vocabulary), generated ones otherwise. Check it with 'ortpilot run MODEL' "
                "(--input FILE.npz for one of your samples)."
            )
        self.steps.commit()
        self.screen_runs = int(min(40, max(5, math.ceil(0.25 / max(self.budget.latency, 1e-6)))))
        base.anchor = True
        self.anchor = base
        return base

    def _keep_for_outputs(self, base: Entry, facts: Facts) -> None:
        """Where writing the outputs will take longer than ``OUTPUT_RESERVE_S`` (a model whose sessions are slow to
        create, or large to copy), the search ends that much sooner, so the whole tune stays in its budget."""
        session_s = float(base.prepared.get("session_s") or 0.0)
        writing = (OUTPUT_FIXED_S + OUTPUT_SESSIONS * session_s + facts.model_mb / OUTPUT_MB_PER_S) * SAFETY
        self.budget.keep(writing - OUTPUT_RESERVE_S)

    def _drop_fused(self, queue: list[Candidate], fusion: Step) -> list[Candidate]:
        """Fusion alone found nothing to fuse: its fused INT8 variants would be the plain ones again."""
        dropped = [c for c in queue if c.passes[:1] == (fusion,)]
        for c in dropped:
            self.entries[c.id] = Entry(
                c, "model variants", status="skipped", reason="transformer fusion found no pattern to fuse"
            )
        return [c for c in queue if c not in dropped]

    def _drop_hopeless_twins(self, queue: list[Candidate], entry: Entry) -> list[Candidate]:
        """A quantization that misses the gate by far (over ``FOLLOWUP_WITHIN`` times the limit, no follow-up)
        misses it with or without fusion before it too: the same weights, quantized the same way. Its twins
        (the same last step after another prefix) are not built; on a large model each costs seconds."""
        steps = entry.candidate.passes
        if entry.status != "rejected" or not entry.accuracy or not steps or steps[-1].name != "quantize":
            return queue
        if _excluded(entry):
            return queue
        result = GateResult.from_dict(entry.accuracy)
        if result.limit is None or not result.error > FOLLOWUP_WITHIN * result.limit:
            return queue
        cand = entry.candidate
        twins = [
            c
            for c in queue
            if c.passes
            and c.passes[-1] == steps[-1]
            and c.passes != steps
            and c.providers == cand.providers
            and c.settings == cand.settings
        ]
        for c in twins:
            self.entries[c.id] = Entry(
                c,
                "model variants",
                status="skipped",
                reason=(
                    f"its twin {cand.label} missed the gate by {result.error / max(result.limit, 1e-12):.0f}x "
                    f"(error {result.error:.3g} > {result.limit:g}): the same quantization of the same weights"
                ),
            )
        return [c for c in queue if c not in twins]

    def evaluate(self, entry: Entry, runs: int | None = None) -> Entry:
        """Prepare, gate and screen one candidate, unless its estimate does not fit in what is left."""
        self.entries[entry.candidate.id] = entry
        runs = runs or self.screen_runs
        cand = entry.candidate
        if cand.shape_plan and self.padding_leaks:  # padded, it would fail as the model as given did
            entry.status, entry.reason = "skipped", self.padding_leaks
            self._report("screening")
            return entry
        keep = self.less_accurate.get(_model_on(cand))
        if keep is not None and not cand.baseline:  # its twin with the more accurate values is tried here instead
            entry.status, entry.reason = (
                "skipped",
                f"its model has the same graph as {keep.label}'s with less accurate values (measured on one session of "
                "this provider): the same speed by construction, so that model is tried on this session instead",
            )
            self._report("screening")
            return entry
        built = self._built(cand)
        seconds, basis = self.budget.prepare_estimate(cand.passes, built)
        at_risk = 0.0 if cand.baseline else self._at_risk_s()
        affordable = cand.baseline or self.budget.affords(seconds + self._screen_s(runs) + at_risk)
        # stopped at this point, the worker's loss is created again for the final inside the budget
        timeout = self.budget.candidate_timeout(cand.baseline, at_risk)
        record, _fresh = self.steps.prepare(cand, entry.phase, timeout, affordable=affordable)
        if record is None:
            entry.status, entry.reason = (
                "budget",
                (
                    self._not_started(cand, seconds + self._screen_s(runs), basis, at_risk)
                    if not affordable
                    else "not measured: the budget ran out"
                ),
            )
        else:
            if record.get("status") == "ok":  # journaled ones too: a resume estimates from what this tune measured
                # a model served from the cache was loaded, not built: no measure of what a build takes
                loaded = [cand.passes] if record.get("cache_hit") and cand.passes else []
                self.budget.record_prepare(cand.passes, record["seconds"], [*built, *loaded])
            self._record_prepared(entry, record)
            self._note_padding_leak(entry)
            if entry.status == "ok":
                self._dominated(entry)
            if entry.status == "ok":
                self._bench(entry, "screen", runs, self.budget.candidate_timeout(cand.baseline, at_risk))
        self._report("screening")
        return entry

    def _note_padding_leak(self, entry: Entry) -> None:
        """The model as given, padded to the workload's buckets, failing the gate: its mask does not make padding
        invisible, so every later bucketed candidate (other knobs, providers, INT8 on top) is skipped, not built."""
        cand = entry.candidate
        if cand.shape_plan and not cand.passes and entry.accuracy and not entry.accuracy["passed"]:
            self.padding_leaks = (
                f"not tried: padded to the buckets, the model as given failed the gate ({cand.label}: {entry.reason}), "
                "so no candidate gets buckets"
            )

    def _dominated(self, entry: Entry) -> None:
        """Of two passing candidates whose models have one structure (``graph_sha256``: the same nodes, shapes and
        types, other values) on the same session, only the more accurate stays: they run the same kernels, so
        timing one against the other measures the machine's noise (two NNCF recipes on MiniLM: 0.98x, the
        search's estimates 1.2x apart). The other is skipped, not timed (or no longer ranked, if it was)."""
        graph = entry.prepared.get("graph_sha256")
        if not graph:
            return
        session = replace(entry.candidate, passes=())  # everything but the model: providers, settings, plan ...
        twins = [
            e
            for e in self.entries.values()
            if e is not entry
            and e.status == "ok"
            and e.prepared.get("graph_sha256") == graph
            and replace(e.candidate, passes=()) == session
        ]
        for twin in twins:
            keep, drop = (entry, twin) if entry.error_share < twin.error_share else (twin, entry)
            self.less_accurate[_model_on(drop.candidate)] = keep.candidate
            drop.status, drop.reason = (
                "skipped",
                f"the same graph on the same session as {keep.candidate.label}, other values: the same speed by "
                f"construction, and that one is more accurate (worst held-out error {keep.error_share:.0%} of "
                f"the limit, this one's {drop.error_share:.0%})",
            )
            if drop is entry:
                return

    def _not_started(self, cand: Candidate, seconds: float, basis: str, at_risk: float = 0.0) -> str:
        """Why a candidate was not started: its estimate and what was left (the final's reserve kept)."""
        left = max(0.0, self.budget.left() - self.budget.reserve())
        what = "its preparation and screening" if cand.passes else "its session and screening"
        also = (
            f" plus {_secs(at_risk)} to create again the likely finalists' sessions the worker holds (stopped, or"
            " pushing them out, it lets them go)"
            if at_risk
            else ""
        )
        return (
            f"not tried: {what} would take about {_secs(seconds)} ({basis}){also}, and {_secs(left)} "
            "were left before the final measurement"
        )

    def _record_prepared(self, entry: Entry, record: dict[str, Any]) -> None:
        entry.prepared = {k: v for k, v in record.items() if k not in ("kind", "candidate", "log_tail")}
        status = record.get("status")
        entry.accuracy = record.get("accuracy")
        if status == "ok" and entry.accuracy and not entry.accuracy["passed"]:
            worst = max(entry.accuracy["outputs"], key=lambda o: o["error"])
            entry.status, entry.reason = (
                "rejected",
                (
                    f"accuracy: {worst['metric']} error {worst['error']:.4g} on "
                    f"'{worst['name']}' > {entry.accuracy['max_error']:g}"
                ),
            )
        elif status == "ok" and entry.accuracy and (over := _over_int8_aim(entry)) is not None:
            check, aim = over
            entry.status, entry.reason = (
                "rejected",
                (
                    f"accuracy: {check.metric} error {check.value:.4g} on '{check.name}' is within {check.limit:g} "
                    f"but over {aim:.3g}, where an INT8 variant must be on {entry.accuracy.get('samples', 0)} "
                    "held-out samples (traffic's worst sample was 1.6-2.8x the held-out worst on MiniLM)"
                ),
            )
        elif status in ("ok", "skipped", "budget"):
            entry.status, entry.reason = status, record.get("reason") or ""
        elif status in ("crashed", "timeout"):
            entry.status, entry.reason = status, record.get("error", "")
        else:
            entry.status, entry.reason = "failed", record.get("error", "")

    def _bench(self, entry: Entry, stage: str, runs: int, timeout: float) -> None:
        anchor = self.anchor.candidate if self.anchor is not None and entry is not self.anchor else None
        record = self.steps.bench(entry.candidate, stage, runs, timeout, anchor=anchor)
        if record is None:
            return  # the ended search did not run this step: the budget had run out
        if record["status"] != "ok":
            entry.status, entry.reason = (
                record["status"] if record["status"] in ("crashed", "timeout") else "failed",
                record.get("error") or "",
            )
            return
        entry.samples.extend(record["samples_s"])
        beside = record.get("anchor_samples_s") or []
        if record["samples_s"] and beside:  # journals written before anchors have none: ranked by cost alone
            ratio = cost(record["samples_s"], self.objective) / cost(beside, self.objective)
            self.benches += 1
            settled = (record.get("settled_s") or 0.0) >= SPIN_S
            entry.paired.append(
                PairedBench(ratio, len(record["samples_s"]), cost(beside, "p50"), self.benches, settled)
            )
        if entry.candidate.baseline:
            self.budget.latency = self._run_s(entry)
            # a calibration or held-out sample runs alone: a run of 8 requests, or of batches of 32, counted as one
            # sample's time made NNCF's 150 calibration samples of MiniLM an estimate of 90 s, and a tune of batches
            # of 32 never reached its OpenVINO INT8 candidates (a sample at batch 32 runs faster than alone: the
            # ratio the estimates learn from what ran covers that)
            self.budget.sample_latency = cost(entry.samples, "p50") / self.samples_per_request

    def _followup(self, entry: Entry) -> Candidate | None:
        """A dynamic INT8 or OpenVINO INT8 variant just over the gate: one more try of the auto-exclude loop, its
        worst layers (``NoiseShare`` of the worker's ranking) in float."""
        steps = entry.candidate.passes
        settings = noise_settings(steps[-1]) if steps else None
        if entry.status != "rejected" or settings is None or not entry.accuracy:
            return None
        layers = propose(
            _JournaledNoise(self, steps[:-1], settings),
            self._tries(entry),
            NoiseShare(FOLLOWUP_WITHIN, int8_margin(GateResult.from_dict(entry.accuracy).samples)),
            max_tries=1 + FOLLOWUP_TRIES,
        )
        return with_exclusions(entry.candidate, nodes_of(layers)) if layers else None

    def _tries(self, entry: Entry) -> list[Try]:
        """The loop's tries on ``entry``'s variant so far: the variant as the space made it, each follow-up,
        ``entry`` last."""
        steps = entry.candidate.passes
        base = steps[-1].with_options(exclude=None)
        same = [
            e
            for e in self.entries.values()
            if e.candidate.passes
            and e.candidate.passes[:-1] == steps[:-1]
            and e.candidate.passes[-1].with_options(exclude=None) == base
        ]
        followups = [e for e in same if _excluded(e)]
        first = entry if entry not in followups else next((e for e in same if e not in followups), entry)
        return [_try(e) for e in [first, *followups] if e is not entry] + [_try(entry)]

    def _explore_knobs(self, facts: Facts) -> None:
        """Session knobs around the best candidates whose knobs were not explored yet (``leaders``: the most
        accurate one alike in speed to the best among them, so its knobs are measured too)."""
        bases = [e for e in self.ranking() if e.candidate.id not in self.knobbed]
        for base_entry in leaders(bases, self.score, count=KNOB_BASES):
            self._knobs_around(base_entry, facts)

    def _knobs_around(self, base_entry: Entry, facts: Facts, phase: str = "session knobs") -> None:
        """One knob at a time around ``base_entry``, then every knob that beat it on its own, together."""
        base = base_entry.candidate
        self.knobbed.add(base.id)
        trials = [self.evaluate(Entry(c, phase)) for c in knob_variants(base, facts) if c.id not in self.entries]
        if not base_entry.measured:
            return
        base_cost = self.score(base_entry)
        winners = [e.candidate for e in trials if e.measured and self.score(e) < base_cost * (1 - MIN_GAIN)]
        combo = combine(base, winners)
        combo = within_budget([combo], facts)[0] if combo is not None else None
        if combo is not None and combo.id not in self.entries:
            self.evaluate(Entry(combo, phase))

    def _halve(self) -> None:
        pool = self.ranking()
        runs = self.screen_runs
        for round_no in range(1, MAX_ROUNDS + 1):
            if len(pool) < 2:
                return
            pool = pool[: max(2, math.ceil(len(pool) / 2))]
            if len(pool) == 2 and self._separated(pool[0], pool[1]):
                return
            runs *= 2
            anchor = self._run_s(self.anchor) if self.anchor is not None else 0.0
            if not self.budget.affords(
                sum(paired_runs_cost(runs, self._run_s(e), anchor) for e in pool) * SAFETY + self._reloads_s(pool)
            ):
                return
            for entry in pool:
                self._bench(entry, f"round{round_no}", runs, max(5.0, self.budget.left()))
                self._report(f"halving round {round_no}")
            pool = [e for e in self.ranking() if e in pool]

    def _reloads_s(self, pool: Sequence[Entry]) -> float:
        """Seconds the worker spends creating sessions again to bench ``pool`` in turn, each beside the anchor (the
        anchor's session first, as the worker takes them), and the final to create again the likely finalists these
        benches push out: it keeps its MAX_LIVE_SESSIONS most recently used, so a session it let go is created
        again (its own session's time: a built variant's or a shape plan's took several plain sessions') and may
        push out one needed next."""
        held = list(self.steps.held)
        seconds = 0.0
        for entry in pool:
            for used in (self.anchor, entry) if self.anchor is not None else (entry,):
                if used.candidate.id in held:
                    held.remove(used.candidate.id)
                else:
                    seconds += self._session_s(used)
                held = [*held, used.candidate.id][-MAX_LIVE_SESSIONS:]
        pushed = set(self.steps.held) - set(held)
        return seconds + sum(self._session_s(e) for e in self._likely_finalists() if e.candidate.id in pushed)

    def _separated(self, a: Entry, b: Entry) -> bool:
        _, a_hi = cost_ci(a.samples, self.objective)
        b_lo, _ = cost_ci(b.samples, self.objective)
        return a_hi < b_lo

    def _reference(self, base: Entry, facts: Facts) -> Entry:
        """What the winner is measured against: ORT's default session, or, where its pool starts more threads
        than this process may use, that session capped at the budget. ORT pins those extra threads to CPUs
        outside the process's own (a process on CPU 0 of two gets a pool thread on CPU 1), so the uncapped
        default is faster only by taking CPUs the budget leaves to others; it is not a choice either."""
        if facts.default_oversubscribes:
            stand_in = self.entries.get(default_stand_in(facts, base.candidate).id)
            if stand_in is not None and stand_in.measured:
                base.reason = base.reason or (
                    f"its pool starts {facts.default_threads} intra-op threads for {facts.cores} CPU(s) and ORT pins "
                    "them itself: timed, but neither the choice nor the measure (ratios are to the capped default)"
                )
                return stand_in
        return base

    def _final(self, reference: Entry) -> list[Entry]:
        """The leader and runner-up (never a session that takes CPUs outside the budget) and ``reference``."""
        finalists = self._finalists(reference)

        def plan() -> tuple[int, int, float, float]:
            # asked once the worker holds every finalist's session (steps.final loads the ones it let go first),
            # so the runs fit in what is really left; the worker stops its rounds at that time (after the fewest
            # the final takes) where the finalists run slower than the search timed them
            per_run = sum(self._run_s(e, final=True) for e in finalists)  # a run of each finalist
            plan = self.budget.final_plan(per_run, self.screen_runs, len(finalists))
            left = self.budget.left()
            return (*plan, max(5.0, left + 5.0), max(0.0, left - 0.5))

        replay = self.final_replay[0] if self.final_replay else None
        record = self.steps.final([e.candidate for e in finalists], plan, replay=replay)
        if record and record.get("status") == "ok":
            self.final_replayed = record.get("replay")  # a journal written before finals replayed more has none
            for entry in finalists:
                entry.final = record["samples_s"].get(entry.candidate.id, [])
                entry.final_blocks = record["blocks"].get(entry.candidate.id, [])
        self._report("final")
        return finalists

    # ------------------------------------------------------------------ reading the state

    def ranking(self) -> list[Entry]:
        ok = [e for e in self.entries.values() if e.measured]
        return sorted(ok, key=self.score)

    def score(self, entry: Entry) -> float:
        """What the search ranks by, lower is better: the cost relative to the anchor's timed beside it;
        for a bench without the anchor (a journal written before anchors), its cost over the anchor's own."""
        paired = entry.paired_cost()
        if paired is not None:
            return paired
        own = cost(entry.samples, self.objective)
        anchor = cost(self.anchor.samples, self.objective) if self.anchor is not None else math.nan
        return own / anchor if math.isfinite(anchor) and anchor > 0 else own

    def _finalists(self, reference: Entry) -> list[Entry]:
        """The leader, a runner-up (never a session that takes CPUs outside the budget) and ``reference``. The
        runner-up is the most accurate candidate within the search's noise of the leader (``SEARCH_ALIKE``)
        where one is more accurate than the leader, else the second fastest: the final then decides between
        speed and margin (``tune._pick`` ships the more accurate of two it cannot tell apart)."""
        outside = {e.candidate.id for e in self.entries.values() if e.candidate.baseline} - {reference.candidate.id}
        finalists = leaders([e for e in self.ranking() if e.candidate.id not in outside], self.score, reference)
        return finalists if reference in finalists else [*finalists, reference]

    def _likely_finalists(self) -> list[Entry]:
        """The final as it stands now (none before the anchor is timed)."""
        if self.anchor is None or not self.anchor.samples:
            return []
        return [e for e in self._finalists(self.anchor) if e.samples]

    def _session_s(self, entry: Entry) -> float:
        """Seconds to create ``entry``'s session again: its own where measured (a shape plan's bucket sessions
        took 5x a plain one: MiniLM on OpenVINO, 2.6-2.9 s against 0.3-0.7 s), else the budget's estimate."""
        return float(entry.prepared.get("session_s") or self.budget.est_session())

    def _at_risk_s(self) -> float:
        """The session time of the likely finalists the worker holds: a step stopped by the budget takes the worker
        with it, and a new session past MAX_LIVE_SESSIONS makes it let the oldest go; the reserve counts only those
        let go already, so a step that fits the budget alone could still push the final past the deadline (a
        second INT8 build stopped at the reserve: the final created two 6 s sessions again, 55 s of 47.5)."""
        held = set(self.steps.held)
        return sum(self._session_s(e) for e in self._likely_finalists() if e.candidate.id in held)

    def _plan_reserve(self) -> None:
        """The final as it stands now, for the budget's reserve: its likely finalists' latencies, and the sessions
        of those the worker let go (created again before the final)."""
        finalists = self._likely_finalists()
        if not finalists:
            return
        per_run = sum(self._run_s(e, final=True) for e in finalists)
        # ORT's default's runs of the final, one a finalist: the next candidate measured joins it, up to three (a
        # three-way final kept while ORT's default alone was measured left an OCR recognizer's 20 s tune 1.1 s
        # for a 6 s candidate, and it ended at 7 s having measured nothing else)
        floor = min(3, len(finalists) + 1) * self.budget.latency * self.budget.final_scale
        self.budget.final_per_run = max(floor, per_run if len(finalists) == 3 else 0.0)
        # each one's own session time: two of a shape plan's in the final left no time for batches of 32
        self.budget.reload_s = sum(self._session_s(e) for e in finalists if e.candidate.id not in self.steps.held)

    def _report(self, phase: str) -> None:
        self._plan_reserve()
        best = self.ranking()[:1]
        done = sum(1 for e in self.entries.values() if e.status != "pending")
        self.progress(
            Progress(
                done,
                max(self.planned, done),
                best[0].candidate.label if best else "-",
                cost(best[0].samples, self.objective) * 1e3 if best else None,
                max(0.0, self.budget.left()),
                phase,
            )
        )


def _model_on(cand: Candidate) -> tuple[str, str]:
    """A candidate's model and the provider that runs it (its first): what ``_dominated`` found less accurate."""
    return cand.model_key, str(cand.providers[0]["name"])


def _secs(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def _excluded(entry: Entry) -> list[str]:
    """The nodes a candidate's (last, INT8) step leaves in float."""
    step = entry.candidate.passes[-1]
    return list(step.spec.nodes_to_exclude) if isinstance(step.spec, EXCLUDING_PASSES) else []


def int8_margin(samples: int) -> float:
    """How many times below the limit an INT8 variant's worst held-out error must be, by the samples held out:
    ``FOLLOWUP_MARGIN`` up to ``FEW_HELD_OUT``, ``FOLLOWUP_MARGIN_MANY`` from ``SAMPLES_TO_SEE_RARE`` on, log-linear
    between (traffic's worst was 1.5-2.8x the worst of 50 held out, 1.6x the worst of 299: MiniLM, BENCHMARKS.md)."""
    if samples <= FEW_HELD_OUT:
        return FOLLOWUP_MARGIN
    if samples >= SAMPLES_TO_SEE_RARE:
        return FOLLOWUP_MARGIN_MANY
    share = math.log(samples / FEW_HELD_OUT) / math.log(SAMPLES_TO_SEE_RARE / FEW_HELD_OUT)
    return FOLLOWUP_MARGIN * (FOLLOWUP_MARGIN_MANY / FOLLOWUP_MARGIN) ** share


def _over_int8_aim(entry: Entry) -> tuple[Check, float] | None:
    """The worst check of an INT8 variant (ORT's quantizer or NNCF's) that passed the gate above its aim (the
    limit over ``int8_margin``), and that aim; None for any other candidate."""
    if not any(isinstance(step.spec, EXCLUDING_PASSES) for step in entry.candidate.passes):
        return None
    result = GateResult.from_dict(entry.accuracy or {})
    margin = int8_margin(result.samples)
    over = [c for c in result.checks if c.limit and c.value > c.limit / margin]
    worst = max(over, key=lambda c: c.value / (c.limit or 1.0), default=None)
    return (worst, (worst.limit or 0.0) / margin) if worst is not None else None


def noise_settings(step: Step) -> dict[str, Any] | None:
    """The weight settings the worker ranks ``step``'s layers with (the noise each adds under dynamic INT8 on the
    calibration activations: the pass's ``noise_settings``), or None where no follow-up applies. NNCF's INT8 for
    OpenVINO is ranked by the same noise: leaving its worst six layers float took MiniLM's worst of 1,000
    sentences from 0.0153 to 0.0064 (BENCHMARKS.md, issue 46)."""
    spec = step.spec
    return spec.noise_settings() if isinstance(spec, EXCLUDING_PASSES) else None


def _try(entry: Entry) -> Try:
    """A candidate the search measured, as a try of the auto-exclude loop."""
    excluded = _excluded(entry)
    result = GateResult.from_dict(entry.accuracy) if entry.accuracy else None
    return Try([Layer(n, (n,)) for n in excluded], excluded, result)


class _JournaledNoise:
    """The follow-up's ranking: per-layer dynamic INT8 sensitivity of the model ``prefix`` builds, with the weight
    ``settings`` of ``noise_settings``, computed by the worker (``passes.sensitivity.rank_dynamic``) and journaled
    (``rank`` records)."""

    def __init__(self, search: Search, prefix: tuple[Step, ...], settings: dict[str, Any]) -> None:
        self.search, self.prefix, self.settings = search, prefix, settings

    def rank(self, attempt: Try) -> list[Layer]:
        data = {"passes": [s.to_dict() for s in self.prefix], "op_types": RANK_OPS, **self.settings}
        key = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
        budget = self.search.budget
        ranking = self.search.steps.rank(
            key, data, max(1.0, budget.left() - budget.reserve()), affordable=budget.affords(budget.est_prepare() * 2)
        )
        return noise_layers(ranking)


class BudgetTooSmall(UsageError):
    def __init__(self) -> None:
        super().__init__(
            "The budget is too small: measuring ORT's default session alone used all the time left for the "
            f"search (the --budget less the {OUTPUT_RESERVE_S:g} s a tune keeps for writing its outputs). Give a "
            "larger --budget (at least a few times the model's load time)."
        )


def speedup(base: Entry, winner: Entry, objective: str) -> dict[str, float]:
    """Baseline cost / winner cost on the interleaved samples, with a paired bootstrap CI for p50."""
    a = winner.final or winner.samples
    b = base.final or base.samples
    paired = objective == "p50" and bool(winner.final and base.final)
    return speedup_of(b, a, objective, (base.final_blocks, winner.final_blocks) if paired else None)


def speedup_of(
    base: Sequence[float],
    winner: Sequence[float],
    objective: str,
    blocks: tuple[Sequence[int], Sequence[int]] | None = None,
) -> dict[str, float]:
    """``base``'s cost / ``winner``'s on their samples: with ``blocks`` (each sample's interleaving round, base's
    and winner's) a paired bootstrap CI of the p50 ratio, else the ratio of the costs' own CIs."""
    ratio = cost(base, objective) / cost(winner, objective)
    if blocks is not None:
        _, lo, hi = bootstrap_ratio_ci(winner, base, a_blocks=blocks[1], b_blocks=blocks[0])
    else:
        a_lo, a_hi = cost_ci(winner, objective)
        b_lo, b_hi = cost_ci(base, objective)
        lo, hi = b_lo / a_hi, b_hi / a_lo
    return {"ratio": ratio, "ci_low": lo, "ci_high": hi}
