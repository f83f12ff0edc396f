"""Filing tune output folders into a bundle with the writer the fleet tune uses (``artifacts.bundle.write_bundle``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort

from ortpilot.artifacts.bundle import write_bundle


def file_bundle(root: Path, folders: Sequence[str], missing: Sequence[dict] = ()) -> Path:
    """``root/bundle.json`` for the tune output folders ``root/FOLDER`` (each filed under its profile's class)."""
    entries = []
    for folder in folders:
        doc = json.loads((root / folder / "profile.json").read_text())
        speed = doc["latency"]["speedup_vs_default"]
        entries.append(
            {
                "class": doc["machine_class"],
                "folder": folder,
                "winner": doc["candidate"]["label"],
                "speedup": {k: float(speed[k]) for k in ("ratio", "ci_low", "ci_high")},
            }
        )
    write_bundle(
        root,
        entries,
        model={"name": "mlp", "source": "demo:mlp"},
        missing=list(missing),
        tuned="one after the other",
        schedule={"why": "two local tunes, one after the other"},
        onnxruntime=ort.__version__,
    )
    return root
