"""The machine's speed states during a tune, and each candidate's speedup in each.

ORT's default session can run at two speeds for seconds to minutes at a time with nothing in ``/proc/stat``
to show it: on a VM, likely the host's other work (two threads then ran no faster than one). The calling
thread on the CPU of a pool thread ORT's default pins is another way, which the worker avoids
(``measure/placement.py``). ORT's default session is timed beside every bench of the search and in every
round of the final, so its p50 there tells which state a bench ran in, where the bench's turns outlasted
the last session's pool spinning (``search.PairedBench.settled``; every final round does): in the search's
short benches that spin read like a state of its own, 1.3-1.9x on a 0.05-ms model. Some candidates gain
more in one state than in the other (BENCHMARKS.md, "Two machine states": a
fused INT8 encoder 1.38x slow and 1.18x fast, plain INT8 1.24x in both), so a headline timed in one state
is not what a user's process sees in the other. Where a tune saw both, it picks by the worse state's
speedup and records both figures; ``verify --bench`` names the figure of the state it runs in beside its
verdict, which holds to the headline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortpilot.tuning.result import state_changed
from ortpilot.tuning.search import Entry, settled_anchor_speeds

FAST, SLOW = "fast", "slow"
# A state lasts tens of seconds to minutes; a bench takes well under a second. One or two slow benches among
# fast ones (seen in screening, the candidate beside them at its usual speed; cause not found) are not a
# state: only this many benches in a row on one side of the cut count.
MIN_BENCHES = 3
MIN_RUNS_PER_STATE = 4  # a candidate's timed runs in a state before its speedup there counts
FINAL_SEQ = 1_000_000  # the final's rounds come after every search bench


@dataclass(frozen=True)
class Observation:
    """One bench (or final round) of a candidate beside ORT's default."""

    seq: int  # when: the search's bench count (``Entry.paired``), or ``FINAL_SEQ`` + the final's round
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


def _side(default_s: float, between: float) -> str:
    """The state a bench ran in, from ORT's default's p50 there and ``cut``'s midpoint."""
    return FAST if default_s <= between else SLOW


def _rounds(entry: Entry) -> dict[int, float]:
    """``entry``'s p50 in each round of the final (s)."""
    return {
        block: float(np.median([s for s, b in zip(entry.final, entry.final_blocks, strict=False) if b == block]))
        for block in sorted(set(entry.final_blocks))
    }


def observations(entry: Entry, default: Entry) -> list[Observation]:
    """Every settled bench of ``entry`` beside ORT's default: the search's paired ones whose turns outlasted
    the last session's spin (``PairedBench.settled``), and each round of the final that both ran in
    (``default``: the final's reference)."""
    seen = [Observation(b.seq, b.anchor_s, b.ratio, b.runs) for b in entry.paired if b.settled]
    theirs = _rounds(default)
    for block, mine in _rounds(entry).items():
        if block in theirs:
            runs = entry.final_blocks.count(block)
            seen.append(Observation(FINAL_SEQ + block, theirs[block], mine / theirs[block], runs))
    return seen


def default_speeds(entries: Sequence[Entry], default: Entry) -> list[tuple[int, float]]:
    """(when, ORT's default's p50 in s) for every settled bench of the tune: beside each candidate in the
    search, each final round."""
    return settled_anchor_speeds(entries) + [(FINAL_SEQ + block, p50) for block, p50 in _rounds(default).items()]


def cut(benches: Sequence[tuple[int, float]]) -> tuple[float, frozenset[int]] | None:
    """(the p50 between the two states, the benches that ran in one), or None when ORT's default kept one
    speed. The cut is the midpoint of the default's 10th and 90th percentile; a bench belongs to a state only
    inside ``MIN_BENCHES`` or more in a row on its side, and the two states' medians are more than
    ``MACHINE_STATE_CHANGE`` apart (a noisy machine's spread alone rarely is)."""
    order = sorted(benches)
    if not order:
        return None
    low, high = (float(v) for v in np.percentile([d for _, d in order], [10, 90]))
    between = (low + high) / 2
    kept: set[int] = set()
    start = 0
    for end in range(1, len(order) + 1):
        if end == len(order) or _side(order[end][1], between) != _side(order[start][1], between):
            if end - start >= MIN_BENCHES:
                kept.update(seq for seq, _ in order[start:end])
            start = end
    fast = [d for seq, d in order if seq in kept and _side(d, between) == FAST]
    slow = [d for seq, d in order if seq in kept and _side(d, between) == SLOW]
    if not fast or not slow or not state_changed(float(np.median(slow) / np.median(fast))):
        return None
    return between, frozenset(kept)


def by_state(observations: Sequence[Observation], between: float, kept: frozenset[int]) -> dict[str, StateFigure]:
    """A candidate's figure in each state it had ``MIN_RUNS_PER_STATE`` runs in (``between``, ``kept``: ``cut``'s)."""
    figures = {}
    for state in (FAST, SLOW):
        mine = [o for o in observations if o.seq in kept and _side(o.default_s, between) == state and o.ratio > 0]
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
    defaults_ms: dict[str, float] = field(default_factory=dict)  # state -> ORT's default's median p50 in it

    @classmethod
    def read(cls, entries: Sequence[Entry], default: Entry) -> TuneStates:
        speeds = default_speeds(entries, default)
        found = cut(speeds)
        if found is None:
            return cls(None, {})
        between, kept = found
        figures = {
            e.candidate.id: by_state(observations(e, default), between, kept) for e in entries if e is not default
        }
        defaults = {
            state: float(np.median([d for seq, d in speeds if seq in kept and _side(d, between) == state])) * 1e3
            for state in (FAST, SLOW)
        }
        return cls(between, {cid: f for cid, f in figures.items() if f}, defaults)

    def worst(self, entry: Entry) -> float | None:
        return worst(self.figures.get(entry.candidate.id, {}))

    def record(self, entry: Entry) -> dict[str, Any]:
        """``entry``'s figures as the profile and the report keep them: {} when the tune saw one state."""
        return {state: f.to_dict() for state, f in self.figures.get(entry.candidate.id, {}).items()}


def state_of(default_p50_ms: float, defaults_ms: dict[str, float]) -> str:
    """The state (``{state: ORT's default's p50 in ms there}``) whose default p50 is nearest this one's."""
    return min(defaults_ms, key=lambda s: abs(math.log(default_p50_ms / float(defaults_ms[s]))))


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
