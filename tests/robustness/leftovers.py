"""What a robustness test looks for after a command: partial files, temp files, broken cache entries."""

from __future__ import annotations

import json
from pathlib import Path

from ortpilot.modelio import file_sha256

TEMP_MARKERS = (".tmp", ".build-", ".trash-", ".partial")
NOT_OURS = {".ses"}  # created in $TMPDIR by the sandbox that runs the tests, not by ortpilot


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def stray_entries(folder: Path) -> list[Path]:
    """Everything in a folder that should be empty (a $TMPDIR after the command)."""
    return sorted(p for p in folder.iterdir() if p.name not in NOT_OURS) if folder.is_dir() else []


def temp_files(folder: Path) -> list[Path]:
    """Anything that looks like an unfinished atomic write or cache build."""
    return [p for p in folder.rglob("*") if any(m in p.name for m in TEMP_MARKERS)] if folder.is_dir() else []


def cache_entries(cache: Path) -> set[str]:
    models = cache / "models"
    return {p.name for p in models.iterdir() if p.is_dir() and not p.name.startswith(".")} if models.is_dir() else set()


def assert_cache_sound(cache: Path) -> None:
    """No temp leftovers, and every model entry's content hash matches its record."""
    assert not temp_files(cache), f"leftovers in the cache: {temp_files(cache)}"
    for key in cache_entries(cache):
        assert_entry_sound(cache, key)


def assert_entry_sound(cache: Path, key: str) -> None:
    """A visible entry is complete: its record parses and its model matches the recorded hash."""
    folder = cache / "models" / key
    meta = json.loads((folder / "entry.json").read_text())
    assert file_sha256(folder / "model.onnx") == meta["sha256"], f"corrupt cache entry {folder}"


def assert_json_files_parse(folder: Path) -> None:
    for path in folder.rglob("*.json"):
        json.loads(path.read_text())
