"""Output paths checked before any work, killed builds swept from the cache, outputs independent of the clock."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from ortpilot.artifacts.atomic import atomic_open, atomic_write_text, check_output_path
from ortpilot.artifacts.stamp import make_stamp
from ortpilot.artifacts.store import STALE_WITHOUT_LOCK_S, ModelStore
from ortpilot.errors import UsageError


def test_existing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory"):
        check_output_path(tmp_path)


def test_parent_that_is_a_file_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("x")
    with pytest.raises(UsageError, match="'.*taken' is a file, not a folder"):
        check_output_path(tmp_path / "taken" / "deeper" / "out.onnx")


def test_missing_parents_are_fine_and_not_created(tmp_path: Path) -> None:
    dest = tmp_path / "a" / "b" / "out.onnx"
    assert check_output_path(dest) == dest
    assert not (tmp_path / "a").exists()  # a command that fails later leaves no empty folders


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_folder_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(UsageError, match="not writable"):
        check_output_path(locked / "out.onnx")


def test_atomic_open_on_a_directory_creates_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.mkdir()
    with pytest.raises(UsageError, match="directory"), atomic_open(target):
        pass
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["report.html"]


def test_atomic_write_still_creates_missing_folders(tmp_path: Path) -> None:
    assert atomic_write_text(tmp_path / "new" / "x.txt", "hi").read_text() == "hi"


def test_stamp_has_no_wall_clock_time() -> None:
    first = make_stamp(source_sha256="a" * 64, level="all")
    time.sleep(1.1)
    assert make_stamp(source_sha256="a" * 64, level="all") == first
    assert "created" not in first


def _orphan(store: ModelStore, key: str, age_s: float = 0.0) -> Path:
    """A build folder as a builder killed mid-way leaves it (its lock file exists, unlocked)."""
    folder = store.root / f".build-{key[:16]}-abc123"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"half")
    if age_s:
        os.utime(folder, (time.time() - age_s, time.time() - age_s))
    return folder


def test_orphaned_build_folder_is_swept_by_the_next_build(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    with store.lock("k" * 64):  # leaves the lock file, as a killed builder does
        orphan = _orphan(store, "k" * 64)
    trash = store.root / (".trash-" + "t" * 64 + "-1-2")
    trash.mkdir()
    path, hit = store.get_or_create("k" * 64, lambda dest: dest.write_bytes(b"model"))
    assert not hit and path.read_bytes() == b"model"
    assert not orphan.exists() and not trash.exists() and store.leftovers() == []


def test_build_folder_of_a_live_builder_is_kept(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    lock_dir = store.root / ".locks"
    lock_dir.mkdir(parents=True)
    with open(lock_dir / f"{'b' * 64}.lock", "a+") as held:  # another builder, still working
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        live = _orphan(store, "b" * 64)
        store.get_or_create("o" * 64, lambda dest: dest.write_bytes(b"other"))
        assert live.exists()
    assert store.sweep() == [live]  # its lock is free now: the builder is gone


def test_build_folder_without_lock_file_is_swept_only_when_old(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    young = _orphan(store, "y" * 64)
    old = _orphan(store, "z" * 64, age_s=STALE_WITHOUT_LOCK_S + 60)
    assert store.sweep() == [old]
    assert young.exists()
