"""Profiles to export, shared by tests/export and tests/cli/test_cmd_export.py: a plain CPU profile written
with ``write_profile``, with reference outputs the way ``ortpilot tune`` records them (held-out inputs
regenerated from the source model by seed), and copies of it with other providers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

CPU = "CPUExecutionProvider"
# Not ORT's defaults, so that the golden files show each mapping: one intra-op thread, the CPU
# arena off, spinning off (a session config entry Triton's backend cannot set).
SETTINGS = {
    "intra_op_threads": 1,
    "enable_cpu_mem_arena": False,
    "config_entries": {"session.intra_op.allow_spinning": "0"},
}


def write_cpu_profile(
    folder: Path, model: Path, *, settings: dict[str, Any] | None = None, shapes: dict[str, list[int]] | None = None
) -> Path:
    """``folder/profile.json`` for ``model`` on the CPU, its reference outputs computed by a verified session."""
    from ortpilot.artifacts.profile import write_profile
    from ortpilot.graph.feeds import make_feeds, plan_feeds
    from ortpilot.modelio import file_sha256, load_model
    from ortpilot.session import SessionSettings, load
    from ortpilot.tuning.reference import array_digest as _digest
    from ortpilot.tuning.tune import HELDOUT_SEED, feeds_digest

    folder.mkdir(parents=True, exist_ok=True)
    model_file = folder / "model.onnx"
    shutil.copyfile(model, model_file)
    proto = load_model(model)
    feeds = make_feeds(
        proto, plan=plan_feeds(proto, {k: tuple(v) for k, v in (shapes or {}).items()}), seed=HELDOUT_SEED
    )
    chosen = SessionSettings.from_dict(dict(settings if settings is not None else SETTINGS))
    sess = load(str(model_file), ["cpu"], "strict", settings=chosen)
    names = [o.name for o in sess.get_outputs()]
    outputs = sess.run(None, feeds)
    return write_profile(
        folder / "profile.json",
        model_file=model_file,
        providers=[{"name": CPU, "options": {}}],
        settings=chosen.to_dict(),
        accuracy={"passed": True, "max_error": 0.01, "worst_error": 0.0},
        extra={
            "candidate": {"label": "test profile"},
            "source_model": {"path": str(model), "sha256": file_sha256(model)},
            "shapes": {k: list(v.shape) for k, v in feeds.items()},
            "reference_outputs": {
                "heldout_seed": HELDOUT_SEED,
                "inputs_sha256": feeds_digest(feeds),
                "sha256": {n: _digest(o) for n, o in zip(names, outputs)},
            },
            "placement": sess.placement.counts if sess.placement else None,
        },
    )


def with_providers(profile: Path, providers: list[dict[str, Any]], dest_name: str) -> Path:
    """A copy of ``profile`` beside it (same model file) with other providers: how a CUDA, TensorRT
    or OpenVINO profile looks, made on a machine that has none of them."""
    doc = json.loads(profile.read_text())
    doc["providers"] = providers
    dest = profile.parent / dest_name
    dest.write_text(json.dumps(doc, indent=2))
    return dest
