"""What is left of a server when Ray's own processes stop before it does.

A local server's Ray instance (``gcs_server``, ``raylet`` and Ray's Python helpers) runs as children of the
``ortpilot serve`` process, in its process group, so a SIGTERM sent to the whole group (``kill -TERM
-PGID``, a process manager that signals the group) stops them at the same moment as the server (the
helpers at once, the head within ~10 s): nothing is left to drain through, Ray's own calls wait 60 s for
the head and then end the process with exit 1, and the HAProxy that Ray's proxy manager started, in a
session of its own, lives on holding the port. The server notes Ray's processes when it starts them
(``children``), watches them while it stops (``alive``), and ends every process whose command line names
its run folder (HAProxy's config is there: ``ending_processes_using``). Linux ``/proc``; elsewhere these
find nothing. No Ray.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, command name, state) of ``pid`` from ``/proc/PID/stat``; None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    state, ppid = text[text.rindex(")") + 2 :].split()[:2]
    return int(ppid), name, state


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    stat = _stat(pid)
    return stat is not None and stat[2] not in ("Z", "X")


def children(parent: int | None = None) -> list[int]:
    """The live children of ``parent`` (this process)."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in PROC.glob("[0-9]*") if PROC.is_dir() else ():
        stat = _stat(int(entry.name))
        if stat is not None and stat[0] == parent and stat[2] not in ("Z", "X"):
            found.append(int(entry.name))
    return sorted(found)


def processes_using(path: str | os.PathLike) -> list[int]:
    """The processes (other than this one) whose command line names ``path`` or a file under it."""
    needle = os.fsencode(os.fspath(path))
    found = []
    for entry in PROC.glob("[0-9]*") if PROC.is_dir() else ():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return sorted(found)


def end(pids: list[int], wait_s: float = 3.0) -> list[int]:
    """SIGTERM to each of ``pids``, SIGKILL to those still running after ``wait_s``; returns the pids ended."""
    ended = []
    for pid in pids:
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
            except ProcessLookupError:
                pass
    return ended


def ending_processes_using(path: str | os.PathLike, wait_s: float = 3.0) -> list[int]:
    """End every process whose command line names ``path`` (``processes_using``); returns their pids."""
    return end(processes_using(path), wait_s)


__all__ = ["alive", "children", "end", "ending_processes_using", "processes_using"]
