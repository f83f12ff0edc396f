"""One auto-exclude loop: keep the layers that break the gate in higher precision, try by try.

Every way ortpilot rescues a quantized model that misses its gate is this loop: build the step
with some layers left in higher precision (float, or 8-bit weights for a 4-bit decoder), measure
it with the gate, and choose the next layers from a ranking. Two strategies make the variants:

- the **ranking** says which layers cost the most accuracy (``gate.rankings``: the noise each
  weighted node adds under dynamic INT8, replayed on the calibration activations; the QDQ layer
  errors of ORT's activation matching; the generation divergence of each decoder layer group
  quantized alone; or, in ``tune``, the ranking a worker journaled);
- the **schedule** says how many of them the next try takes: ``Rounds`` adds the next few worst
  each try and stops at the first pass (``quantize --auto-exclude``), ``Bisect`` doubles until the
  gate passes and bisects down to the fewest (weight-only decoders: about 2·log2(groups) tries),
  ``NoiseShare`` takes the fewest layers whose share of the noise covers the gap to the limit
  (tune's follow-up candidates).

:func:`propose` is one try of the loop: from the tries so far, the layers of the next one (or
None: stop). :func:`auto_exclude` runs it with a step and a gate in this process; ``tune`` calls
``propose`` once per follow-up candidate and lets its worker build and gate it like any other.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ortpilot.gate.core import ModelGate
from ortpilot.gate.result import GateResult

log = logging.getLogger("ortpilot")


@dataclass(frozen=True)
class Layer:
    """One unit a ranking orders: a node (or a decoder's layer group) and the nodes that remove its error."""

    name: str
    nodes: tuple[str, ...]  # left in higher precision together (a QDQ node with its quantized consumers)
    score: float = 0.0  # its share of the error; larger is worse (the ranking's own unit)
    detail: Any = None  # the ranking's record (passes.debug.LayerError, a sensitivity figure) for messages

    def covered(self, excluded: set[str]) -> bool:
        """Already in higher precision: its node (or, for a group, all its nodes) is excluded."""
        return self.name in excluded or set(self.nodes) <= excluded


@dataclass
class Try:
    """One variant the loop measured."""

    layers: list[Layer]  # what the loop chose to keep in higher precision (on top of the step's own)
    excluded: list[str]  # every node in higher precision in this variant, the step's own included
    result: GateResult | None  # None: not measured (a tune candidate the budget cut)
    step: Any = None
    built: Any = None  # what the step built (a PassResult, an Outcome); None for tune candidates

    @property
    def passed(self) -> bool:
        return self.result is not None and self.result.passed


class Ranking(Protocol):
    """Which layers cost the most accuracy, worst first, for the variant ``attempt`` measured."""

    def rank(self, attempt: Try) -> list[Layer]: ...


class Schedule(Protocol):
    """How many of the ranked layers the next try takes."""

    def done(self, tries: Sequence[Try]) -> bool:
        """Stop before ranking (cheap: a pass, a gap too large to close)."""

    def next(self, ranked: Sequence[Layer], tries: Sequence[Try]) -> list[Layer] | None:
        """The layers of the next try (all of them, not only the new ones), or None to stop."""


class ExcludeStep(Protocol):
    """A quantization step that can leave nodes in higher precision."""

    @property
    def excluded(self) -> list[str]: ...

    def excluding(self, nodes: Sequence[str]) -> ExcludeStep:
        """The same step with ``nodes`` in higher precision on top of its own exclusions."""

    def build(self) -> Any:
        """The built variant (anything with ``.model``), or None when nothing is left to quantize."""


def nodes_of(layers: Sequence[Layer]) -> list[str]:
    return list(dict.fromkeys(n for layer in layers for n in layer.nodes))


@dataclass(frozen=True)
class Rounds:
    """Each try adds the ``per_round`` worst layers not yet covered; stops at the first pass."""

    per_round: int = 2

    def done(self, tries: Sequence[Try]) -> bool:
        return tries[-1].passed

    def next(self, ranked: Sequence[Layer], tries: Sequence[Try]) -> list[Layer] | None:
        last = tries[-1]
        excluded = set(last.excluded)
        chosen = [layer for layer in ranked if not layer.covered(excluded)][: self.per_round]
        if not any(n not in excluded for layer in chosen for n in layer.nodes):
            return None
        return [*last.layers, *chosen]


@dataclass(frozen=True)
class Bisect:
    """The fewest of the ranked layers that pass: k = 1, 2, 4, ... until a pass, then bisection.

    ``max_layers`` caps k; ``keep`` leaves that many of the ranking always quantized (a float
    fallback that took every group would be no quantization at all).
    """

    max_layers: int | None = None
    keep: int = 0

    def done(self, tries: Sequence[Try]) -> bool:
        return tries[0].passed

    def next(self, ranked: Sequence[Layer], tries: Sequence[Try]) -> list[Layer] | None:
        limit = len(ranked) - self.keep if self.max_layers is None else min(self.max_layers, len(ranked))
        passed = {len(t.layers): t.passed for t in tries}
        passing = [k for k, ok in passed.items() if ok]
        if not passing:  # doubling: 1, 2, 4, ... and the limit itself last
            low = max(passed)
            if low >= limit:
                return None
            k = 1 if low == 0 else min(low * 2, limit)
        else:
            high = min(passing)
            low = max(k for k, ok in passed.items() if not ok and k < high)
            if high - low <= 1:
                return None
            k = (low + high) // 2
        return list(ranked[:k])


@dataclass(frozen=True)
class NoiseShare:
    """The fewest layers whose share of the ranked noise closes the gap to the limit, with a margin.

    Cosine distance grows with noise power, so leaving layers whose summed noise is a fraction f of
    the total in float cuts the error by about 1 / (1 - f) (``passes.sensitivity.nodes_to_exclude``).
    A variant over ``within`` times its limit is taken to be hopeless.
    """

    within: float = 4.0
    margin: float = 1.3

    def done(self, tries: Sequence[Try]) -> bool:
        """At its aim (``margin`` below the limit: a pass above it goes on), or hopeless."""
        last = tries[-1].result
        if last is None or last.limit is None or last.error <= last.limit / self.margin:
            return True
        return not (0 < last.error <= self.within * max(last.limit, 1e-12))

    def next(self, ranked: Sequence[Layer], tries: Sequence[Try]) -> list[Layer] | None:
        from ortpilot.passes.sensitivity import nodes_to_exclude

        last = tries[-1]
        result = last.result
        reduction = result.error / max(result.limit or 0.0, 1e-12) * self.margin
        by_name = {layer.name: layer for layer in ranked}
        nodes = nodes_to_exclude(
            [{"node": layer.name, "nsr": layer.score} for layer in ranked], reduction, already=last.excluded
        )
        if not nodes:
            return None
        return [*last.layers, *(by_name[n] for n in nodes)]


def propose(
    ranking: Ranking, tries: Sequence[Try], schedule: Schedule, max_tries: int | None = None
) -> list[Layer] | None:
    """One try of the loop: the layers the next variant keeps in higher precision, or None to stop.

    The ranking is asked only when the schedule goes on (it may cost a probe session or a worker).
    """
    if (max_tries is not None and len(tries) >= max_tries) or schedule.done(tries):
        return None
    return schedule.next(ranking.rank(tries[-1]), tries)


@dataclass
class ExcludeResult:
    """How the loop ended: every try in order, and the one to keep."""

    tries: list[Try]
    ranking: Ranking
    best: Try = field(init=False)

    def __post_init__(self) -> None:
        passing = [t for t in self.tries if t.passed]
        # The fewest layers that pass; none passing: the last (most layers) try.
        self.best = min(passing, key=lambda t: len(t.layers)) if passing else self.tries[-1]

    @property
    def passed(self) -> bool:
        return self.best.passed

    def worst_layers(self, n: int) -> list[Any]:
        """The ``n`` ranked layers the best try still quantizes (their records), for a failure message."""
        excluded = set(self.best.excluded)
        return [
            layer.detail if layer.detail is not None else layer
            for layer in self.ranking.rank(self.best)
            if not layer.covered(excluded)
        ][:n]


def attempt(step: ExcludeStep, layers: list[Layer], gate: ModelGate) -> Try | None:
    """Build ``step`` with ``layers`` in higher precision and measure it (None: nothing left to quantize)."""
    variant = step.excluding(nodes_of(layers)) if layers else step
    built = variant.build()
    if built is None:
        return None
    return Try(layers, list(variant.excluded), gate.measure(built.model), variant, built)


def auto_exclude(
    step: ExcludeStep,
    gate: ModelGate,
    ranking: Ranking,
    schedule: Schedule | None = None,
    *,
    max_tries: int | None = None,
) -> ExcludeResult:
    """Measure ``step``; while the schedule goes on, try the next variant ``propose`` gives.

    ``max_tries`` counts the first try (``step`` as it is): 1 measures it and ranks nothing.
    """
    schedule = schedule or Rounds()
    first = attempt(step, [], gate)
    if first is None:
        raise ValueError("the step built nothing to measure")
    tries = [first]
    while (layers := propose(ranking, tries, schedule, max_tries)) is not None:
        trial = attempt(step, layers, gate)
        if trial is None:
            break  # everything quantizable is already in higher precision
        tries.append(trial)
        log.info(
            "auto-exclude try %d: %d node(s) in higher precision, %s",
            len(tries) - 1,
            len(trial.excluded),
            trial.result.describe(),
        )
    return ExcludeResult(tries, ranking)


def finite(value: float) -> float | str:
    """A JSON-safe figure for the tries' history ("inf" for an output that broke)."""
    return float(value) if math.isfinite(value) else "inf"


__all__ = [
    "Bisect",
    "ExcludeResult",
    "ExcludeStep",
    "Layer",
    "NoiseShare",
    "Ranking",
    "Rounds",
    "Schedule",
    "Try",
    "attempt",
    "auto_exclude",
    "finite",
    "nodes_of",
    "propose",
]
