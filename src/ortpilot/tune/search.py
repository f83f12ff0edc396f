"""The search: a cheap pass over every candidate, then successive halving, then a final
interleaved measurement of the finalists against ORT's default session.

Cheap pass: each candidate is prepared in the worker (built, loaded strict, checked against
the gate) and timed with a few runs. Model variants are tried most promising first; a dynamic
INT8 variant that misses the gate by a little is followed at once by the same variant with its
most sensitive layers left in float (``passes.sensitivity``), so the search reaches a fast
variant that passes within the budget. Halving: the better half of the candidates that passed
gets twice the runs, until the leader's confidence interval separates from the runner-up's or
the budget ends. Final: leader, runner-up and the baseline are timed round-robin in one
process, so a slow stretch of the machine hits all of them alike. Every step goes to the
journal first and is replayed from it on ``--resume``. A journal whose search had ended (its
final measurement or its ``done`` record is there) is replayed only (``replay_only``): a step
the journal lacks is what the budget cut then, and stays cut, so the same winner comes out
and nothing is measured again.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortpilot.errors import StorageError, UsageError
from ortpilot.measure.stats import bootstrap_median_ci, bootstrap_ratio_ci
from ortpilot.tune.candidate import Candidate
from ortpilot.tune.gate import Gate
from ortpilot.tune.journal import Journal
from ortpilot.passes.sensitivity import nodes_to_exclude
from ortpilot.tune.space import (
    Facts,
    combine,
    first_candidates,
    knob_variants,
    with_exclusions,
    within_budget,
)
from ortpilot.tune.worker import WorkerClient, WorkerCrash

OBJECTIVES = ("p50", "p99", "throughput")
SCREEN_RUNS_BASELINE = 10
FINAL_ROUNDS = 8
KNOB_BASES = 2  # model variants whose session knobs are explored
MIN_GAIN = 0.03  # a knob "wins" on its own when it beats its base by this much in the cheap pass
MAX_ROUNDS = 6
OUTPUT_RESERVE_S = 5.0  # writing the model, profile and reports (matplotlib) after the search
CANDIDATE_TIMEOUT_S = 600.0  # a candidate's child that takes longer is taken to hang
FINAL_MIN_RUNS = 2  # per candidate per final round
FINAL_MIN_ROUNDS = 4  # the final shrinks to this when time is short (slow models, small budgets)
# A rejected dynamic INT8 variant within this factor of the limit gets layers left in float,
# aiming this much below the limit, at most this many times.
FOLLOWUP_WITHIN = 4.0
FOLLOWUP_MARGIN = 1.3
FOLLOWUP_TRIES = 2


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

    @property
    def measured(self) -> bool:
        return self.status == "ok" and bool(self.samples)

    def to_dict(self) -> dict[str, Any]:
        return {**self.candidate.to_dict(), "phase": self.phase, "status": self.status, "reason": self.reason,
                "accuracy": self.accuracy, "prepared": self.prepared,
                "samples_s": self.samples, "final_samples_s": self.final, "final_blocks": self.final_blocks}


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
    """One tune's search loop over a worker, a journal and a deadline."""

    def __init__(self, worker: WorkerClient, journal: Journal, *, deadline: float, objective: str,
                 gate_factory: Callable[[str], Gate], progress: Callable[[Progress], None] | None = None,
                 on_first_record: Callable[[], None] | None = None, replay_only: bool = False) -> None:
        """``on_first_record`` runs just before the journal first reaches the disk (the baseline is
        measured by then): what a resume needs besides the journal is saved there."""
        if objective not in OBJECTIVES:
            raise UsageError(f"Unknown objective '{objective}'; use one of {', '.join(OBJECTIVES)}.")
        self.worker = worker
        self.journal = journal
        self.deadline = deadline
        self.objective = objective
        self.gate_factory = gate_factory
        self.gate: Gate | None = None
        self.progress = progress or (lambda p: None)
        self.on_first_record = on_first_record or (lambda: None)
        self.replay_only = replay_only
        self.entries: dict[str, Entry] = {}
        self.planned = 0
        self.screen_runs = 5
        self.prep_times: list[float] = []

    # ------------------------------------------------------------------ helpers

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def _latency(self) -> float:
        base = [e for e in self.entries.values() if e.candidate.baseline and e.samples]
        return cost(base[0].samples, "p50") if base else 0.01

    def _est_prepare(self) -> float:
        return float(np.median(self.prep_times)) if self.prep_times else 2.0

    def _reserve(self) -> float:
        """Time kept for the final interleaved measurement of three candidates (``deadline`` already
        excludes the time for writing the outputs)."""
        return (FINAL_MIN_ROUNDS * FINAL_MIN_RUNS + 2) * 3 * self._latency() * 1.3 + 1.0

    def _report(self, phase: str) -> None:
        best = self.ranking()[:1]
        done = sum(1 for e in self.entries.values() if e.status != "pending")
        self.progress(Progress(done, max(self.planned, done), best[0].candidate.label if best else "-",
                               cost(best[0].samples, self.objective) * 1e3 if best else None,
                               max(0.0, self.left()), phase))

    def ranking(self) -> list[Entry]:
        ok = [e for e in self.entries.values() if e.measured]
        return sorted(ok, key=lambda e: cost(e.samples, self.objective))

    # ------------------------------------------------------------------ steps

    def _prepare(self, entry: Entry, *, timeout: float) -> None:
        cid = entry.candidate.id
        record = self.journal.get("prepared", cid)
        if record is None:
            start = time.monotonic()
            try:
                result = self.worker.request("prepare", entry.candidate.to_dict(), timeout)
            except WorkerCrash as exc:
                if exc.timed_out and timeout < CANDIDATE_TIMEOUT_S:
                    # Stopped by the budget, not by a hang: not journaled, so --resume tries it again.
                    entry.status, entry.reason = "budget", "stopped: the budget ran out while it was being prepared"
                    return
                result = {"status": "timeout" if exc.timed_out else "crashed", "error": str(exc),
                          "signal": exc.signal_number, "returncode": exc.returncode, "log_tail": exc.log_tail[-500:]}
            if result.get("errno") is not None:  # a full disk, a read-only cache: every candidate would fail
                kept = ("Nothing was measured yet; fix that and run the command again." if entry.candidate.baseline
                        else "The journal keeps every finished candidate; fix that and run the same command with "
                             "--resume.")
                raise StorageError(f"The tune stopped at candidate {entry.candidate.label}, because the machine "
                                   f"refused a write: {str(result.get('error')).split(': ', 1)[-1]} {kept}",
                                   errno=result["errno"])
            elapsed = time.monotonic() - start
            record = {"kind": "prepared", "id": cid, "candidate": entry.candidate.to_dict(), "phase": entry.phase,
                      "seconds": elapsed, **result}
            if result.get("status") == "ok":
                self.prep_times.append(elapsed)
                if self.gate is None:
                    self.gate = self.gate_factory(result["outputs"])
                record["accuracy"] = self.gate.check(result["outputs"])
            self.journal.append(record)
        entry.prepared = {k: v for k, v in record.items() if k not in ("kind", "candidate", "log_tail")}
        if self.gate is None and record.get("status") == "ok":
            self.gate = self.gate_factory(record["outputs"])
        status = record.get("status")
        entry.accuracy = record.get("accuracy")
        if status == "ok" and entry.accuracy and not entry.accuracy["passed"]:
            worst = max(entry.accuracy["outputs"], key=lambda o: o["error"])
            entry.status, entry.reason = "rejected", (f"accuracy: {worst['metric']} error {worst['error']:.4g} on "
                                                      f"'{worst['name']}' > {entry.accuracy['max_error']:g}")
        elif status == "ok":
            entry.status = "ok"
        elif status == "skipped":
            entry.status, entry.reason = "skipped", record.get("reason", "")
        elif status in ("crashed", "timeout"):
            entry.status, entry.reason = status, record.get("error", "")
        else:
            entry.status, entry.reason = "failed", record.get("error", "")

    def _bench(self, entry: Entry, stage: str, runs: int, *, timeout: float) -> None:
        cid = entry.candidate.id
        record = self.journal.get("bench", cid, stage)
        if record is None and self.replay_only:
            return  # the ended search did not run this step: the budget had run out
        if record is None:
            try:
                result = self.worker.request("bench", {"candidates": [entry.candidate.to_dict()], "runs": runs,
                                                       "warmup": 2}, timeout)
            except WorkerCrash as exc:
                result = {"status": "timeout" if exc.timed_out else "crashed", "error": str(exc),
                          "signal": exc.signal_number}
            record = {"kind": "bench", "id": cid, "stage": stage, "runs": runs, "status": result.get("status"),
                      "error": result.get("error"), "signal": result.get("signal"),
                      "samples_s": (result.get("samples_s") or {}).get(cid, [])}
            self.journal.append(record)
        if record["status"] != "ok":
            entry.status, entry.reason = (record["status"] if record["status"] in ("crashed", "timeout") else "failed",
                                          record.get("error") or "")
            return
        entry.samples.extend(record["samples_s"])

    def evaluate(self, entry: Entry, runs: int | None = None) -> None:
        """Prepare, gate and screen one candidate, unless the budget says no."""
        self.entries[entry.candidate.id] = entry
        runs = runs or self.screen_runs
        replayed = self.journal.get("prepared", entry.candidate.id) is not None
        est = self._est_prepare() + runs * self._latency() * 3
        if not replayed and not entry.candidate.baseline and (self.replay_only or self.left() - self._reserve() < est):
            entry.status, entry.reason = "budget", "not measured: the budget ran out"
            self._report("screening")
            return
        # A candidate may not eat the final measurement's time: its worker is stopped at that point.
        timeout = max(1.0, self.left()) if entry.candidate.baseline else max(1.0, self.left() - self._reserve())
        timeout = min(timeout, CANDIDATE_TIMEOUT_S)
        self._prepare(entry, timeout=timeout)
        if entry.status == "ok":
            self._bench(entry, "screen", runs, timeout=timeout)
        self._report("screening")

    # ------------------------------------------------------------------ the search

    def run(self, baseline: Candidate, facts: Facts) -> list[Entry]:
        queue = first_candidates(facts, baseline)
        self.planned = 1 + len(queue) + KNOB_BASES * 6
        base = Entry(baseline, "baseline")
        self.evaluate(base, SCREEN_RUNS_BASELINE)
        if base.status in ("timeout", "budget") or (self.left() <= 0 and not self.replay_only):
            raise BudgetTooSmall()
        if base.status != "ok":
            raise UsageError(f"ORT's default session could not be measured ({base.status}: {base.reason}); "
                             "ortpilot tune needs the model to run with ORT's defaults first. "
                             "Check it with 'ortpilot run MODEL'.")
        self.on_first_record()
        self.journal.commit()  # from here on an interrupted tune leaves a resumable journal
        self.screen_runs = int(min(40, max(5, math.ceil(0.25 / max(self._latency(), 1e-6)))))
        fusion = facts.fusion_step
        while queue:
            cand = queue.pop(0)
            if cand.id in self.entries:
                continue
            entry = Entry(cand, "model variants")
            self.evaluate(entry)
            if fusion and cand.passes == (fusion,) and entry.status == "skipped":
                dropped = [c for c in queue if c.passes[:1] == (fusion,)]
                queue = [c for c in queue if c not in dropped]
                for c in dropped:
                    self._skip(c, "transformer fusion found no pattern to fuse")
            follow = self._followup(entry)
            if follow is not None:
                queue.insert(0, follow)
                self.planned += 1
        self._explore_knobs(facts)
        self._halve()
        return self._final(base)

    def _skip(self, cand: Candidate, reason: str) -> None:
        self.entries[cand.id] = Entry(cand, "model variants", status="skipped", reason=reason)

    def _followup(self, entry: Entry) -> Candidate | None:
        """For a dynamic INT8 variant just short of the gate: the same, its worst layers left in float."""
        steps = entry.candidate.passes
        quant = steps[-1] if steps and steps[-1].get("pass") == "quantize" else None
        if entry.status != "rejected" or quant is None or quant.get("mode") != "dynamic" or not entry.accuracy:
            return None

        def base_of(step: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in step.items() if k != "exclude"}

        tries = sum(1 for e in self.entries.values() if e.candidate.passes and e.candidate.passes[:-1] == steps[:-1]
                    and e.candidate.passes[-1].get("exclude") and base_of(e.candidate.passes[-1]) == base_of(quant))
        limit = entry.accuracy["max_error"]
        worst = entry.accuracy["worst_error"]
        if tries >= FOLLOWUP_TRIES or not (0 < worst <= FOLLOWUP_WITHIN * max(limit, 1e-12)):
            return None
        ranking = self._ranking(steps[:-1], quant)
        nodes = nodes_to_exclude(ranking, worst / max(limit, 1e-12) * FOLLOWUP_MARGIN,
                                 already=quant.get("exclude", ()))
        if not nodes:
            return None
        return with_exclusions(entry.candidate, nodes)

    def _ranking(self, prefix: tuple[dict[str, Any], ...], quant: dict[str, Any]) -> list[dict[str, Any]]:
        """Per-layer dynamic INT8 sensitivity of the model ``prefix`` builds (journaled)."""
        op_types = ["MatMul", "Attention"]
        data = {"passes": list(prefix), "per_channel": bool(quant.get("per_channel")), "op_types": op_types,
                "reduce_range": bool(quant.get("reduce_range")), "weight_type": quant.get("weight_type", "qint8")}
        key = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
        record = self.journal.get("rank", key)
        if record is None:
            if self.replay_only or self.left() - self._reserve() < self._est_prepare() * 2:
                return []
            try:
                result = self.worker.request("rank", data, max(1.0, self.left() - self._reserve()))
            except WorkerCrash as exc:
                result = {"status": "crashed", "error": str(exc)}
            record = self.journal.append({"kind": "rank", "id": key, **data, "status": result.get("status"),
                                          "error": result.get("error"), "ranking": result.get("ranking") or []})
        return list(record.get("ranking") or [])

    def _explore_knobs(self, facts: Facts) -> None:
        bases = self.ranking()[:KNOB_BASES]
        for base_entry in bases:
            base = base_entry.candidate
            trials: list[Entry] = []
            for cand in knob_variants(base, facts):
                if cand.id in self.entries:
                    continue
                entry = Entry(cand, "session knobs")
                self.evaluate(entry)
                trials.append(entry)
            base_cost = cost(base_entry.samples, self.objective)
            winners = [e.candidate for e in trials if e.measured
                       and cost(e.samples, self.objective) < base_cost * (1 - MIN_GAIN)]
            combo = combine(base, winners)
            combo = within_budget([combo], facts)[0] if combo is not None else None
            if combo is not None and combo.id not in self.entries:
                self.evaluate(Entry(combo, "session knobs"))

    def _halve(self) -> None:
        pool = self.ranking()
        runs = self.screen_runs
        for round_no in range(1, MAX_ROUNDS + 1):
            if len(pool) < 2:
                return
            keep = max(2, math.ceil(len(pool) / 2))
            pool = pool[:keep]
            if len(pool) == 2 and self._separated(pool[0], pool[1]):
                return
            runs *= 2
            need = sum(runs * cost(e.samples, "p50") * 1.3 for e in pool)
            if self.left() - self._reserve() < need:
                return
            for entry in pool:
                self._bench(entry, f"round{round_no}", runs, timeout=max(5.0, self.left()))
                self._report(f"halving round {round_no}")
            pool = [e for e in self.ranking() if e in pool]

    def _separated(self, a: Entry, b: Entry) -> bool:
        _, a_hi = cost_ci(a.samples, self.objective)
        b_lo, _ = cost_ci(b.samples, self.objective)
        return a_hi < b_lo

    def _final(self, base: Entry) -> list[Entry]:
        ranked = self.ranking()
        finalists = [e for e in ranked[:2]]
        if base not in finalists:
            finalists.append(base)
        record = self.journal.get("final", "", "final")
        if record is None and len(finalists) > 1 and not self.replay_only:
            per_run = sum(cost(e.samples, "p50") for e in finalists) * 1.3  # one run of each finalist
            budget_runs = max(0.0, self.left() - 1.0) / max(per_run, 1e-9) - 2  # less the warm-up
            rounds = FINAL_ROUNDS if budget_runs >= FINAL_ROUNDS * FINAL_MIN_RUNS else FINAL_MIN_ROUNDS
            runs = max(FINAL_MIN_RUNS, min(self.screen_runs * 2, int(budget_runs / rounds)))
            try:
                result = self.worker.request("bench", {"candidates": [e.candidate.to_dict() for e in finalists],
                                                       "runs": runs, "rounds": rounds, "warmup": 2},
                                             max(5.0, self.left() + 5.0))
            except WorkerCrash as exc:
                result = {"status": "crashed", "error": str(exc)}
            record = {"kind": "final", "stage": "final", "ids": [e.candidate.id for e in finalists], **result}
            self.journal.append(record)
        if record and record.get("status") == "ok":
            for entry in finalists:
                entry.final = record["samples_s"].get(entry.candidate.id, [])
                entry.final_blocks = record["blocks"].get(entry.candidate.id, [])
        self._report("final")
        return finalists


class BudgetTooSmall(UsageError):
    def __init__(self) -> None:
        super().__init__("The budget is too small: measuring ORT's default session alone used all of it. "
                         "Give a larger --budget (at least a few times the model's load time).")


def speedup(base: Entry, winner: Entry, objective: str) -> dict[str, float]:
    """Baseline cost / winner cost on the interleaved samples, with a paired bootstrap CI for p50."""
    a = winner.final or winner.samples
    b = base.final or base.samples
    ratio = cost(b, objective) / cost(a, objective)
    if objective == "p50" and winner.final and base.final:
        _, lo, hi = bootstrap_ratio_ci(a, b, a_blocks=winner.final_blocks, b_blocks=base.final_blocks)
    else:
        a_lo, a_hi = cost_ci(a, objective)
        b_lo, b_hi = cost_ci(b, objective)
        lo, hi = b_lo / a_hi, b_hi / a_lo
    return {"ratio": ratio, "ci_low": lo, "ci_high": hi}
