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


def with_real_reference(profile: Path, data_path: str = "/data/samples") -> Path:
    """``profile`` as a tune on real data writes it: no seed to regenerate the held-out sample from,
    the sample and its outputs in ``reference.npz`` beside it (what ``verify`` reads)."""
    import numpy as np

    from ortpilot.session import SessionSettings, load
    from ortpilot.tuning.reference import reference_feeds

    doc = json.loads(profile.read_text())
    feeds = reference_feeds(doc)
    sess = load(str(profile.parent / "model.onnx"), ["cpu"], "strict", settings=SessionSettings())
    outputs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    np.savez(
        profile.parent / "reference.npz",
        **{f"inputs/{k}": v for k, v in feeds.items()},
        **{f"outputs/{k}": v for k, v in outputs.items()},
    )
    del doc["reference_outputs"]["heldout_seed"]
    doc["reference_outputs"]["file"] = "reference.npz"
    doc["gate_data"] = {"source": "files", "samples": 16, "path": data_path}
    profile.write_text(json.dumps(doc, indent=2))
    return profile


def rows_model(path: Path, *, reduce: bool = False) -> Path:
    """A model whose dynamic first dim ``points`` is no batch dim: each row minus the mean over rows
    (``reduce``: the sum over rows, one row whatever ``n`` is)."""
    import onnx
    from onnx import TensorProto, helper

    from ortpilot.modelio import SAFE_IR_VERSION

    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    nodes = (
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)]
        if reduce
        else [
            helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
            helper.make_node("Sub", ["x", "m"], ["y"]),
        ]
    )
    graph = helper.make_graph(
        nodes,
        "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["points", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["points", 3])],
        [axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = SAFE_IR_VERSION
    onnx.save(model, str(path))
    return path
