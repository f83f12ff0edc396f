"""What is left of a server when Ray's own processes stop before it does.

A local server's Ray instance (``gcs_server``, ``raylet`` and Ray's Python helpers) runs as children of the
``ortpilot serve`` process, in its process group, so a SIGTERM sent to the whole group (``kill -TERM
-PGID``, a process manager that signals the group) stops them at the same moment as the server (the
helpers at once, the head within ~10 s): nothing is left to drain through, Ray's own calls wait 60 s for
the head and then end the process with exit 1, and the HAProxy that Ray's proxy manager started, in a
session of its own, lives on holding the port. The server notes the processes ``ray.init`` started
(``children`` before and after, each with its start time, so a reused pid is never taken for one of them),
watches them while it stops (``same``), and ends the HAProxy whose config lies in its run folder
(``ending_processes_using``: this user's processes of that name with an argument under the folder).
Linux ``/proc``; elsewhere these find nothing. No Ray.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

PROC = Path("/proc")
GONE = ("Z", "X")  # a zombie (ended, not yet reaped) or a dead process


def _stat(pid: int) -> tuple[int, str, str, int] | None:
    """(parent pid, command name, state, start time in clock ticks) of ``pid``; None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), name, fields[0], int(fields[19])


def _pids() -> list[int]:
    return [int(e.name) for e in PROC.glob("[0-9]*")] if PROC.is_dir() else []


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    stat = _stat(pid)
    return stat is not None and stat[2] not in GONE


def same(pid: int, started: int) -> bool:
    """Whether ``pid`` still runs as the process that started at ``started`` (not a new one under its pid)."""
    stat = _stat(pid)
    return stat is not None and stat[2] not in GONE and stat[3] == started


def children(parent: int | None = None) -> dict[int, int]:
    """The live children of ``parent`` (this process): pid -> start time."""
    parent = os.getpid() if parent is None else parent
    found = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None and stat[0] == parent and stat[2] not in GONE:
            found[pid] = stat[3]
    return found


def processes_using(path: str | os.PathLike, names: Iterable[str] | None = None) -> dict[int, int]:
    """This user's processes (other than this one) with an argument that is ``path`` or a file under it, and,
    given ``names``, a command name among them: pid -> start time."""
    root = os.fsencode(os.fspath(path)).rstrip(b"/")
    wanted = set(names) if names is not None else None
    found = {}
    for pid in _pids():
        entry = PROC / str(pid)
        try:
            if pid == os.getpid() or entry.stat().st_uid != os.getuid():
                continue
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        stat = _stat(pid)
        if stat is None or (wanted is not None and stat[1] not in wanted):
            continue
        if any(a == root or a.startswith(root + b"/") for a in args):
            found[pid] = stat[3]
    return found


def end(pids: Mapping[int, int], wait_s: float = 3.0) -> list[int]:
    """SIGTERM to each of ``pids`` (pid -> start time) still the same process, SIGKILL to those still running
    after ``wait_s``; returns the pids signalled."""
    ended = []
    for pid, start in pids.items():
        if not same(pid, start):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
            ended.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + wait_s
    while any(alive(p) for p in ended) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in ended:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return ended


def ending_processes_using(
    path: str | os.PathLike, names: Iterable[str] | None = None, wait_s: float = 3.0
) -> list[int]:
    """End each of ``processes_using(path, names)``; returns their pids."""
    return end(processes_using(path, names), wait_s)


__all__ = ["alive", "children", "end", "ending_processes_using", "processes_using", "same"]
