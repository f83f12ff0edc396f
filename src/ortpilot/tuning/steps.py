"""The tune's steps, run in the worker or replayed from the journal: how ``--resume`` works.

A tune is a sequence of steps: prepare a candidate (build its model, load it strict, save its
outputs on the held-out inputs, gate them), time it (``bench``, one record per stage: screen,
halving round N), rank a dynamic INT8 variant's layers (``rank``), and the final interleaved
measurement (``final``). Every step goes through :class:`StepRunner`, which asks the journal
first:

1. **Journaled: replayed.** ``tune.journal`` keeps one fsynced JSON line per finished step,
   keyed by (kind, candidate id, stage). A step found there is not run again; its record is
   the result, as if the worker had just answered.
2. **Not journaled: run, then journaled.** The worker (a child process) runs it; the record is
   appended before the search goes on, so a tune killed at any moment loses at most the step
   in flight. Until the default session is measured nothing is on disk (``commit``): what a
   resume needs besides the journal, the default session's outputs and the held-out inputs, is
   copied into ``OUTDIR/.ortpilot-tune/`` just before the first write (``tune.state``, the
   ``kept`` record).
3. **Same steps, same order.** A candidate's id hashes its canonical JSON (passes as
   ``passes.registry.Step`` records, providers, settings), and the search policy
   (``tune.search``) decides from measurements only, so a resumed search asks for the same
   steps in the same order and finds the finished ones journaled. It continues with a fresh
   budget; replayed steps cost nothing.
4. **An ended search is replayed only** (``replay_only``: its ``final`` or ``done`` record is
   there). A step it lacks was cut by the budget then and stays cut (the baseline's preparation
   excepted, which a search cannot do without), so the same winner comes out and nothing is
   measured again; ``tune.budget`` then affords everything and the journal alone decides.
5. **Refused, exit 2, nothing written** (``tune.tune._check_resume``, ``tune.journal``): a
   journal of another tune (its ``start`` record's model hash, shapes, objective, gate,
   providers or ORT version differ), of another journal format (``JOURNAL_VERSION``; journals
   without a version, written before versions existed, are version 1 and resume), a record no
   tune writes, or a kept file that is missing or changed.

The accuracy gate is built from the default session's outputs (``gate_factory``) on its first
preparation, replayed or fresh; a fresh preparation is gated at once and its verdict journaled
with it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ortpilot.errors import StorageError
from ortpilot.gate.core import ModelGate
from ortpilot.tuning.budget import (
    CANDIDATE_TIMEOUT_S,
    FINAL_MIN_ROUNDS,
    PAIRED_ROUNDS,
    paired_anchor_runs,
    paired_settle_max,
)
from ortpilot.tuning.candidate import Candidate
from ortpilot.tuning.journal import Journal
from ortpilot.tuning.worker import WorkerClient, WorkerCrash


class StepRunner:
    """Every step of a search: the journal's record if it has one, else the worker's, journaled."""

    def __init__(
        self,
        worker: WorkerClient,
        journal: Journal,
        gate_factory: Callable[[str], ModelGate],
        *,
        replay_only: bool = False,
        on_first_record: Callable[[], None] | None = None,
    ) -> None:
        """``gate_factory``: the default session's outputs file -> the gate; ``on_first_record``
        runs just before the journal first reaches the disk (the baseline is measured by then)."""
        self.worker = worker
        self.journal = journal
        self.gate_factory = gate_factory
        self.gate: ModelGate | None = None
        self.replay_only = replay_only
        self.on_first_record = on_first_record or (lambda: None)
        # the candidates whose sessions the worker keeps alive, least recently used first (its last reply's): the
        # next session it makes lets the first go once it holds MAX_LIVE_SESSIONS
        self.held: tuple[str, ...] = ()

    def _request(self, op: str, data: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The worker's reply; what it holds is noted (nothing, once it died)."""
        try:
            result = self.worker.request(op, data, timeout)
        except WorkerCrash:
            self.held = ()
            raise
        if "held" in result:
            self.held = tuple(result.pop("held"))
        return result

    def commit(self) -> None:
        """From here on an interrupted tune leaves a resumable journal."""
        self.on_first_record()
        self.journal.commit()

    def journaled(self, kind: str, cid: str = "", stage: str = "") -> bool:
        return self.journal.get(kind, cid, stage) is not None

    def prepare(
        self, cand: Candidate, phase: str, timeout: float, *, affordable: bool = True
    ) -> tuple[dict[str, Any] | None, bool]:
        """(record, fresh). None when it may not run: replaying an ended search, or not ``affordable``
        (the baseline always runs). A worker stopped by the budget gives a ``budget`` record, not journaled."""
        record = self.journal.get("prepared", cand.id)
        fresh = record is None
        if fresh:
            if not cand.baseline and (self.replay_only or not affordable):
                return None, False
            record = self._prepare(cand, phase, timeout)
        if self.gate is None and record.get("status") == "ok":
            self.gate = self.gate_factory(record["outputs"])
        return record, fresh

    def _prepare(self, cand: Candidate, phase: str, timeout: float) -> dict[str, Any]:
        start = time.monotonic()
        try:
            result = self._request("prepare", cand.to_dict(), timeout)
        except WorkerCrash as exc:
            if exc.timed_out and timeout < CANDIDATE_TIMEOUT_S:
                # Stopped by the budget, not by a hang: not journaled, so --resume tries it again.
                return {"status": "budget", "reason": "stopped: the budget ran out while it was being prepared"}
            result = {
                "status": "timeout" if exc.timed_out else "crashed",
                "error": str(exc),
                "signal": exc.signal_number,
                "returncode": exc.returncode,
                "log_tail": exc.log_tail[-500:],
            }
        if result.get("errno") is not None:  # a full disk, a read-only cache: every candidate would fail
            kept = (
                "Nothing was measured yet; fix that and run the command again."
                if cand.baseline
                else "The journal keeps every finished candidate; fix that and run the same command with --resume."
            )
            raise StorageError(
                f"The tune stopped at candidate {cand.label}, because the machine "
                f"refused a write: {str(result.get('error')).split(': ', 1)[-1]} {kept}",
                errno=result["errno"],
            )
        record = {
            "kind": "prepared",
            "id": cand.id,
            "candidate": cand.to_dict(),
            "phase": phase,
            "seconds": time.monotonic() - start,
            **result,
        }
        if result.get("status") == "ok":
            if self.gate is None:
                self.gate = self.gate_factory(result["outputs"])
            record["accuracy"] = self.gate.measure(result["outputs"]).to_dict()
        return self.journal.append(record)

    def bench(
        self, cand: Candidate, stage: str, runs: int, timeout: float, *, anchor: Candidate | None = None
    ) -> dict[str, Any] | None:
        """The ``runs`` timings of ``stage``; None when replaying an ended search that did not run it.

        With ``anchor``, the two are timed round-robin (``PAIRED_ROUNDS`` rounds of half the runs, a
        quarter as many for the anchor, each turn settled by at most a quarter as many untimed runs) and
        the record keeps the anchor's timings too, so the search can rank by the ratio."""
        record = self.journal.get("bench", cand.id, stage)
        if record is not None or self.replay_only:
            return record
        if anchor is not None and anchor.id != cand.id:
            per_turn = max(1, math.ceil(runs / PAIRED_ROUNDS))
            request = {
                "candidates": [anchor.to_dict(), cand.to_dict()],
                "runs": per_turn,
                "runs_of": {anchor.id: paired_anchor_runs(per_turn)},
                "rounds": PAIRED_ROUNDS,
                "warmup": 2,
                "settle_max": paired_settle_max(per_turn),
            }
        else:
            anchor, request = None, {"candidates": [cand.to_dict()], "runs": runs, "warmup": 2}
        try:
            result = self._request("bench", request, timeout)
        except WorkerCrash as exc:
            result = {
                "status": "timeout" if exc.timed_out else "crashed",
                "error": str(exc),
                "signal": exc.signal_number,
            }
        return self.journal.append(
            {
                "kind": "bench",
                "id": cand.id,
                "stage": stage,
                "runs": runs,
                "status": result.get("status"),
                "error": result.get("error"),
                "signal": result.get("signal"),
                "samples_s": (result.get("samples_s") or {}).get(cand.id, []),
                "caller_cpus": result.get("caller_cpus"),
                **(
                    {
                        "anchor": anchor.id,
                        "anchor_samples_s": (result.get("samples_s") or {}).get(anchor.id, []),
                        "settled_s": result.get("settled_s"),
                    }
                    if anchor is not None
                    else {}
                ),
            }
        )

    def rank(self, key: str, data: dict[str, Any], timeout: float, *, affordable: bool = True) -> list[dict[str, Any]]:
        """A model's per-layer dynamic INT8 sensitivity (``passes.sensitivity``); [] when it may not run."""
        record = self.journal.get("rank", key)
        if record is None:
            if self.replay_only or not affordable:
                return []
            try:
                result = self._request("rank", data, timeout)
            except WorkerCrash as exc:
                result = {"status": "crashed", "error": str(exc)}
            record = self.journal.append(
                {
                    "kind": "rank",
                    "id": key,
                    **data,
                    "status": result.get("status"),
                    "error": result.get("error"),
                    "ranking": result.get("ranking") or [],
                }
            )
        return list(record.get("ranking") or [])

    def final(
        self,
        finalists: list[Candidate],
        plan: Callable[[], tuple[int, int, float, float]],
        *,
        replay: str | None = None,
    ) -> dict[str, Any] | None:
        """The finalists timed round-robin in one process; ``plan()``: (runs, rounds, timeout, seconds), asked only
        when it runs, once the worker holds every finalist's session (one let go is created again first, so the plan
        counts the time that is really left); the worker stops its rounds (after ``FINAL_MIN_ROUNDS``) once another
        would end past ``seconds``. ``replay``: the replay set timed (``worker.batch_file``), where not the search's.
        None when replaying an ended search without one, or with a single finalist."""
        record = self.journal.get("final", "", "final")
        if record is not None or self.replay_only or len(finalists) < 2:
            return record
        named = {"replay": replay} if replay else {}
        try:
            if not {c.id for c in finalists} <= set(self.held):
                self._request("load", {"candidates": [c.to_dict() for c in finalists]}, CANDIDATE_TIMEOUT_S)
            runs, rounds, timeout, seconds = plan()
            request = {"candidates": [c.to_dict() for c in finalists], "runs": runs, "rounds": rounds, "warmup": 2}
            request |= {"within_s": seconds, "min_rounds": min(rounds, FINAL_MIN_ROUNDS)} | named
            result = self._request("bench", request, timeout)
        except WorkerCrash as exc:
            result = {"status": "crashed", "error": str(exc)}
        return self.journal.append(
            {"kind": "final", "stage": "final", "ids": [c.id for c in finalists], **result} | named
        )

    def batch(self, cands: list[Candidate], name: str, runs: int, rounds: int, timeout: float) -> dict[str, Any] | None:
        """``cands`` timed round-robin on the replay set ``name`` (a batch size's: ``worker.batch_file``), as the
        final is; journaled, so a resume replays it. None when replaying an ended search without it."""
        record = self.journal.get("batch", "", name)
        if record is not None or self.replay_only:
            return record
        request = {"candidates": [c.to_dict() for c in cands], "runs": runs, "rounds": rounds, "warmup": 1}
        try:
            result = self._request("bench", {**request, "replay": name}, timeout)
        except WorkerCrash as exc:
            result = {"status": "crashed", "error": str(exc)}
        return self.journal.append({"kind": "batch", "stage": name, "ids": [c.id for c in cands], **result})


__all__ = ["StepRunner"]
