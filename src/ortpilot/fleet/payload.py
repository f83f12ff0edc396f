"""Folders as bytes, for Ray's object store: the model a node tunes, the folder it sends back.

A fleet tune shares no filesystem with its nodes: the driver packs the model (its file, its
external data, and the small files of its model folder that the search reads: config.json,
tokenizer and pooling configs) into one tar, ``ray.put`` s it once, and each search unpacks it
on its node; the search packs its profile folder (and, as it goes, its journal) the same way
back. Unpacking takes regular files and folders only, at relative paths inside the
destination: a tar with a link, a device or a ``..`` path is refused, never extracted.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path

from ortpilot.errors import UsageError

SIDE_FILE_BYTES = 16 * 2**20  # a model folder's config and tokenizer files; larger ones are left home
SIDE_SUFFIXES = (".json", ".txt", ".model", ".jinja")


def pack(files: Iterable[tuple[str, Path]]) -> bytes:
    """A tar of ``(name inside the tar, file on disk)`` pairs."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, path in files:
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
    return buffer.getvalue()


def folder_files(folder: Path, keep: Callable[[str], bool] = lambda rel: True) -> list[tuple[str, Path]]:
    """Every plain file under ``folder`` whose relative path ``keep`` accepts (links left out)."""
    out = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and not path.is_symlink() and keep(rel):
            out.append((rel, path))
    return out


def unpack(data: bytes, dest: Path) -> list[str]:
    """Extract ``data`` (a tar from :func:`pack`) into ``dest``; returns the names extracted."""
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for info in tar.getmembers():
            parts = info.name.split("/")
            if (
                info.name.startswith("/")
                or any(p in ("", ".", "..") for p in parts)
                or not (info.isfile() or info.isdir())
            ):
                raise UsageError(
                    f"A fleet search sent back '{info.name}', which is not a plain file inside its folder."
                )
            if info.isdir():
                (dest / info.name).mkdir(parents=True, exist_ok=True)
                continue
            target = dest / info.name
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(info)
            assert source is not None  # a regular file's member
            with open(target, "wb") as fh:
                while block := source.read(1 << 20):
                    fh.write(block)
            names.append(info.name)
    return names


def model_payload(path: Path) -> tuple[bytes, str]:
    """(a tar of the model and what its search reads beside it, the model's name inside the tar)."""
    from ortpilot.data import folder_of
    from ortpilot.modelio import external_data_files, load_model

    path = Path(path)
    folder = folder_of(path)
    root = Path(folder.root) if folder is not None else path.parent
    model_rel = os.path.relpath(path, root).replace(os.sep, "/")
    if model_rel.startswith(".."):
        root, model_rel = path.parent, path.name
    files = [(model_rel, path)]
    base = Path(model_rel).parent
    for location in sorted(external_data_files(load_model(path, load_external_data=False))):
        files.append(((base / location).as_posix(), path.parent / location))
    if folder is not None:
        taken = {name for name, _ in files}
        files += [
            (rel, p)
            for rel, p in folder_files(root, lambda rel: rel.endswith(SIDE_SUFFIXES) and rel.count("/") <= 2)
            if rel not in taken and p.stat().st_size <= SIDE_FILE_BYTES
        ]
    return pack(files), model_rel


__all__ = ["folder_files", "model_payload", "pack", "unpack"]
