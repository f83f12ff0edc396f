"""A stamped model that does not fit the session about to run it, rebuilt from its recorded source.

``ortpilot.load`` refuses an offline-optimized or fused model stamped for another EP or ORT
build (``artifacts.stamp``); when the stamp names a source file that still has the recorded
hash, the same pass (optimize or transformer fusion) is run again for what is in use here and
the result is cached. Its own module: it needs both passes, and fusion builds on optimize.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import onnx
import onnxruntime as ort

from ortpilot.artifacts.atomic import save_model
from ortpilot.artifacts.stamp import cpu_features, describe_stamp, mismatch_message, read_stamp, stamp_problems
from ortpilot.artifacts.store import ModelStore, cache_key
from ortpilot.errors import StampMismatchError
from ortpilot.modelio import file_sha256
from ortpilot.passes.base import Pass
from ortpilot.passes.fusion import FusionPass
from ortpilot.passes.optimize import OptimizePass
from ortpilot.passes.options import FusionOptions
from ortpilot.providers.names import ProviderSpec

log = logging.getLogger("ortpilot")


def check_or_rebuild(proto: onnx.ModelProto, providers: Sequence[ProviderSpec]) -> Path | None:
    """For session loading: None when the model's stamp (if any) fits ``providers`` and this ORT.

    On a mismatch, rebuild from the source recorded in the stamp when that file still exists
    with the same content (and log it), returning the rebuilt model's path; otherwise raise
    StampMismatchError saying what the model was built for, what is in use, and how to rebuild.
    """
    stamp = read_stamp(proto)
    if stamp is None:
        return None
    problems = stamp_problems(stamp, providers)
    if not problems:
        return None
    source = Path(stamp.get("source_path") or "")
    kind = stamp.get("pass")
    if not stamp.get("source_path") or not source.is_file() or kind not in ("optimize", "fusion"):
        raise StampMismatchError(mismatch_message(stamp, problems))
    if file_sha256(source) != stamp.get("source_sha256"):
        raise StampMismatchError(mismatch_message(stamp, problems + [f"its source {source} has changed since"]))
    if kind == "optimize":
        step: Pass = OptimizePass(
            stamp.get("level") or "all",
            list(providers),
            free_dimension_overrides=(stamp.get("options") or {}).get("free_dimension_overrides"),
        )
    else:
        # The fusion's own options record, from every one of its fields the stamp holds (an option added to
        # FusionOptions is rebuilt as it was built, not at its default); the stamp's providers are not one.
        opts = stamp.get("options") or {}
        known = {f.name for f in fields(FusionOptions)}
        step = FusionPass(
            FusionOptions.from_dict({k: v for k, v in opts.items() if k in known}), providers=list(providers)
        )
    log.warning(
        "Stamped model was built for %s, but %s: rebuilding it from its source %s for %s.",
        describe_stamp(stamp),
        "; ".join(problems),
        source,
        ", ".join(p.name for p in providers),
    )
    result = step.run(source)
    store = ModelStore()
    key = "rebuilt-" + cache_key(
        model_sha256=stamp.get("source_sha256", ""),
        ort_version=ort.__version__,
        providers=[p.to_dict() for p in providers],
        level=str(stamp.get("level")),
        cpu=cpu_features(),
        extra={"pass": kind, "options": stamp.get("options")},
    )
    path, _ = store.get_or_create(
        key,
        lambda dest: save_model(result.model, dest),
        meta={"source_sha256": stamp.get("source_sha256"), "pass": kind},
    )
    return path


__all__ = ["check_or_rebuild"]
