"""The machine's speed states during a tune, and each candidate's speedup in each.

On shared VMs a neighbour on the host's cores can slow this machine for tens of seconds at a time, and
nothing inside it shows that (no steal, no load in ``/proc/stat``). ORT's default session is timed beside
every bench of the search and in every round of the final, so its p50 there tells which state a bench ran
in. Some candidates gain more in one state than in the other (BENCHMARKS.md, "Two machine states": a
fused INT8 encoder 1.38x slow and 1.18x fast, plain INT8 1.24x in both), so a headline timed in one state
is not what a user's process sees in the other. Where a tune saw both, it picks by the worse state's
speedup and records both figures; ``verify --bench`` holds itself to the figure of the state it runs in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortpilot.tuning.result import state_changed
from ortpilot.tuning.search import Entry

FAST, SLOW = "fast", "slow"
MIN_BENCHES = 3  # benches of ORT's default in each state before two states are told apart
MIN_RUNS_PER_STATE = 4  # a candidate's timed runs in a state before its speedup there counts


@dataclass(frozen=True)
class Observation:
    """One bench (or final round) of a candidate beside ORT's default."""

    default_s: float  # ORT's default's p50 in it: the state it ran in
    ratio: float  # the candidate's p50 / the default's
    runs: int  # the candidate's timed runs


@dataclass(frozen=True)
class StateFigure:
    """A candidate's speedup over ORT's default in one state, over every bench it had there."""

    default_p50_ms: float
    speedup: float  # runs-weighted geometric mean of the default's p50 / the candidate's
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return {"default_p50_ms": self.default_p50_ms, "speedup": self.speedup, "runs": self.runs}


def observations(entry: Entry, default: Entry) -> list[Observation]:
    """Every bench of ``entry`` beside ORT's default: the search's paired ones, and each round of the final
    that both ran in (``default``: the final's reference)."""
    seen = [Observation(d, r, n) for r, n, d in entry.paired]
    for block in sorted(set(entry.final_blocks) & set(default.final_blocks)):
        mine = [s for s, b in zip(entry.final, entry.final_blocks, strict=False) if b == block]
        theirs = [s for s, b in zip(default.final, default.final_blocks, strict=False) if b == block]
        if mine and theirs:
            seen.append(Observation(float(np.median(theirs)), float(np.median(mine) / np.median(theirs)), len(mine)))
    return seen


def default_speeds(entries: Sequence[Entry], default: Entry) -> list[float]:
    """ORT's default's p50 in every bench of the tune (s): beside each candidate, and in each final round."""
    rounds = [
        float(np.median([s for s, b in zip(default.final, default.final_blocks, strict=False) if b == block]))
        for block in sorted(set(default.final_blocks))
    ]
    return [d for e in entries for _, _, d in e.paired] + rounds


def cut(defaults_s: Sequence[float]) -> float | None:
    """The p50 between the two states, or None when ORT's default kept one speed: the midpoint of its 10th and
    90th percentile across the benches, where each side holds ``MIN_BENCHES`` and the two sides' medians are
    more than ``MACHINE_STATE_CHANGE`` apart (a noisy machine's spread alone rarely is)."""
    low, high = (float(v) for v in np.percentile(defaults_s, [10, 90])) if defaults_s else (0.0, 0.0)
    between = (low + high) / 2
    fast = [d for d in defaults_s if d <= between]
    slow = [d for d in defaults_s if d > between]
    if min(len(fast), len(slow)) < MIN_BENCHES or not state_changed(float(np.median(slow) / np.median(fast))):
        return None
    return between


def by_state(observations: Sequence[Observation], between: float) -> dict[str, StateFigure]:
    """A candidate's figure in each state it had ``MIN_RUNS_PER_STATE`` runs in (``between``: ``cut``'s)."""
    figures = {}
    for state in (FAST, SLOW):
        mine = [o for o in observations if (o.default_s <= between) == (state == FAST) and o.ratio > 0]
        runs = sum(o.runs for o in mine)
        if runs < MIN_RUNS_PER_STATE:
            continue
        logs = [math.log(o.ratio) for o in mine]
        ratio = math.exp(float(np.average(logs, weights=[o.runs for o in mine])))
        default = float(np.median([o.default_s for o in mine])) * 1e3
        figures[state] = StateFigure(default, 1 / ratio, runs)
    return figures


def worst(figures: dict[str, StateFigure]) -> float | None:
    """The lower of the two states' speedups; None unless the candidate was timed in both."""
    return min(f.speedup for f in figures.values()) if len(figures) == 2 else None


@dataclass(frozen=True)
class TuneStates:
    """The states one tune saw: the p50 of ORT's default between them (None: one state), and each candidate's
    figure per state."""

    between_s: float | None
    figures: dict[str, dict[str, StateFigure]]  # candidate id -> state -> figure

    @classmethod
    def read(cls, entries: Sequence[Entry], default: Entry) -> TuneStates:
        between = cut(default_speeds(entries, default))
        if between is None:
            return cls(None, {})
        figures = {e.candidate.id: by_state(observations(e, default), between) for e in entries if e is not default}
        return cls(between, {cid: f for cid, f in figures.items() if f})

    def worst(self, entry: Entry) -> float | None:
        return worst(self.figures.get(entry.candidate.id, {}))

    def record(self, entry: Entry) -> dict[str, Any]:
        """``entry``'s figures as the profile and the report keep them: {} when the tune saw one state."""
        return {state: f.to_dict() for state, f in self.figures.get(entry.candidate.id, {}).items()}


def state_of(default_p50_ms: float, figures: dict[str, Any]) -> str:
    """The recorded state (``{state: {"default_p50_ms": ...}}``) whose default p50 is nearest this one's."""
    return min(figures, key=lambda s: abs(math.log(default_p50_ms / float(figures[s]["default_p50_ms"]))))


__all__ = [
    "FAST",
    "SLOW",
    "Observation",
    "StateFigure",
    "TuneStates",
    "by_state",
    "cut",
    "default_speeds",
    "observations",
    "state_of",
    "worst",
]
