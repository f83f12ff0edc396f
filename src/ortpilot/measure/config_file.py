"""``bench --configs FILE.json``: more configurations to interleave, read from a file.

The file holds a list (or ``{"configs": [...]}``) whose entries are flag strings, as ``--vs``
takes them, or ``{"name": ..., "flags": "..."}``. This module reads the file strictly (anything
else exits 2 naming the entry); turning each entry's flags into a configuration is the CLI's
argument parsing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ortpilot.errors import UsageError


@dataclass(frozen=True)
class ConfigEntry:
    """One configuration of the file: its label (None: the default letter) and its flags."""

    name: str | None
    flags: str


def read_config_file(path: str) -> list[ConfigEntry]:
    """The entries of a ``--configs`` file, in order."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"--configs file '{path}' does not exist.") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--configs file '{path}' is not valid JSON ({exc}).") from None
    if isinstance(data, dict):
        data = data.get("configs")
    if not isinstance(data, list):
        raise UsageError(f"--configs file '{path}' must hold a list of configurations (or {{\"configs\": [...]}}).")
    out: list[ConfigEntry] = []
    for i, entry in enumerate(data):
        if isinstance(entry, str):
            out.append(ConfigEntry(None, entry))
        elif isinstance(entry, dict) and isinstance(entry.get("flags", ""), str) and set(entry) <= {"name", "flags"}:
            out.append(ConfigEntry(entry.get("name"), entry.get("flags", "")))
        else:
            raise UsageError(
                f'--configs entry {i} must be a flag string or {{"name": ..., "flags": "..."}}, got {entry!r}.'
            )
    return out


__all__ = ["ConfigEntry", "read_config_file"]
