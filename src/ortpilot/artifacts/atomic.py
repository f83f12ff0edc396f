"""Write files so that a crash or Ctrl-C never leaves a half-written one.

Each write goes to a temp file in the destination folder, is fsynced, then renamed over the
destination (rename is atomic within one filesystem).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import onnx

_TWO_GB = 2**31 - 1


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[BinaryIO]:
    """Open a temp file next to ``path``; on clean exit fsync and rename it to ``path``."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        os.fchmod(fd, _default_mode())  # mkstemp makes 0600; a saved model should follow the umask
        with os.fdopen(fd, mode) as fh:
            yield fh  # type: ignore[misc]
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@functools.lru_cache(maxsize=1)
def _default_mode() -> int:
    """0666 minus the umask, read once (os.umask can only be read by setting it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


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
    if model.ByteSize() < _TWO_GB:
        return atomic_write_bytes(path, model.SerializeToString())
    data_name = path.name + ".data"
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        tmp_model = tmp_dir / path.name
        onnx.save_model(model, str(tmp_model), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
        os.replace(tmp_dir / data_name, path.parent / data_name)
        os.replace(tmp_model, path)
        _fsync_dir(path.parent)
    finally:
        import shutil

        shutil.rmtree(tmp_dir, ignore_errors=True)
    return path
