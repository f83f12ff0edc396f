"""OpenVINO's compiled model beside the profile, so that a process starts without compiling.

At session creation the OpenVINO EP compiles its part of the graph into native code for the device
(the cold start of ``serve`` replicas and of every ``load_profile``). ORT's compile API
(``ModelCompiler``, EP context) saves that compiled blob inside an ONNX model of ``EPContext``
nodes; loading it skips the compile. A blob is native code for one OpenVINO version and device,
so the profile's ``compiled_model`` records its hash, the plugin and OpenVINO versions and the
device, and ``session.compiled`` loads it only where all of them match. It is kept only when its
session reproduces the winner's reference outputs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.providers.openvino import OPENVINO, plugin_options
from ortpilot.providers.plugins import is_plugin_ep, plugin_build
from ortpilot.session.compiled import COMPILED_FILE, compile_model

log = logging.getLogger("ortpilot")


def write_compiled_model(
    out: Path,
    model_file: Path,
    providers: list[dict[str, Any]],
    feeds: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
) -> dict[str, Any] | None:
    """Write ``out/model.openvino.onnx`` and return the profile's ``compiled_model`` field, or None (logged)
    when the winner is not on the OpenVINO plugin or the blob's outputs differ from the winner's."""
    first = providers[0] if providers else {}
    if first.get("name") != OPENVINO or not is_plugin_ep(OPENVINO):
        _remove(out, out / COMPILED_FILE)  # a blob an earlier tune into this folder left
        return None
    from ortpilot.modelio import file_sha256
    from ortpilot.providers.names import resolve_providers
    from ortpilot.session import load

    chain = resolve_providers([(p["name"], dict(p.get("options") or {})) for p in providers])
    dest = out / COMPILED_FILE
    try:
        started = time.perf_counter()
        written = compile_model(model_file, dest, chain[0])
        compile_s = time.perf_counter() - started
        session = load(str(dest), chain, "strict")
        got = dict(zip([o.name for o in session.get_outputs()], session.run(None, dict(feeds))))
    except Exception as exc:  # an optional speed-up: the profile stays valid without it
        log.info("No compiled OpenVINO model kept: %s", exc)
        _remove(out, dest)
        return None
    differs = [
        n
        for n, v in expected.items()
        if n not in got or not np.allclose(np.asarray(got[n]), np.asarray(v), rtol=1e-4, atol=1e-5)
    ]
    if differs:
        log.info("No compiled OpenVINO model kept: its outputs %s differ from the winner's.", ", ".join(differs))
        _remove(out, dest)
        return None
    device, _ = plugin_options(dict(chain[0].ort_options()))
    return {
        "file": dest.name,
        "sha256": file_sha256(dest),
        "blobs": [{"file": p.name, "sha256": file_sha256(p)} for p in written[1:]],
        "ep": OPENVINO,
        **plugin_build(OPENVINO),
        "device": device,
        "compile_s": round(compile_s, 4),
        "placement": session.placement.counts if session.placement else None,
    }


def _remove(out: Path, dest: Path) -> None:
    """The compiled model and its blobs (``model.openvino*``), when they are not kept."""
    for path in out.glob(f"{dest.stem}*"):
        path.unlink(missing_ok=True)


__all__ = ["write_compiled_model"]
