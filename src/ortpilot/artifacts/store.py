"""The content-addressed model cache: built once, verified on every read, safe to share.

An entry lives in ``cache_root()/models/<key>/`` with ``model.onnx`` and ``entry.json`` (the
model's sha256 and what built it). The key is the sha256 of everything that decides the
bytes: source model hash, ORT version, EP and its options, level, free-dimension overrides,
CPU features. Reads re-hash the model; a corrupt entry is discarded with a warning and
rebuilt. Entries are built in a temp folder and renamed into place, under a per-entry
``fcntl`` lock, so a crash leaves nothing half-written and two processes sharing the cache
both end up with the same, complete entry. A builder holds its entry's lock for as long as
its ``.build-*`` folder exists, so a build folder whose lock can be taken belongs to a
builder that was killed; the next ``get_or_create`` removes it (and any ``.trash-*`` folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ortpilot.artifacts.atomic import atomic_write_json
from ortpilot.artifacts.cache import cache_root, is_shared, make_shared_dir, share
from ortpilot.artifacts.oserrors import storage_errors
from ortpilot.errors import UsageError
from ortpilot.modelio import file_sha256

log = logging.getLogger("ortpilot")
MODEL_FILE = "model.onnx"
ENTRY_FILE = "entry.json"
BUILD_PREFIX = ".build-"
TRASH_PREFIX = ".trash-"
KEY_CHARS = 16  # of the key in a build folder's name
STALE_WITHOUT_LOCK_S = 3600.0  # a build folder with no lock file to test is removed after this long


def cache_key(
    *,
    model_sha256: str,
    ort_version: str,
    providers: Sequence[Mapping[str, Any]] | Sequence[str],
    level: str,
    free_dimension_overrides: Mapping[str, int] | None = None,
    cpu: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """sha256 over a canonical JSON of every input that decides the cached model's bytes."""
    doc = {
        "model": model_sha256,
        "ort": ort_version,
        "providers": list(providers),
        "level": level,
        "free_dims": dict(sorted((free_dimension_overrides or {}).items())),
        "cpu": dict(cpu or {}),
        "extra": dict(extra or {}),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class ModelStore:
    """Cache of built models keyed by :func:`cache_key`."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root) if root else cache_root() / "models"

    def entry_dir(self, key: str) -> Path:
        return self.root / key

    @property
    def shared(self) -> bool:
        """The cache folder is group-writable: entries of other group members are served, and ours are shared."""
        return is_shared(self.root) or is_shared(self.root.parent)

    def holds(self, key: str) -> bool:
        """Whether an entry's model file is there (unchecked: ``get`` checks it when it serves it)."""
        return (self.entry_dir(key) / MODEL_FILE).is_file()

    def get(self, key: str, expect: Mapping[str, Any] | None = None) -> Path | None:
        """The cached model's path, or None; an entry that fails its checks is removed (with a warning).

        Checked before it is served: a real folder (a planted link is never followed), owned by this
        user unless the cache is shared, its record naming this key and, for every item of
        ``expect`` (what builds it: source hash, pass record), the same value; its model's hash.
        """
        folder = self.entry_dir(key)
        model = folder / MODEL_FILE
        try:
            info = folder.lstat()
        except FileNotFoundError:
            return None
        self._check_owner(folder, info)
        problem = "it is a symbolic link, not a folder" if stat.S_ISLNK(info.st_mode) else self._problem(key, expect)
        if problem is None:
            return model
        log.warning("Cache entry %s is not what this build needs (%s); discarding and rebuilding it.", folder, problem)
        self.discard(key)
        return None

    def _problem(self, key: str, expect: Mapping[str, Any] | None) -> str | None:
        folder = self.entry_dir(key)
        try:
            record = json.loads(_read_no_follow(folder / ENTRY_FILE))
            if not isinstance(record, dict) or record.get("key") != key:
                return "its record names another key"
            stored = record.get("meta") if isinstance(record.get("meta"), dict) else {}
            differs = [k for k, v in (expect or {}).items() if _canonical(stored.get(k)) != _canonical(v)]
            if differs:
                return f"it was built from another {', '.join(differs)}"
            model = folder / MODEL_FILE
            if model.is_symlink() or not model.is_file() or file_sha256(model) != record.get("sha256"):
                return "corrupt: the model's content hash does not match its record"
        except (OSError, ValueError, TypeError):
            return "corrupt: its record is unreadable"
        return None

    def _check_owner(self, folder: Path, info: os.stat_result) -> None:
        if info.st_uid != os.getuid() and not self.shared:
            raise UsageError(
                f"Cache entry '{folder}' belongs to user id {info.st_uid}, not to you (user id "
                f"{os.getuid()}), and the cache '{self.root.parent}' is not shared (not group-writable): "
                "ortpilot serves only models its user built or a group shares. Remove the entry, make "
                "the cache folder group-writable to share it, or point ORTPILOT_CACHE_DIR elsewhere."
            )

    def discard(self, key: str) -> None:
        folder = self.entry_dir(key)
        if folder.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                folder.unlink()  # the link only, never what it points at
            return
        if folder.exists():
            trash = folder.with_name(f"{TRASH_PREFIX}{key}-{os.getpid()}-{time.monotonic_ns()}")
            with contextlib.suppress(OSError):
                os.replace(folder, trash)
                folder = trash
            shutil.rmtree(folder, ignore_errors=True)

    def read_entry(self, key: str) -> dict[str, Any]:
        return json.loads(_read_no_follow(self.entry_dir(key) / ENTRY_FILE))

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive per-entry lock (fcntl), so only one process builds an entry at a time.

        The lock file is opened read-only and never through a link: flock needs no write access,
        so members of a shared cache can lock files another member created.
        """
        lock_dir = self.root / ".locks"
        make_shared_dir(lock_dir, self.shared)
        path = lock_dir / f"{key}.lock"
        with storage_errors(path, "lock"):
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o666 if self.shared else 0o644)
        try:
            if self.shared:
                share(path)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def sweep(self) -> list[Path]:
        """Remove what killed processes left: build folders nobody holds the lock of, trash folders.

        Safe while other processes build: a live builder holds its entry's lock until its build
        folder is gone, so a folder listed before its lock could be taken here is an orphan.
        """
        removed = []
        for folder in self.leftovers():
            if folder.name.startswith(BUILD_PREFIX) and not self._orphaned(folder):
                continue
            shutil.rmtree(folder, ignore_errors=True)  # a trash folder is garbage whoever deletes it
            if not folder.exists():
                removed.append(folder)
        if removed:
            log.info("Removed %d folder(s) left in the cache by killed builds.", len(removed))
        return removed

    def _orphaned(self, folder: Path) -> bool:
        """True when no live process is building into ``folder`` (its entry's lock is free)."""
        prefix = folder.name[len(BUILD_PREFIX) : len(BUILD_PREFIX) + KEY_CHARS]
        locks = sorted((self.root / ".locks").glob(f"{prefix}*.lock")) if len(prefix) == KEY_CHARS else []
        if not locks:
            with contextlib.suppress(OSError):
                return time.time() - folder.stat().st_mtime > STALE_WITHOUT_LOCK_S
            return False
        for lock_file in locks:  # a 64-bit prefix is unique in practice; all must be free anyway
            try:
                fd = os.open(lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                return False  # unreadable or a link: not ours to judge
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # held: a live builder (or one waiting to build)
            finally:
                os.close(fd)
        return True

    def get_or_create(
        self, key: str, build: Callable[[Path], Any], meta: Mapping[str, Any] | None = None
    ) -> tuple[Path, bool]:
        """Return (path, hit). On a miss, ``build(path)`` writes the model to ``path`` (a temp folder).

        A mapping that ``build`` returns (what the build found out, e.g. its pass record) joins
        ``meta`` in the entry's ``entry.json``, written before the entry appears, so a reader that
        hits the entry always finds it there.
        """
        self.sweep()  # before taking our lock: the orphan of a killed build of this very entry goes too
        found = self.get(key, meta)
        if found is not None:
            return found, True
        with self.lock(key):
            found = self.get(key, meta)  # another process may have built it while we waited
            if found is not None:
                return found, True
            shared = self.shared
            make_shared_dir(self.root, shared)
            with storage_errors(self.root, "create a cache build folder in"):
                tmp = Path(tempfile.mkdtemp(prefix=f"{BUILD_PREFIX}{key[:KEY_CHARS]}-", dir=self.root))
            try:
                found_out = build(tmp / MODEL_FILE)
                if not (tmp / MODEL_FILE).is_file():
                    raise RuntimeError(f"cache build for {key} wrote no {MODEL_FILE}")
                entry_meta = {**(meta or {}), **(found_out if isinstance(found_out, Mapping) else {})}
                atomic_write_json(
                    tmp / ENTRY_FILE,
                    {"key": key, "sha256": file_sha256(tmp / MODEL_FILE), "created": time.time(), "meta": entry_meta},
                )
                if shared:  # every member may read, and repair, what this one built
                    for path in [tmp, *tmp.iterdir()]:
                        share(path)
                with storage_errors(self.entry_dir(key), "move the finished cache entry to"):
                    os.replace(tmp, self.entry_dir(key))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return self.entry_dir(key) / MODEL_FILE, False

    def entries(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def leftovers(self) -> list[Path]:
        """Temp build or trash folders (there should be none once no process is building)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.name.startswith((BUILD_PREFIX, TRASH_PREFIX)))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _read_no_follow(path: Path) -> bytes:
    """A file's bytes, refusing a symbolic link at its name (ELOOP)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


__all__ = ["ENTRY_FILE", "MODEL_FILE", "ModelStore", "cache_key"]
