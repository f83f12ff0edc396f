"""Write files so that a crash or Ctrl-C never leaves a half-written one.

Each write goes to a temp file in the destination folder, is fsynced, then renamed over the
destination (rename is atomic within one filesystem). The temp file (``.NAME.XXXXXXXX.tmp``)
is ``flock``-ed by its writer until the rename, so :func:`sweep_temp_files` can tell the temp
file of a writer that was killed (SIGKILL, power loss) from one that is still being written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import glob
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import onnx

from ortpilot.artifacts.oserrors import fix_for, storage_errors
from ortpilot.artifacts.scratch import LOCK_NAME, scratch_dir
from ortpilot.errors import StorageError, UsageError
from ortpilot.modelio import set_ir_for_running_ort

_TWO_GB = 2**31 - 1
TEMP_SUFFIX = ".tmp"
# What ``tempfile.mkstemp(prefix=f".{name}.", suffix=TEMP_SUFFIX)`` makes: a dot, the destination's
# name, a dot, eight characters from tempfile's alphabet, ``.tmp``. Nothing else is ours to sweep.
_TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX) + r"$")


def check_output_path(path: str | os.PathLike, what: str = "Output", example: str = "model.onnx") -> Path:
    """Refuse an output path that cannot be written, before any work is done: exit 2, not a traceback.

    The destination must not be a directory, and its nearest existing ancestor must be a
    writable directory (missing folders below it are created when the file is written).
    Nothing is created here, so a command that fails later leaves no empty folders behind.
    """
    dest = Path(path)
    if not dest.name or dest.is_dir():
        raise UsageError(
            f"{what} '{dest}' is a directory; give the path of the file to write, e.g. '{dest / example}'."
        )
    _check_writable_parent(dest, what)
    return dest


def _check_writable_parent(dest: Path, what: str) -> None:
    """The nearest existing ancestor of ``dest``'s folder must be a writable folder."""
    parent = dest.parent
    while not parent.exists() and parent != parent.parent:
        if parent.is_symlink():  # a dangling link: mkdir would fail on it
            raise UsageError(f"{what} '{dest}': '{parent}' is a broken symbolic link; fix it or choose another folder.")
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(
            f"{what} '{dest}' cannot be written: '{parent}' is a file, not a folder. "
            "Choose a path inside an existing or new folder."
        )
    if _read_only(parent):
        raise StorageError(
            f"{what} '{dest}' cannot be written: folder '{parent}' is on a read-only filesystem "
            f"(EROFS). {fix_for(dest, space=False)}",
            errno=errno.EROFS,
            path=str(dest),
        )
    if _holds_no_files(parent):  # /proc: writable by mode bits (root), yet no file can be made there
        raise StorageError(
            f"{what} '{dest}' cannot be written: folder '{parent}' is on a virtual filesystem that holds no "
            f"files (such as /proc). {fix_for(dest, space=False)}",
            errno=errno.ENOENT,
            path=str(dest),
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StorageError(
            f"{what} '{dest}' cannot be written: folder '{parent}' is not writable by this user "
            f"(EACCES). {fix_for(dest, space=False)}",
            errno=errno.EACCES,
            path=str(dest),
        )
    return dest


def _holds_no_files(folder: Path) -> bool:
    """A pseudo-filesystem (proc, sysfs): statvfs reports no blocks at all."""
    try:
        return os.statvfs(folder).f_blocks == 0
    except OSError:
        return False


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[BinaryIO]:
    """Open a temp file next to ``path``; on clean exit fsync and rename it to ``path``.

    An unwritable destination (a directory, a file where a folder belongs) raises
    ``UsageError`` before any temp file exists.
    """
    dest = check_output_path(path)
    with storage_errors(dest):  # a full disk, a read-only mount: a message naming dest, not a traceback
        dest.parent.mkdir(parents=True, exist_ok=True)
        sweep_temp_files(dest.parent, destination=dest.name)  # what a killed write of this file left
        # mkstemp opens with O_EXCL: never through a planted link; the rename replaces a link at dest
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=TEMP_SUFFIX, dir=dest.parent)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until the rename: marks the temp file as alive
            os.fchmod(fd, _default_mode())  # mkstemp makes 0600; a saved model should follow the umask
            with os.fdopen(fd, mode) as fh:
                yield fh  # type: ignore[misc]
                fh.flush()
                os.fsync(fh.fileno())
                os.replace(tmp, dest)  # still locked, so a sweep never takes a finished temp file
            _fsync_dir(dest.parent)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """Build a folder in a scratch folder beside ``path``; on clean exit it becomes ``path``.

    Readers (a server polling a model repository) see the old folder or the new one, never a
    half-built one. An existing non-empty folder raises UsageError unless ``replace``; then it is
    renamed aside and removed once the new one is in place (a crash between the two renames
    leaves it as ``.NAME.old-XXXXXXXX``, never a mix). The scratch folder of a killed build is
    swept by the next build of the same ``path``.
    """
    dest = Path(path)
    check_dir_destination(dest, replace=replace)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with scratch_dir(f".{dest.name}.", root=dest.parent) as tmp:
        yield tmp
        os.unlink(tmp / LOCK_NAME)  # the folder is ours until renamed; its lock must not move with it
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a built folder follows the umask, as mkdir does
        if dest.is_dir() and any(dest.iterdir()):
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.replace(dest, old)
            os.replace(tmp, dest)
            _fsync_dir(dest.parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)  # onto nothing, or onto an empty folder
            _fsync_dir(dest.parent)


def check_dir_destination(dest: Path, *, replace: bool) -> None:
    """Refuse a folder destination that is a file, or that holds files and may not be replaced."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"'{dest}' is a file; the output must be a folder. Choose another path.")
    if not replace and dest.is_dir() and any(dest.iterdir()):
        raise UsageError(f"'{dest}' exists and is not empty; replace it explicitly or choose another folder.")
    _check_writable_parent(dest, "Output folder")


def is_temp_name(name: str) -> bool:
    """Whether a file name is one :func:`atomic_open` makes for its temp files (``.NAME.XXXXXXXX.tmp``)."""
    return bool(_TEMP_NAME.match(name))


def sweep_temp_files(folder: str | os.PathLike, min_age_s: float = 1.0, destination: str | None = None) -> list[Path]:
    """Remove the temp files that killed atomic writes left in ``folder``; return what was removed.

    Every atomic write sweeps those of its own destination first (``destination``: that file's
    name), so a killed ``optimize -o m.onnx`` is cleaned up by the next write of ``m.onnx``.
    Only files directly in ``folder`` whose names match ortpilot's own temp naming, whose
    writer's lock is free (the writer is gone: a live writer holds it until its rename) and
    that are at least ``min_age_s`` old (covering the instant between a writer's ``mkstemp`` and
    its lock). Anything else, other programs' files included, is left alone. A missing folder
    is not an error.
    """
    root = Path(folder)
    if not root.is_dir():
        return []
    removed = []
    own = (
        re.compile(r"^\." + re.escape(destination) + r"\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX) + r"$")
        if destination is not None
        else _TEMP_NAME
    )
    candidates = root.glob(f".{glob.escape(destination)}.*{TEMP_SUFFIX}") if destination is not None else root.iterdir()
    for path in sorted(candidates):
        if own.match(path.name) and _is_stale(path, min_age_s):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    return removed


def _is_stale(path: Path, min_age_s: float) -> bool:
    """A regular file, old enough, whose lock nobody holds (checked without blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # gone, a link, or unreadable: not ours to judge
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or time.time() - info.st_mtime < min_age_s:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live writer holds it
            return False
        return True
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=1)
def _umask() -> int:
    """The process's umask, read once (os.umask can only be read by setting it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _default_mode() -> int:
    """0666 minus the umask: what a new file gets."""
    return 0o666 & ~_umask()


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_open(path, "wb") as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def atomic_write_model(model: onnx.ModelProto, path: Path) -> Path:
    """Serialize a model atomically; models over 2 GB get one external data file beside them."""
    path = check_output_path(path)
    if model.ByteSize() < _TWO_GB:
        return atomic_write_bytes(path, model.SerializeToString())
    data_name = path.name + ".data"
    with storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        tmp_model = tmp_dir / path.name
        with storage_errors(path):
            onnx.save_model(
                model,
                str(tmp_model),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data_name,
                size_threshold=1024,
            )
            # Two renames: the old model goes first, so a crash between them leaves no model.onnx (a load says
            # it is missing) rather than the old one reading the new weights file.
            path.unlink(missing_ok=True)
            os.replace(tmp_dir / data_name, path.parent / data_name)
            os.replace(tmp_model, path)
        _fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return path


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Save atomically (temp file + fsync + rename), lowering the IR version if needed.

    Models over 2 GB are written with external data next to them.
    """
    dest = check_output_path(path)  # a directory or an unwritable folder: UsageError, nothing written
    set_ir_for_running_ort(model)
    return atomic_write_model(model, dest)
