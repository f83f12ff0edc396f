"""The search: a cheap pass over every candidate, then successive halving, then a final
interleaved measurement of the finalists against ORT's default session.

Cheap pass: each candidate is prepared in the worker (built, loaded strict, checked against
the gate) and timed with a few runs. Halving: the better half of the candidates that passed
gets twice the runs, until the leader's confidence interval separates from the runner-up's or
the budget ends. Final: leader, runner-up and the baseline are timed round-robin in one
process, so a slow stretch of the machine hits all of them alike. Every step goes to the
journal first and is replayed from it on ``--resume``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortpilot.errors import UsageError
from ortpilot.measure.stats import bootstrap_median_ci, bootstrap_ratio_ci
from ortpilot.tune.candidate import Candidate
from ortpilot.tune.gate import Gate
from ortpilot.tune.journal import Journal
from ortpilot.tune.space import Facts, combine, first_candidates, knob_variants
from ortpilot.tune.worker import WorkerClient, WorkerCrash

OBJECTIVES = ("p50", "p99", "throughput")
SCREEN_RUNS_BASELINE = 10
FINAL_ROUNDS = 8
KNOB_BASES = 2  # model variants whose session knobs are explored
MIN_GAIN = 0.03  # a knob "wins" on its own when it beats its base by this much in the cheap pass
MAX_ROUNDS = 6
OUTPUT_RESERVE_S = 4.0  # writing the model, profile and reports (matplotlib) after the search


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
                 on_first_record: Callable[[], None] | None = None) -> None:
        if objective not in OBJECTIVES:
            raise UsageError(f"Unknown objective '{objective}'; use one of {', '.join(OBJECTIVES)}.")
        self.worker = worker
        self.journal = journal
        self.deadline = deadline
        self.objective = objective
        self.gate_factory = gate_factory
        self.gate: Gate | None = None
        self.progress = progress or (lambda p: None)
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
        """Time kept for the final interleaved measurement of three candidates."""
        return FINAL_ROUNDS * 3 * (self.screen_runs + 1) * self._latency() * 1.5 + OUTPUT_RESERVE_S

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
                result = {"status": "timeout" if exc.timed_out else "crashed", "error": str(exc),
                          "signal": exc.signal_number, "returncode": exc.returncode, "log_tail": exc.log_tail[-500:]}
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
        if not replayed and not entry.candidate.baseline and self.left() - self._reserve() < est:
            entry.status, entry.reason = "budget", "not measured: the budget ran out"
            self._report("screening")
            return
        timeout = max(5.0, self.left()) if entry.candidate.baseline else max(10.0, min(self.left(), 600.0))
        self._prepare(entry, timeout=timeout)
        if entry.status == "ok":
            self._bench(entry, "screen", runs, timeout=timeout)
        self._report("screening")

    # ------------------------------------------------------------------ the search

    def run(self, baseline: Candidate, facts: Facts) -> list[Entry]:
        first = first_candidates(facts, baseline)
        self.planned = 1 + len(first) + KNOB_BASES * 6
        base = Entry(baseline, "baseline")
        self.evaluate(base, SCREEN_RUNS_BASELINE)
        if base.status == "timeout" or self.left() <= 0:
            raise BudgetTooSmall()
        if base.status != "ok":
            raise UsageError(f"ORT's default session could not be measured ({base.status}: {base.reason}); "
                             "ortpilot tune needs the model to run with ORT's defaults first. "
                             "Check it with 'ortpilot run MODEL'.")
        self.journal.commit()  # from here on an interrupted tune leaves a resumable journal
        self.screen_runs = int(min(40, max(5, math.ceil(0.25 / max(self._latency(), 1e-6)))))
        for cand in first:
            if cand.id not in self.entries:
                self.evaluate(Entry(cand, "model variants"))
        self._explore_knobs(facts)
        self._halve()
        return self._final(base)

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
                self._bench(entry, f"round{round_no}", runs, timeout=max(10.0, self.left()))
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
        if record is None and len(finalists) > 1:
            try:
                result = self.worker.request("bench", {"candidates": [e.candidate.to_dict() for e in finalists],
                                                       "runs": self.screen_runs, "rounds": FINAL_ROUNDS, "warmup": 3},
                                             max(10.0, self.left() + 10.0))
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
