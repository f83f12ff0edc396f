"""What ``ortpilot.tune()`` returns: ``TuneResult``, and the records it is made of.

Three small frozen records say what belongs together: ``Pick`` (the winner, ORT's default it was
measured against, the speedup and whether the default stayed best), ``GateRecord`` (what the
accuracy gate held each output to and the samples it decided on) and ``RunRecord`` (how long the
run took, whether it resumed, the machine's load). ``TuneResult`` holds them beside the search's
entries and facts, and keeps the flat attribute names (``result.winner``, ``result.gate_data``,
``result.wall_s``, ...) as read-only views, so callers read it as before. ``to_dict`` is the one
document the JSON, the reports and the terminal summary are rendered from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ortpilot.data.workload import Workload
from ortpilot.measure.stats import summarize
from ortpilot.session.warmup import WarmupPlan
from ortpilot.tuning.search import Entry, settled_anchor_speeds
from ortpilot.tuning.space import Facts


@dataclass(frozen=True)
class Pick:
    """The profile's choice: the winner, ORT's default it was measured against, and the verdict."""

    winner: Entry
    baseline: Entry
    speedup: dict[str, Any]  # ratio, ci_low, ci_high; by_state where the tune saw two machine states
    default_best: bool  # ORT's default (or its CPU-budget stand-in) stayed the choice
    default_best_reason: str
    # {id, why}: a finalist the final measured faster is not the winner (tuning.machinestates)
    passed_over: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GateRecord:
    """What the accuracy gate held each output to, and the samples it (and static INT8) ran on."""

    metrics: dict[str, str]  # output -> metric
    metric_evidence: dict[str, str]  # output -> why its metric (measure.metrics)
    max_error: float
    samples: int  # held-out samples the gate decided on
    gate_data: dict[str, Any]  # where the held-out samples came from (data.DataSource.describe)
    calibration_data: dict[str, Any]  # where the samples static INT8 calibrated on came from
    heldout_sha256: str  # the first held-out sample's digest: the reference sample's inputs
    warning: str = ""  # gate.result.gate_data_warning: generated inputs, fewer than 16 samples, both, or ""


OTHERS_CPU_NOTE = 0.25  # others_cpu from which the report warns: a quarter of the machine's CPU time went elsewhere
# ORT's default session this much faster or slower at one time than at another means the machine changed state
# (load, or a neighbour on the host's cores that /proc/stat does not show; the calling thread on the CPU of a pool
# thread ORT's default pins is the third way, which the tune and verify avoid: measure/placement.py), and some
# speedups change with it
# (BENCHMARKS.md, "Two machine states"): the tune compares its search with its final, verify --bench itself with the tune.
MACHINE_STATE_CHANGE = 1.2
# What can make ORT's default change speed, as the tune's and verify's notes say it.
STATE_CAUSES = "load, or the VM host's other work, which /proc/stat does not show"


@dataclass(frozen=True)
class RunRecord:
    """How this run went."""

    wall_s: float  # from the call to the winner picked: the search and its final measurement
    resumed: bool  # it continued (or replayed) a journal
    load_avg: list[float] = field(default_factory=list)  # 1-min load average at the start and the end
    budget_s: float | None = None  # what the caller gave (--budget)
    total_s: float | None = None  # from the call to every output written; set once they are
    others_cpu: float | None = None  # share of the machine's CPU time other processes used during the run (cpushare)


def _view(record: str, name: str) -> Any:
    """A read-only attribute ``self.<record>.<name>``: TuneResult's flat names over its records."""
    return property(lambda self: getattr(getattr(self, record), name), doc=f"``{record}.{name}``")


@dataclass
class TuneResult:
    """What a tune found, and where it wrote it (``files``: filled in as the files are written)."""

    out_dir: Path
    model: str
    objective: str
    pick: Pick
    gate: GateRecord
    run: RunRecord
    entries: list[Entry]
    facts: Facts
    shapes: dict[str, tuple[int, ...]]
    batch: int = 1
    outputs: list[str] | None = None  # the outputs the deployment reads (--outputs); None: all of the model's
    files: dict[str, str] = field(default_factory=dict)
    workload: Workload | None = None  # what was timed: the requests' sizes (data.workload); None: one shape
    warmup: WarmupPlan | None = None  # the winner's first-run cost at a new size, and whether loads warm it
    # (requests a run of the search replayed, a run of the final) where the final replayed more (tune._Setup.
    # final_replay: a batch size's every batch): its p50 per request is of another mix than the search's, and
    # the two tell no machine state (none is read); None where both replayed the same requests
    screened: tuple[int, int] | None = None

    winner = _view("pick", "winner")
    baseline = _view("pick", "baseline")
    speedup = _view("pick", "speedup")
    default_best = _view("pick", "default_best")
    default_best_reason = _view("pick", "default_best_reason")
    passed_over = _view("pick", "passed_over")
    metrics = _view("gate", "metrics")
    metric_evidence = _view("gate", "metric_evidence")
    max_error = _view("gate", "max_error")
    gate_samples = _view("gate", "samples")
    gate_data = _view("gate", "gate_data")
    calibration_data = _view("gate", "calibration_data")
    heldout_sha256 = _view("gate", "heldout_sha256")
    wall_s = _view("run", "wall_s")
    resumed = _view("run", "resumed")
    budget_s = _view("run", "budget_s")
    total_s = _view("run", "total_s")
    load_avg = _view("run", "load_avg")
    others_cpu = _view("run", "others_cpu")

    def stats(self, entry: Entry) -> dict[str, Any]:
        samples = entry.final or entry.samples
        if not samples:
            return {}
        return summarize(samples, items_per_run=self.batch).to_dict()

    def to_dict(self) -> dict[str, Any]:
        from ortpilot.tuning.report import vs_default

        baseline = self._entry(self.baseline)
        candidates = [self._entry(e) for e in self.entries]
        winner = self._entry(self.winner)
        for c in [winner, *candidates]:
            c["vs_default"] = vs_default(baseline, c)
        return {
            "model": self.model,
            "out_dir": str(self.out_dir),
            "objective": self.objective,
            "winner": winner,
            "baseline": baseline,
            "speedup": self.speedup,
            "default_best": self.default_best,
            "default_best_reason": self.default_best_reason,
            "passed_over": self.passed_over,
            "metrics": self.metrics,
            "metric_evidence": self.metric_evidence,
            "max_error": self.max_error,
            "gate_samples": self.gate_samples,
            "gate_warning": self.gate.warning or None,
            "facts": self.facts.to_dict(),
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "workload": self.workload.to_dict() if self.workload is not None else None,
            "warmup": self.warmup.to_dict() if self.warmup is not None else None,
            "outputs": self.outputs,
            "wall_s": self.wall_s,
            "budget_s": self.budget_s,
            "total_s": self.total_s,
            "files": self.files,
            "resumed": self.resumed,
            "onnxruntime": ort.__version__,
            "load_avg": self.load_avg,
            "others_cpu": self.others_cpu,
            "load_note": "; ".join(
                note
                for note in (
                    load_note(self.load_avg, self.facts.cores, self.others_cpu),
                    state_note([p50 for _, p50 in settled_anchor_speeds(self.entries)], self.baseline.final)
                    if self.screened is None
                    else "",
                )
                if note
            ),
            "screened": list(self.screened) if self.screened else None,
            "gate_data": self.gate_data,
            "calibration_data": self.calibration_data,
            "candidates": candidates,
        }

    def _entry(self, e: Entry) -> dict[str, Any]:
        d = e.to_dict()
        d.pop("samples_s")
        d.pop("final_samples_s")
        d.pop("final_blocks")
        d["latency"] = self.stats(e)
        d["screen_latency"] = summarize(e.samples).to_dict() if e.samples else {}
        d["timing"] = "interleaved" if e.final else "search"  # where ``latency`` comes from
        return d


def load_note(load_avg: Sequence[float], cores: int, others_cpu: float | None = None) -> str:
    """A warning when other work competed for the cores: latencies and thread-count choices reflect it.

    Two signals: the load average at the start (once the tune runs, its own worker keeps the cores
    busy and the end figure says nothing about other work), and ``others_cpu``, the share of the machine's
    CPU time that other processes used during the run (``measure.cpushare``), which catches load that arrived
    mid-tune. A headline timed under such load over-states what a quiet process sees.
    """
    parts = []
    if load_avg and load_avg[0] >= cores * 0.75:
        parts.append(f"the machine was busy when the tune started (load average {load_avg[0]:.1f} on {cores} cores)")
    if others_cpu is not None and others_cpu >= OTHERS_CPU_NOTE:
        parts.append(f"other processes used {others_cpu:.0%} of the machine's CPU time while it ran")
    if not parts:
        return ""
    return (
        f"{' and '.join(parts)}: latencies, the speedup and thread-count choices such as intra=1 reflect that "
        "load; check the figure on a quiet machine (ortpilot verify OUTDIR --bench) or re-tune there"
    )


def state_changed(speed: float) -> bool:
    """Whether ORT's default running ``speed`` times as fast at one time as at another means another machine
    state (``MACHINE_STATE_CHANGE`` either way)."""
    return not 1 / MACHINE_STATE_CHANGE < speed < MACHINE_STATE_CHANGE


def state_note(search_s: Sequence[float], final_s: Sequence[float]) -> str:
    """A warning when ORT's default ran at another speed in the final measurement than in the search (times in
    seconds: its p50 in each settled bench of the search, its final samples): the machine changed state during
    the tune, so the search ranked the candidates in another state than the one the headline was timed in, and
    a speedup can differ between states. "" when it did not, or when either side has no figure. Not the
    default's own first bench: fresh from its session's creation, it read 0.94 ms on the demo encoder where
    every bench after it read 0.70-0.77 ms and the final 0.72 ms."""
    import numpy as np

    if not search_s or not final_s:
        return ""
    search, final = float(np.median(search_s)), float(np.median(final_s))
    if not state_changed(search / final):
        return ""
    return (
        f"ORT's default ran p50 {search * 1e3:.3f} ms in the search and {final * 1e3:.3f} ms in the final: the "
        f"machine changed speed during the tune ({STATE_CAUSES}), so the search ranked the candidates in another "
        "state than the headline's, and some speedups differ between states; check the figure with ortpilot "
        "verify OUTDIR --bench"
    )


__all__ = [
    "MACHINE_STATE_CHANGE",
    "OTHERS_CPU_NOTE",
    "STATE_CAUSES",
    "GateRecord",
    "Pick",
    "RunRecord",
    "TuneResult",
    "load_note",
    "state_changed",
    "state_note",
]
