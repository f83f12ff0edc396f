"""Which (model, class) search runs where and when: one search per host at a time, longest first.

Two searches on one physical host disturb each other's timings (they share its cores, caches and
memory bandwidth), so a host (the nodes Ray reports on one IP, or on one booted kernel) runs
one search at a time, whatever number of nodes it has. A search for class C runs on a node of
class C. Within that, the policy is longest-processing-time first (LPT): a host that becomes
free takes the longest pending search it has a node for; ties go to the search fewer hosts
could run, then by model and class name. :func:`pick` is that choice, used live by the fleet
driver as hosts free up; :func:`plan` runs the same choice on estimated durations (a
simulation: no Ray, no clock), and :func:`lower_bound` is what no schedule can beat, so a test
can hold the plan against it. Pure functions of their arguments.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Slot:
    """A node that can run searches: its id, its host, its machine class (id)."""

    node: str
    host: str
    machine_class: str


@dataclass(frozen=True)
class Job:
    """One search: a model on one machine class, and how long it is expected to take."""

    model: str
    machine_class: str
    seconds: float


@dataclass(frozen=True)
class Assignment:
    job: Job
    node: str
    host: str
    start_s: float
    end_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.job.model,
            "class": self.job.machine_class,
            "node": self.node,
            "host": self.host,
            "start_s": self.start_s,
            "end_s": self.end_s,
        }


@dataclass(frozen=True)
class Plan:
    """A schedule: what runs where and when, and the searches no node could take."""

    assignments: tuple[Assignment, ...]
    unplaced: tuple[Job, ...]  # no node of its class

    @property
    def wall_s(self) -> float:
        return max((a.end_s for a in self.assignments), default=0.0)

    @property
    def concurrent(self) -> bool:
        """Whether two searches overlap in time (on different hosts: never on one)."""
        return overlapping([(a.start_s, a.end_s) for a in self.assignments])

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "concurrent": self.concurrent,
            "assignments": [a.to_dict() for a in self.assignments],
            "unplaced": [{"model": j.model, "class": j.machine_class} for j in self.unplaced],
        }


def overlapping(spans: Sequence[tuple[float, float]]) -> bool:
    """Whether any two of the ``(start, end)`` spans overlap in time."""
    ordered = sorted(spans)
    return any(later[0] < max(e for _, e in ordered[: i + 1]) for i, later in enumerate(ordered[1:]))


def hosts_for(job: Job, slots: Sequence[Slot]) -> set[str]:
    """The hosts with a node of the job's class."""
    return {s.host for s in slots if s.machine_class == job.machine_class}


def pick(
    host: str,
    pending: Sequence[Job],
    slots: Sequence[Slot],
    busy: Collection[str] = (),
    avoid: Mapping[Job, Collection[str]] | None = None,
) -> tuple[Job, Slot] | None:
    """The search ``host`` runs next and the node it runs on, or None when it has a node for none of them.

    ``busy``: nodes that cannot take a search now (they died); ``avoid``: per search, nodes it should
    not go back to (its last attempt failed there and another node of its class is alive).
    """
    avoid = avoid or {}
    here = [s for s in slots if s.host == host and s.node not in busy]

    def node_for(job: Job) -> Slot | None:
        return next(
            (s for s in here if s.machine_class == job.machine_class and s.node not in avoid.get(job, ())), None
        )

    runnable = [j for j in pending if node_for(j) is not None]
    if not runnable:
        return None
    job = min(runnable, key=lambda j: (-j.seconds, len(hosts_for(j, slots)), j.model, j.machine_class))
    slot = node_for(job)
    assert slot is not None
    return job, slot


def plan(jobs: Sequence[Job], slots: Sequence[Slot]) -> Plan:
    """Run :func:`pick` on estimated durations: each time the host that is free first takes its next search."""
    unplaced = tuple(j for j in jobs if not hosts_for(j, slots))
    pending = [j for j in jobs if j not in unplaced]
    free_at = dict.fromkeys(sorted({s.host for s in slots}), 0.0)
    done: list[Assignment] = []
    while pending:
        for host in sorted(free_at, key=lambda h: (free_at[h], h)):
            chosen = pick(host, pending, slots)
            if chosen is not None:
                break
        else:  # pragma: no cover - every pending job has a host (unplaced ones were set aside)
            break
        job, slot = chosen
        start = free_at[host]
        done.append(Assignment(job, slot.node, host, start, start + job.seconds))
        free_at[host] = start + job.seconds
        pending.remove(job)
    return Plan(tuple(done), unplaced)


def lower_bound(jobs: Sequence[Job], slots: Sequence[Slot]) -> float:
    """No schedule finishes sooner: the longest search, and for every set of classes the work of their
    searches shared by the hosts that can run them (all sets for up to 10 classes, else each alone and all)."""
    placed = [j for j in jobs if hosts_for(j, slots)]
    if not placed:
        return 0.0
    classes = sorted({j.machine_class for j in placed})
    if len(classes) <= 10:
        groups = [set(c) for n in range(1, len(classes) + 1) for c in itertools.combinations(classes, n)]
    else:
        groups = [{c} for c in classes] + [set(classes)]
    bound = max(j.seconds for j in placed)
    for group in groups:
        work = sum(j.seconds for j in placed if j.machine_class in group)
        hosts = {s.host for s in slots if s.machine_class in group}
        bound = max(bound, work / len(hosts))
    return bound


__all__ = ["Assignment", "Job", "Plan", "Slot", "hosts_for", "lower_bound", "overlapping", "pick", "plan"]
