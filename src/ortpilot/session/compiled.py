"""Compiled EP models (ORT's EP context): written with ORT's compile API, loaded only where they hold.

A compiled model holds native code for one EP build and device (OpenVINO's blob inside ``EPContext``
nodes). Run under another OpenVINO it may fail or, worse, run stale, so a profile records what it
was compiled for (``compiled_model``: sha256, plugin and OpenVINO versions, device) and
:func:`load_compiled` loads it only where all of these match. Otherwise the profile's own model loads
and the EP compiles it again (a warning says why), or, under ``strict``, the load is refused naming
both versions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ortpilot.errors import StampMismatchError
from ortpilot.providers.names import ProviderSpec
from ortpilot.providers.openvino import OPENVINO, OpenVINOOptionError, plugin_options
from ortpilot.providers.plugins import plugin_build, plugin_request
from ortpilot.session.options import SessionSettings

log = logging.getLogger("ortpilot")
COMPILED_FILE = "model.openvino.onnx"


def compile_model(source: Path, dest: Path, spec: ProviderSpec) -> list[Path]:
    """``source`` compiled for ``spec``'s plugin EP into ``dest`` and the blob file(s) the EP writes beside
    it (``model.openvino_OpenVINOExecutionProvider.bin``, named in its ``EPContext`` node); returns them,
    the model first. The blob stays a file of its own: embedded in the model, ORT parses it as a
    protobuf string at every load (MiniLM: 0.90 s to create the session against 0.31 s compiling the
    model from scratch; in its own file 0.09 s). Written in a scratch folder beside ``dest`` and moved
    into place blob first, so ``dest`` never names a blob that is not there."""
    import shutil

    import onnxruntime as ort

    # Without OpenVINO's model cache: a model the cache already holds is imported, not compiled, and the
    # blob exported from an imported model does not read back ("Unable to read the model").
    own = {k: v for k, v in spec.ort_options().items() if k != "cache_dir"}
    devices, options, missing = plugin_request(spec.name, own)
    if missing:
        raise RuntimeError(f"{spec.name}: {missing}")
    opts = ort.SessionOptions()
    opts.add_provider_for_devices(devices, options)
    scratch = dest.parent / f".{dest.stem}.{os.getpid()}.compiling"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        ort.ModelCompiler(opts, str(source), embed_compiled_data_into_model=False).compile_to_file(
            str(scratch / dest.name)
        )
        blobs = sorted(p for p in scratch.iterdir() if p.name != dest.name)
        for blob in blobs:
            os.replace(blob, dest.parent / blob.name)
        os.replace(scratch / dest.name, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return [dest, *(dest.parent / b.name for b in blobs)]


def compiled_mismatch(entry: Mapping[str, Any], file: Path, chain: list[ProviderSpec]) -> str:
    """Why the compiled model must not load here ('' when it may): its hash, plugin, OpenVINO, device."""
    from ortpilot.modelio import file_sha256

    files = [(file, entry.get("sha256"))] + [
        (file.parent / b["file"], b.get("sha256")) for b in entry.get("blobs") or []
    ]
    for path, digest in files:
        if not path.is_file():
            return f"its compiled model's file '{path.name}' is missing"
        if file_sha256(path) != digest:
            return f"its compiled model's file '{path.name}' changed since it was compiled (sha256 differs: edited or truncated)"
    here = plugin_build(str(entry.get("ep") or OPENVINO))
    for key in ("plugin", "openvino"):
        if entry.get(key) != here.get(key):
            return (
                f"its compiled model was compiled by {key} {entry.get(key) or 'unknown'}; "
                f"this environment has {here.get(key) or 'none'}"
            )
    try:
        device, _ = plugin_options(chain[0].ort_options()) if chain else ("", {})
    except OpenVINOOptionError as exc:  # the session would fall back on it too (plugin_request)
        return str(exc)
    if entry.get("device") and device and entry["device"] != device:
        return f"its compiled model was compiled for OpenVINO device {entry['device']}; this session asks for {device}"
    return ""


def load_compiled(
    doc: Mapping[str, Any],
    path: str | os.PathLike,
    providers: list,
    policy: str,
    settings: SessionSettings,
    shapes: Any,
    **kwargs: Any,
) -> Any:
    """The session on the profile's ``compiled_model``, or None to load (and compile) the profile's own model.

    A blob that does not match this environment is never run: strict refuses naming both sides, the
    other policies warn and fall back to the source model, which the EP compiles as it loads."""
    from ortpilot.providers.names import resolve_providers
    from ortpilot.session.verified import load

    entry = doc.get("compiled_model") or {}
    name = str(entry.get("file") or "")
    if not name or Path(name).name != name:  # only a file beside the profile
        return None
    chain = resolve_providers(providers)
    file = Path(path).parent / name
    why = compiled_mismatch(entry, file, chain)
    if why:
        message = f"Profile '{path}': {why}."
        if policy == "strict":
            raise StampMismatchError(
                message + " ortpilot never runs a stale compiled model: re-run 'ortpilot tune' here, or load with "
                "policy 'warn' to compile the profile's model at load instead."
            )
        log.warning("%s Loading the profile's model instead; OpenVINO compiles it at load.", message)
        return None
    return load(str(file), providers, policy, settings=settings, shapes=shapes, **kwargs)


__all__ = ["COMPILED_FILE", "compile_model", "compiled_mismatch", "load_compiled"]
