"""The ORT-optimized winner beside the profile, so that serving replicas skip graph optimization.

Creating a session at level ``all`` runs ORT's graph optimizers every time; a replica that loads
the graph ORT already optimized, with optimizations off, skips that work (the cold start of
``ortpilot serve``). The file is written the way ``ortpilot optimize`` writes one (ORT saves it
from a strict session on the winner's providers, stamped with the ORT build, providers, level
and CPU), and kept only when its session reproduces the winner's reference outputs bit for bit.
CPU-only winners only: compiling EPs (OpenVINO, TensorRT) build their engines at load anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.eps import CPU_EP
from ortpilot.session.options import SessionSettings

log = logging.getLogger("ortpilot")
OPTIMIZED_FILE = "model.optimized.onnx"


def write_optimized_model(
    out: Path,
    model_file: Path,
    providers: list[dict[str, Any]],
    settings: SessionSettings,
    feeds: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
) -> dict[str, Any] | None:
    """Write ``out/model.optimized.onnx`` and return the profile's ``optimized_model`` field, or None
    (logged) when the winner cannot use one or its outputs would differ."""
    if settings.level == "disable" or any(p.get("name") != CPU_EP for p in providers):
        return None
    from ortpilot.artifacts.atomic import save_model
    from ortpilot.artifacts.stamp import make_stamp, write_stamp
    from ortpilot.modelio import file_sha256, load_model
    from ortpilot.passes.base import SourceModel
    from ortpilot.passes.optimize import optimize_to_file
    from ortpilot.providers.names import resolve_providers
    from ortpilot.session import load

    chain = resolve_providers([(p["name"], dict(p.get("options") or {})) for p in providers])
    dest = out / OPTIMIZED_FILE
    try:
        optimize_to_file(SourceModel.of(model_file), settings.level, chain, dest, settings.free_dimension_overrides)
        built = load_model(dest)
        write_stamp(
            built,
            make_stamp(
                source_sha256=file_sha256(model_file),
                providers=chain,
                level=settings.level,
                source_path=str(model_file.resolve()),
                pass_name="optimize",
                options={"level": settings.level, "for": "serve cold start"},
            ),
        )
        save_model(built, dest)
        session = load(str(dest), chain, "strict", settings=loading_settings(settings))
        got = dict(zip([o.name for o in session.get_outputs()], session.run(None, dict(feeds))))
    except Exception as exc:  # an optional speed-up: the profile stays valid without it
        log.info("No optimized model kept for serving: %s", exc)
        dest.unlink(missing_ok=True)
        return None
    differs = [
        n for n, v in expected.items() if n not in got or np.asarray(got[n]).tobytes() != np.asarray(v).tobytes()
    ]
    if differs:
        log.info("No optimized model kept for serving: its outputs %s differ from the winner's.", ", ".join(differs))
        dest.unlink(missing_ok=True)
        return None
    return {
        "file": dest.name,
        "sha256": file_sha256(dest),
        "level": settings.level,
        "placement": session.placement.counts if session.placement else None,
    }


def loading_settings(settings: SessionSettings) -> SessionSettings:
    """The winner's settings for loading its optimized graph: everything the same, optimizations off."""
    return SessionSettings.from_dict({**settings.to_dict(), "level": "disable", "optimized_model_filepath": ""})


__all__ = ["OPTIMIZED_FILE", "loading_settings", "write_optimized_model"]
