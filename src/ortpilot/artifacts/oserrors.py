"""Operating-system errors as messages: a full disk, a read-only folder, no permission, a file in the way.

An ``OSError`` from a write says "[Errno 28] No space left on device" and a traceback; what a
user needs is which path, why, and what to change. :func:`storage_errors` turns the OS errors a
machine's state causes (not a bug's) into ``StorageError`` (exit 2) naming the path, the errno
and the fix, chosen by where the path lies: the model cache (``ORTPILOT_CACHE_DIR``), the
temp folder (``TMPDIR``) or an output (``-o``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path

from ortpilot.artifacts.cachedir import configured_cache_root
from ortpilot.errors import StorageError

# Errors that a machine's state causes, not a bug: these become messages, anything else stays a bug.
ENVIRONMENTAL = frozenset(
    getattr(errno, name)
    for name in (
        "ENOSPC",
        "EDQUOT",
        "EROFS",
        "EACCES",
        "EPERM",
        "ENOTDIR",
        "EISDIR",
        "EEXIST",
        "ENAMETOOLONG",
        "ELOOP",
        "EMLINK",
        "EFBIG",
        "ETXTBSY",
        "ENOTEMPTY",
    )
    if hasattr(errno, name)
)
_SPACE = ("ENOSPC", "EDQUOT", "EFBIG")  # errors that freeing space there would fix
_WHY = {
    "ENOSPC": "the filesystem holding it is full{free}",  # free: counted after the partial file went
    "EDQUOT": "this user's disk quota there is used up{free}",
    "EFBIG": "the file would be larger than that filesystem allows",
    "EROFS": "that filesystem is mounted read-only",
    "EACCES": "this user may not write there",
    "EPERM": "this user may not write there",
    "ENOTDIR": "a file stands where a folder is needed",
    "EISDIR": "a folder stands where a file is needed",
    "EEXIST": "something else already stands at that name",
    "ENOTEMPTY": "a folder that should be replaced is not empty",
    "ENAMETOOLONG": "the path is too long for that filesystem",
    "ELOOP": "a symbolic link stands in the way (ortpilot does not follow links where it writes)",
    "ENOENT": "no folder can be made on that path (a virtual filesystem such as /proc, or a folder on it vanished)",
}


def is_environmental(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in ENVIRONMENTAL


def storage_error(exc: OSError, path: str | os.PathLike | None = None, doing: str = "write") -> StorageError:
    """A ``StorageError`` for ``exc``: the path, the errno, why, and the fix for that kind of path."""
    target = str(path if path is not None else (exc.filename or "?"))
    code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    free = free_bytes(target)
    why = _WHY.get(code, exc.strerror or str(exc)).format(
        free=f" ({free} bytes free without the partial file)" if free is not None else ""
    )
    return StorageError(
        f"Could not {doing} '{target}': {exc.strerror or exc} ({code}): {why}. {fix_for(target, space=code in _SPACE)}",
        errno=exc.errno,
        path=target,
    )


@contextlib.contextmanager
def storage_errors(path: str | os.PathLike, doing: str = "write", also: Collection[int] = ()) -> Iterator[None]:
    """Turn environmental ``OSError`` inside the block into ``StorageError`` about ``path``; ``also``: errnos
    that are the machine's state in this block alone (``ENOENT`` from creating a folder)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in ENVIRONMENTAL and exc.errno not in also:
            raise
        raise storage_error(exc, path, doing) from None


def fix_for(path: str | os.PathLike, space: bool = True) -> str:
    """What to change, by where ``path`` lies: the cache, the temp folder, or an output the user chose.
    ``space``: the error was a full disk or quota, so freeing space there is a fix too."""
    where = _real(path)
    cache = _cache_dir()
    if cache is not None and _under(where, cache):
        fix = (
            "point ORTPILOT_CACHE_DIR at a writable folder with room (commands that build models also take --no-cache)."
        )
    elif any(
        _under(where, tmp) and (where == tmp or where.relative_to(tmp).parts[0].startswith("ortpilot-"))
        for tmp in _temp_dirs()
    ):
        fix = "set TMPDIR to a writable folder with room."  # ortpilot's own scratch
    else:
        fix = "write somewhere else (choose another path with -o)."
    return f"Free space there, or {fix}" if space else fix[0].upper() + fix[1:]


def _temp_dirs() -> list[Path]:
    """Where scratch folders are made: the folders TMPDIR/TEMP/TMP name, then the one Python settled on. Not
    ``tempfile.gettempdir()`` alone: asked first once the temp folder is full, it probes it, fails to write,
    and answers another folder, so a full TMPDIR would not be named."""
    named = [os.environ.get(name) for name in ("TMPDIR", "TEMP", "TMP")]
    return [_real(p) for p in [*named, tempfile.gettempdir()] if p]


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes free to this user on the filesystem of ``path`` (its nearest existing ancestor)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        info = os.statvfs(probe)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def _cache_dir() -> Path | None:
    """The cache root as configured, without creating it (this runs while reporting an error)."""
    return _real(configured_cache_root()[0])


def _real(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(path))


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
