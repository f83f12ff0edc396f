"""Bundles: one profile folder per machine class and ``bundle.json``, which names them.

``ortpilot tune MODEL --ray ADDRESS -o OUTDIR`` writes a bundle (docs/concepts/fleets.md)::

    OUTDIR/bundle.json
    OUTDIR/x86-avx2-2cpu/profile.json, model.onnx, reference.npz, ...
    OUTDIR/x86-avx2-1cpu/profile.json, ...

``bundle.json`` lists each class (its name, id and key, the facts that decide a winner) with
its folder, the sha256 of every file in it, the winner and its speedup, and the node it was
tuned on; ``complete`` is false when a class could not be tuned (``missing`` says which, and
why). Like a profile it is an input: :func:`read_bundle` accepts only the fields ortpilot
writes and refuses two profiles for one class (exit 2); :func:`check_files` refuses a profile
folder whose files are missing or changed (exit 1). Which class a machine loads is the session
layer's choice (``session.bundle``); the class key itself is ``providers.machineclass``'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortpilot.artifacts import fields as f
from ortpilot.artifacts.atomic import atomic_write_json
from ortpilot.errors import StampMismatchError, UsageError
from ortpilot.modelio import file_sha256

BUNDLE_FILE = "bundle.json"
BUNDLE_FORMAT = "ortpilot-bundle"
BUNDLE_VERSION = 1
PROFILE_FILE = "profile.json"
MAX_BUNDLE_BYTES = 4 * 2**20  # a bundle.json is a few KB per class
MODES = ("one after the other", "at once")


def _folder_name(value: Any, name: str) -> None:
    f.string(value, name, nonempty=True, limit=255)
    if "/" in value or "\\" in value or value.startswith("."):
        raise f.Bad(name, f"must be a folder name inside the bundle, got {value!r}")


def _relative_file(value: Any, name: str) -> None:
    f.string(value, name, nonempty=True, limit=1024)
    parts = value.split("/")
    if value.startswith("/") or "\\" in value or any(p in ("", ".", "..") for p in parts):
        raise f.Bad(name, f"must be a path inside the class folder, got {value!r}")


def _files(value: Any, name: str) -> None:
    f.dict_of(f.sha256)(value, name)
    for key in value:
        _relative_file(key, f"{name} key")
    if PROFILE_FILE not in value:
        raise f.Bad(f.join(name, PROFILE_FILE), "it is missing (every class folder holds its profile)")


_CLASS = f.fields(
    {"name": lambda v, n: f.string(v, n, nonempty=True, limit=256), "id": f.string, "key": f.json_value},
    required=("name", "id", "key"),
)
_NODE = f.fields({"id": f.string, "ip": f.string, "host": f.string})
_ENTRY = f.fields(
    {
        "class": _CLASS,
        "folder": _folder_name,
        "files": _files,
        "winner": f.string,
        "speedup": f.dict_of(f.number),
        "measured_against": f.string,
        "default_best": f.boolean,
        "node": _NODE,
        "attempts": lambda v, n: f.integer(v, n, 1, 1000),
        "wall_s": f.number,
        "start_s": f.number,
        "end_s": f.number,
    },
    required=("class", "folder", "files"),
)
_MISSING = f.fields(
    {"class": _CLASS, "why": f.string, "nodes": f.list_of(f.string)},
    required=("class", "why"),
)
_TOP = f.fields(
    {
        "format": f.string,
        "version": lambda v, n: f.integer(v, n, 1, 2**31),
        "model": f.fields({"name": f.string, "source": f.string, "sha256": f.sha256}),
        "complete": f.boolean,
        "tuned": lambda v, n: _one_of(v, n, MODES),
        "schedule": f.json_value,
        "classes": f.list_of(_ENTRY, limit=1024),
        "missing": f.list_of(_MISSING, limit=1024),
        "ortpilot_version": f.string,
        "onnxruntime": f.string,
    },
    required=("format", "version", "complete", "classes"),
)


def _one_of(value: Any, name: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise f.Bad(name, f"{value!r} is not one of {', '.join(repr(a) for a in allowed)}")


@dataclass(frozen=True)
class BundleEntry:
    """One class of a bundle: its class record (``{name, id, key}``), folder and file hashes."""

    name: str
    id: str
    key: dict[str, Any]
    folder: str
    files: dict[str, str]
    record: dict[str, Any]  # the whole entry as bundle.json holds it

    @property
    def machine_class(self) -> dict[str, Any]:
        return {"name": self.name, "id": self.id, "key": self.key}


@dataclass(frozen=True)
class Bundle:
    """A read bundle.json: where it lies, what it holds."""

    path: Path  # the bundle.json
    doc: dict[str, Any]
    entries: list[BundleEntry]

    @property
    def root(self) -> Path:
        return self.path.parent

    @property
    def complete(self) -> bool:
        return bool(self.doc.get("complete"))

    @property
    def missing(self) -> list[dict[str, Any]]:
        return list(self.doc.get("missing") or [])

    def entry(self, name_or_id: str) -> BundleEntry | None:
        return next((e for e in self.entries if name_or_id in (e.name, e.id)), None)

    def profile_path(self, entry: BundleEntry) -> Path:
        return self.root / entry.folder / PROFILE_FILE

    def names(self) -> list[str]:
        return [e.name for e in self.entries]


def bundle_path(path: str | os.PathLike) -> Path | None:
    """The bundle.json ``path`` names (the file, or a folder holding one); None when it is no bundle."""
    p = Path(path)
    if p.is_dir() and (p / BUNDLE_FILE).is_file():
        return p / BUNDLE_FILE
    if p.name == BUNDLE_FILE and p.is_file():
        return p
    return None


def read_bundle(path: str | os.PathLike) -> Bundle:
    """Parse and check ``bundle.json`` (or the folder holding it); every problem is exit 2 naming the field."""
    p = bundle_path(path) or Path(path)
    if not p.is_file():
        raise UsageError(
            f"'{path}' is not a bundle: it holds no {BUNDLE_FILE}. Write one with 'ortpilot tune MODEL --ray ADDRESS -o DIR'."
        )
    doc = f.read_document(
        p,
        what="Bundle",
        noun="an ortpilot bundle",
        fmt=BUNDLE_FORMAT,
        version=BUNDLE_VERSION,
        limit=MAX_BUNDLE_BYTES,
        fix="write it again with 'ortpilot tune ... --ray'",
    )
    try:
        _TOP(doc, "")
    except f.Bad as bad:
        raise UsageError(
            f"Bundle '{p}' has an invalid field '{bad.field}': {bad.problem}. ortpilot reads only what its "
            "own 'tune --ray' writes; write the bundle again instead of editing it."
        ) from None
    entries = [
        BundleEntry(e["class"]["name"], e["class"]["id"], dict(e["class"]["key"]), e["folder"], dict(e["files"]), e)
        for e in doc["classes"]
    ]
    _refuse_duplicates(p, entries)
    return Bundle(p, doc, entries)


def _refuse_duplicates(path: Path, entries: Sequence[BundleEntry]) -> None:
    """One profile per class: two entries with one class (by id or name), or one folder twice, is exit 2."""
    for attr, what in (("id", "class"), ("name", "class"), ("folder", "folder")):
        seen: dict[str, BundleEntry] = {}
        for entry in entries:
            value = getattr(entry, attr)
            if value in seen:
                first = seen[value]
                raise UsageError(
                    f"Bundle '{path}' lists two profiles for one {what}: '{first.folder}/' and '{entry.folder}/' are "
                    f"both filed under {what} {value!r}. A bundle holds one profile per machine class, so a "
                    "machine of that class could load either; write the bundle again with 'ortpilot tune ... "
                    "--ray'."
                )
            seen[value] = entry


def check_files(bundle: Bundle, entry: BundleEntry) -> None:
    """Every file ``entry`` lists is there, a plain file inside its folder, with its sha256; exit 1 if not."""
    folder = bundle.root / entry.folder
    real_folder = Path(os.path.realpath(folder))
    for rel, digest in entry.files.items():
        file = folder / rel
        what = "profile" if rel == PROFILE_FILE else f"file '{rel}'"
        inside = Path(os.path.realpath(file)).is_relative_to(real_folder) and not folder.is_symlink()
        if not file.is_file() or file.is_symlink() or not inside:
            raise StampMismatchError(
                f"Bundle '{bundle.path}': the {what} of class {entry.name} ('{file}') is missing"
                f"{'' if not file.exists() else ' or not a plain file inside its folder'}. A bundle is written "
                "whole by 'ortpilot tune --ray'; restore the folder, or tune that class again."
            )
        got = file_sha256(file)
        if got != digest:
            raise StampMismatchError(
                f"Bundle '{bundle.path}': the {what} of class {entry.name} ('{file}') changed since the bundle "
                f"was written (sha256 {got[:12]}…, bundle.json says {digest[:12]}…). Restore it, or tune that "
                "class again; an edited profile is not the one that was measured."
            )


def hash_folder(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every plain file under ``folder`` (links and hidden names left out)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or path.is_symlink() or not path.is_file():
            continue
        out[rel.as_posix()] = file_sha256(path)
    return out


def write_bundle(
    root: str | os.PathLike,
    entries: Sequence[Mapping[str, Any]],
    *,
    model: Mapping[str, Any],
    missing: Sequence[Mapping[str, Any]] = (),
    tuned: str,
    schedule: Mapping[str, Any],
    onnxruntime: str,
) -> Path:
    """``ROOT/bundle.json`` for the class folders already in ROOT (each entry's ``folder``), their files
    hashed now; ``complete`` only when nothing is ``missing``. Written atomically, last."""
    from ortpilot.artifacts.profile import ortpilot_version

    root = Path(root)
    classes = []
    for entry in entries:
        files = hash_folder(root / str(entry["folder"]))
        classes.append({**entry, "files": files})
    doc = {
        "format": BUNDLE_FORMAT,
        "version": BUNDLE_VERSION,
        "model": dict(model),
        "complete": not missing,
        "tuned": tuned,
        "schedule": dict(schedule),
        "classes": classes,
        "missing": [dict(m) for m in missing],
        "ortpilot_version": ortpilot_version(),
        "onnxruntime": onnxruntime,
    }
    try:
        _TOP(doc, "")
    except f.Bad as bad:  # what ortpilot writes it must read back
        raise AssertionError(f"bundle.json would not read back: {bad.field}: {bad.problem}") from None
    return atomic_write_json(root / BUNDLE_FILE, doc)


__all__ = [
    "BUNDLE_FILE",
    "BUNDLE_FORMAT",
    "MODES",
    "PROFILE_FILE",
    "Bundle",
    "BundleEntry",
    "bundle_path",
    "check_files",
    "hash_folder",
    "read_bundle",
    "write_bundle",
]
