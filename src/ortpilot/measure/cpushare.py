"""How much of the machine's CPU time other work took while something was being timed.

The 1-minute load average says nothing once a tune's own worker keeps the cores busy, and it lags by a
minute. What does say it: the machine's busy CPU time (``/proc/stat``, hypervisor steal included, since
a shared VM loses its cores that way too) minus the CPU time of this process and its descendants. That
difference is the work of other processes, and a headline timed while it was large over-states the
gain a quiet process sees (BENCHMARKS.md, "Outside checks": ORT's default, whose threads spin, slows
down more under load than an INT8 winner does).

Linux only; elsewhere ``sample()`` returns ``None`` and nothing is claimed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")
# /proc/stat's first line: cpu user nice system idle iowait irq softirq steal guest guest_nice
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (guest time is inside user)


@dataclass(frozen=True)
class CpuSample:
    """Clock readings at one moment: wall time, the machine's busy CPU time, this process tree's."""

    wall_s: float  # time.monotonic()
    busy_s: float  # all CPUs' non-idle time since boot, steal included
    own_s: float  # this process and its descendants, live or reaped
    cpus: int  # the CPUs /proc/stat counts (the whole machine, whatever this process's affinity)


def sample() -> CpuSample | None:
    """The clocks now, or ``None`` where ``/proc`` does not have them (not Linux)."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        lines = (_PROC / "stat").read_text().splitlines()
        fields = lines[0].split()[1:]
        cpus = sum(1 for line in lines[1:] if line.startswith("cpu"))
        busy = sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) / tick
        own = _tree_ticks(os.getpid()) / tick
    except (OSError, ValueError, IndexError):
        return None
    return CpuSample(time.monotonic(), busy, own, cpus)


def others_share(first: CpuSample | None, last: CpuSample | None) -> float | None:
    """The share of the machine's CPU time between two samples that other processes used (0..1).

    ``None`` when either sample is missing or no time passed.
    """
    if first is None or last is None or last.cpus <= 0:
        return None
    wall = last.wall_s - first.wall_s
    if wall <= 0:
        return None
    others = (last.busy_s - first.busy_s) - (last.own_s - first.own_s)
    return round(min(1.0, max(0.0, others / (wall * last.cpus))), 3)


def _tree_ticks(root: int) -> int:
    """utime + stime + cutime + cstime over ``root`` and its live descendants (reaped ones are in cutime)."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue  # the process ended while we listed
        rest = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid ...
        pid = int(entry.name)
        children.setdefault(int(rest[1]), []).append(pid)
        ticks[pid] = sum(int(x) for x in rest[11:15])  # fields 14-17: utime stime cutime cstime
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


__all__ = ["CpuSample", "others_share", "sample"]
