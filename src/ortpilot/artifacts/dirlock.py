"""One writer per output folder: an ``flock`` on the folder itself, naming its holder when taken.

Two tunes on one OUTDIR used to interleave one journal and overwrite each other's files. The
lock is on the folder's own file descriptor, so nothing is written to take it and nothing is
left behind; the kernel drops it when its holder dies, however it dies. The holder's PID comes
from ``/proc/locks`` (Linux), so the refusal can name it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ortpilot.artifacts.oserrors import storage_errors
from ortpilot.errors import UsageError

_TRIES = 5


@contextlib.contextmanager
def one_writer(folder: Path, what: str) -> Iterator[None]:
    """Hold ``folder`` (created if missing) for the block; another holder raises ``UsageError`` naming its PID.

    Folders this created are removed again when the block leaves them empty (a tune that failed
    on bad input leaves no empty OUTDIR behind).
    """
    created = [p for p in [folder, *folder.parents] if not p.exists()]
    with storage_errors(folder, "create the output folder", also=(errno.ENOENT,)):
        folder.mkdir(parents=True, exist_ok=True)
    fd = _lock(folder, what)
    try:
        yield
    finally:
        for path in created:  # innermost first; stops at the first one that is not empty
            try:
                path.rmdir()
            except OSError:
                break
        os.close(fd)


def _lock(folder: Path, what: str) -> int:
    for _ in range(_TRIES):
        with storage_errors(folder, "open the output folder"):
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = holder_pid(fd)
            os.close(fd)
            who = f"process {holder}" if holder else "another process"
            raise UsageError(
                f"Another {what} ({who}) is writing into '{folder}'; two at once would interleave "
                f"its journal and overwrite each other's files. Wait for it to finish (or stop it"
                f"{f': kill {holder}' if holder else ''}), or choose another -o folder."
            ) from None
        try:
            same = os.stat(folder).st_ino == os.fstat(fd).st_ino  # not removed and remade meanwhile
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
        with storage_errors(folder, "create the output folder", also=(errno.ENOENT,)):
            folder.mkdir(parents=True, exist_ok=True)
    raise UsageError(
        f"The output folder '{folder}' kept being removed and recreated while ortpilot tried to lock it; "
        "choose another -o folder."
    )


def holder_pid(fd: int) -> int | None:
    """The PID holding an flock on the file behind ``fd``, from ``/proc/locks`` (None elsewhere, or if gone)."""
    info = os.fstat(fd)
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == device and parts[4].isdigit():
                    return int(parts[4])
    except OSError:
        pass
    return None
