"""What ``--resume`` needs besides the journal, kept in ``OUTDIR/.ortpilot-tune/``.

The accuracy gate compares every candidate with ORT's default session on the held-out inputs.
The worker writes both into the run's scratch folder, which is deleted when the run ends, so
a resumed tune (after a kill, a Ctrl-C, or of a finished tune) could not gate the candidates
it still has to measure. Before the journal's first record reaches the disk, the baseline's
outputs and the held-out inputs are copied here (atomically), and a ``kept`` record in the
journal names them with their sha256; resume reads them back and refuses, with a clear
message, a file that is missing or changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ortpilot.artifacts.atomic import atomic_write_bytes, sweep_temp_files
from ortpilot.errors import UsageError
from ortpilot.tuning.reference import REFERENCE_FILE

STATE_DIR = ".ortpilot-tune"
KEPT = "kept"  # the journal record's kind
FILES = {"reference": REFERENCE_FILE, "heldout": "heldout.npz"}


def keep_for_resume(out: Path, sources: Mapping[str, Path]) -> dict[str, Any]:
    """Copy ``sources`` (``reference``: the baseline's outputs, ``heldout``: the held-out inputs)
    into ``OUTDIR/.ortpilot-tune/``; return the journal record that names them and their hashes."""
    record: dict[str, Any] = {"kind": KEPT}
    state = out / STATE_DIR
    if state.is_symlink():  # planted: writes would land wherever it points
        state.unlink()
    for key, name in FILES.items():
        data = Path(sources[key]).read_bytes()
        atomic_write_bytes(out / STATE_DIR / name, data)
        record[key] = {"file": f"{STATE_DIR}/{name}", "sha256": hashlib.sha256(data).hexdigest()}
    return record


def kept_file(out: Path, record: Mapping[str, Any], key: str) -> Path:
    """The kept file ``key`` of a journal's ``kept`` record, after checking it is there and unchanged.

    Raises UsageError (exit 2) naming the file and what to do, instead of a traceback later.
    """
    entry = record.get(key) or {}
    path = out / str(entry.get("file") or f"{STATE_DIR}/{FILES[key]}")
    what = "the default session's outputs" if key == "reference" else "the held-out inputs"
    if path.is_symlink() or path.parent.is_symlink():
        raise UsageError(
            f"Cannot resume the tune in '{out}': '{path}' ({what}) is reached through a symbolic link; "
            "ortpilot does not follow links in an output folder. Drop --resume to start the tune over, "
            "or choose another -o folder."
        )
    if not path.is_file():
        raise UsageError(
            f"Cannot resume the tune in '{out}': '{path}' ({what}, which the tune kept for --resume) "
            "is missing. Drop --resume to start the tune over, or choose another -o folder."
        )
    if hashlib.sha256(path.read_bytes()).hexdigest() != entry.get("sha256"):
        raise UsageError(
            f"Cannot resume the tune in '{out}': '{path}' ({what}, which the tune kept for --resume) "
            "is damaged or was changed since the journal recorded it (its sha256 differs). Drop "
            "--resume to start the tune over, or choose another -o folder."
        )
    return path


def sweep(out: Path) -> list[Path]:
    """Remove temp files of atomic writes killed mid-way in OUTDIR and in its state folder."""
    return sweep_temp_files(out) + sweep_temp_files(out / STATE_DIR)
