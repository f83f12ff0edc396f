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
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ortpilot.artifacts.atomic import atomic_write_json
from ortpilot.artifacts.cache import cache_root
from ortpilot.modelio import file_sha256

log = logging.getLogger("ortpilot")
MODEL_FILE = "model.onnx"
ENTRY_FILE = "entry.json"
BUILD_PREFIX = ".build-"
TRASH_PREFIX = ".trash-"
KEY_CHARS = 16  # of the key in a build folder's name
STALE_WITHOUT_LOCK_S = 3600.0  # a build folder with no lock file to test is removed after this long


def cache_key(*, model_sha256: str, ort_version: str, providers: Sequence[Mapping[str, Any]] | Sequence[str],
              level: str, free_dimension_overrides: Mapping[str, int] | None = None,
              cpu: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None) -> str:
    """sha256 over a canonical JSON of every input that decides the cached model's bytes."""
    doc = {
        "model": model_sha256, "ort": ort_version, "providers": list(providers), "level": level,
        "free_dims": dict(sorted((free_dimension_overrides or {}).items())), "cpu": dict(cpu or {}),
        "extra": dict(extra or {}),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class ModelStore:
    """Cache of built models keyed by :func:`cache_key`."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root) if root else cache_root() / "models"

    def entry_dir(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str) -> Path | None:
        """The cached model's path, or None; a corrupt entry is removed (with a warning)."""
        folder = self.entry_dir(key)
        model, entry = folder / MODEL_FILE, folder / ENTRY_FILE
        if not folder.exists():
            return None
        try:
            meta = json.loads(entry.read_text())
            ok = model.is_file() and file_sha256(model) == meta["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            ok = False
        if ok:
            return model
        log.warning("Cache entry %s is corrupt (content hash does not match); discarding and rebuilding it.", folder)
        self.discard(key)
        return None

    def discard(self, key: str) -> None:
        folder = self.entry_dir(key)
        if folder.exists():
            trash = folder.with_name(f"{TRASH_PREFIX}{key}-{os.getpid()}-{time.monotonic_ns()}")
            with contextlib.suppress(OSError):
                os.replace(folder, trash)
                folder = trash
            shutil.rmtree(folder, ignore_errors=True)

    def read_entry(self, key: str) -> dict[str, Any]:
        return json.loads((self.entry_dir(key) / ENTRY_FILE).read_text())

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive per-entry lock (fcntl), so only one process builds an entry at a time."""
        lock_dir = self.root / ".locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / f"{key}.lock", "a+") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

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
        prefix = folder.name[len(BUILD_PREFIX):len(BUILD_PREFIX) + KEY_CHARS]
        locks = sorted((self.root / ".locks").glob(f"{prefix}*.lock")) if len(prefix) == KEY_CHARS else []
        if not locks:
            with contextlib.suppress(OSError):
                return time.time() - folder.stat().st_mtime > STALE_WITHOUT_LOCK_S
            return False
        for lock_file in locks:  # a 64-bit prefix is unique in practice; all must be free anyway
            with open(lock_file, "a+") as fh:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return False  # held: a live builder (or one waiting to build)
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return True

    def get_or_create(self, key: str, build: Callable[[Path], Any], meta: Mapping[str, Any] | None = None
                      ) -> tuple[Path, bool]:
        """Return (path, hit). On a miss, ``build(path)`` writes the model to ``path`` (a temp folder).

        A mapping that ``build`` returns (what the build found out, e.g. its pass record) joins
        ``meta`` in the entry's ``entry.json``, written before the entry appears, so a reader that
        hits the entry always finds it there.
        """
        self.sweep()  # before taking our lock: the orphan of a killed build of this very entry goes too
        found = self.get(key)
        if found is not None:
            return found, True
        with self.lock(key):
            found = self.get(key)  # another process may have built it while we waited
            if found is not None:
                return found, True
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f"{BUILD_PREFIX}{key[:KEY_CHARS]}-", dir=self.root))
            try:
                found_out = build(tmp / MODEL_FILE)
                if not (tmp / MODEL_FILE).is_file():
                    raise RuntimeError(f"cache build for {key} wrote no {MODEL_FILE}")
                entry_meta = {**(meta or {}), **(found_out if isinstance(found_out, Mapping) else {})}
                atomic_write_json(tmp / ENTRY_FILE, {"key": key, "sha256": file_sha256(tmp / MODEL_FILE),
                                                     "created": time.time(), "meta": entry_meta})
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


__all__ = ["ENTRY_FILE", "MODEL_FILE", "ModelStore", "cache_key"]
