"""Child processes that never outlive the command that started them.

ortpilot runs ORT in children (``--isolate``, the tune worker) in their own session, so that a
terminal's Ctrl-C reaches only the parent, which then stops them. Two gaps made orphans:
an interrupt arriving while ``subprocess.Popen`` was still starting the child (the exception
left ``Popen`` before the caller held the process, so nobody killed it), and a parent killed
outright (SIGKILL, OOM), whose ``finally`` never runs. :func:`spawn` defers SIGINT, SIGTERM and
SIGHUP until the caller has recorded the child, and :func:`die_with_parent` (called first thing
in the child) asks Linux to SIGKILL the child when its parent dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

PARENT_ENV = "ORTPILOT_PARENT_PID"
_DEFERRED = ("SIGINT", "SIGTERM", "SIGHUP")
_PR_SET_PDEATHSIG = 1


def spawn(
    cmd: Sequence[str],
    keep: Callable[[subprocess.Popen], None],
    *,
    env: dict[str, str] | None = None,
    **popen_kwargs: Any,
) -> subprocess.Popen:
    """Start ``cmd`` in a new session; ``keep(proc)`` records it before any deferred signal is raised.

    The child finds the parent's PID in ``$ORTPILOT_PARENT_PID`` for :func:`die_with_parent`.
    """
    child_env = dict(os.environ if env is None else env)
    child_env[PARENT_ENV] = str(os.getpid())
    with _signals_deferred() as pending:
        proc = subprocess.Popen(list(cmd), env=child_env, start_new_session=True, **popen_kwargs)
        keep(proc)
    for signum in pending:  # now whoever handles the interrupt finds the child and stops it
        signal.raise_signal(signum)
    return proc


@contextlib.contextmanager
def child_process(cmd: Sequence[str], **popen_kwargs: Any) -> Iterator[subprocess.Popen]:
    """``spawn`` for a child that lives within one block: stopped (its whole group) and reaped on exit."""
    held: list[subprocess.Popen] = []
    try:
        yield spawn(cmd, held.append, **popen_kwargs)
    finally:
        for proc in held:
            stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (it leads one: ``spawn`` starts a new session) and reap it."""
    if proc.returncode is None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    proc.wait()


def die_with_parent() -> None:
    """In the child: be killed when the parent dies, and exit now if it already has (Linux only)."""
    expected = os.environ.get(PARENT_ENV, "")
    if not sys.platform.startswith("linux") or not expected.isdigit():
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(expected):  # the parent died before the request above took effect
        os._exit(1)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[list[int]]:
    """Record SIGINT/SIGTERM/SIGHUP instead of raising them inside the block; yield the recorded ones."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending  # handlers can only be set in the main thread, where signals are handled anyway
        return
    previous: dict[int, Any] = {}
    for name in _DEFERRED:
        signum = getattr(signal, name, None)
        if signum is None:
            continue
        old = signal.getsignal(signum)
        if old is None or old == signal.SIG_IGN:  # set outside Python, or ignored: leave it alone
            continue
        previous[signum] = old
        signal.signal(signum, lambda num, frame: pending.append(num))
    try:
        yield pending
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
