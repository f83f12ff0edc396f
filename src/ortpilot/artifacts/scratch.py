"""Scratch folders under $TMPDIR that a killed process does not leave behind for good.

``tempfile.TemporaryDirectory`` cleans up on return and on exceptions, not on SIGKILL or an OOM
kill; a tune's scratch folder holds candidate models (hundreds of MB for a decoder) and would
stay until reboot. Each folder made here holds an ``flock``-ed ``.lock`` file for its owner's
lifetime; making a new folder first removes older folders of the same prefix whose lock is free,
i.e. whose owner is gone. Only folders named as ``mkdtemp`` names them, holding that lock file as
a regular file of this user, are candidates; anything else is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ortpilot.artifacts.oserrors import storage_errors

LOCK_NAME = ".ortpilot-scratch.lock"
_MKDTEMP_TAIL = re.compile(r"^[a-z0-9_]{8}$")  # what tempfile.mkdtemp appends to the prefix


@contextlib.contextmanager
def scratch_dir(prefix: str, root: str | os.PathLike | None = None) -> Iterator[Path]:
    """A fresh folder ``ROOT/PREFIX*`` (ROOT: $TMPDIR), removed on exit; its orphans from killed runs
    are swept first."""
    sweep_scratch_dirs(prefix, root=root)
    with storage_errors(Path(root or tempfile.gettempdir()) / f"{prefix}*", "create a scratch folder"):
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        try:
            fd = os.open(path / LOCK_NAME, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)


def sweep_scratch_dirs(prefix: str, min_age_s: float = 1.0, root: str | os.PathLike | None = None) -> list[Path]:
    """Remove ``PREFIX*`` folders in ``root`` (default $TMPDIR) whose owner is gone; return them."""
    base = Path(root or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for path in sorted(base.glob(f"{prefix}*")):
            if _MKDTEMP_TAIL.match(path.name[len(prefix) :]) and _orphaned(path, min_age_s):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def _orphaned(path: Path, min_age_s: float) -> bool:
    """A real folder of ours (our lock file, a regular file of this user), old enough, unlocked."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:  # O_NONBLOCK: a FIFO planted under the lock's name must not hang the sweep
        fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # no lock file: not made here (or being made this instant)
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or time.time() - info.st_mtime < min_age_s:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its owner is alive
            return False
        return True
    finally:
        os.close(fd)
