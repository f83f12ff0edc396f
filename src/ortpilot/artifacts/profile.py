"""Deploy profiles: the exact session a tune chose, written once, re-verified on every load.

``profile.json`` names the model file (relative to the profile) and its hash, the ORT version
and distribution it was measured with, providers with options, session settings, passes,
accuracy and latency figures, and the machine it was measured on (``providers.machine``). ``load_profile`` refuses what would
silently run something else: a changed model file, a missing provider or another ORT build
(exit 1); it warns on another ORT minor version; invalid JSON is exit 2.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ortpilot.artifacts.atomic import atomic_write_json
from ortpilot.artifacts.fields import read_document
from ortpilot.artifacts.profile_schema import MAX_PROFILE_BYTES, check_profile
from ortpilot.artifacts.stamp import ort_distribution
from ortpilot.errors import ProviderFallbackError, StampMismatchError, UsageError
from ortpilot.modelio import file_sha256

log = logging.getLogger("ortpilot")
PROFILE_FORMAT = "ortpilot-profile"
PROFILE_VERSION = 1


class OrtVersionWarning(UserWarning):
    """The profile was measured with another ORT minor version: it loads, but latencies may differ."""


def ortpilot_version() -> str:
    from ortpilot.version import __version__

    return __version__


def write_profile(
    path: str | os.PathLike,
    *,
    model_file: str | os.PathLike,
    providers: list[dict[str, Any]],
    settings: dict[str, Any],
    iobinding: bool = False,
    passes: list[dict[str, Any]] | None = None,
    accuracy: dict[str, Any] | None = None,
    latency: dict[str, Any] | None = None,
    machine: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``profile.json`` atomically; ``model_file`` is stored relative to the profile's folder.

    ``machine`` is the measuring machine as ``providers.machine.machine_facts`` describes it
    (the caller, a layer above, passes it in); ``load_profile`` compares it with the loading one.
    """
    dest = Path(path)
    model = Path(model_file)
    try:
        rel = os.path.relpath(model.resolve(), dest.parent.resolve())
    except ValueError:  # another drive (Windows)
        rel = str(model.resolve())
    doc = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "model": {"file": rel, "sha256": file_sha256(model)},
        "onnxruntime": {
            "version": ort.__version__,
            "distribution": ort_distribution(),
            "available_providers": ort.get_available_providers(),
        },
        "providers": providers,
        "session_settings": settings,
        "iobinding": iobinding,
        "passes": passes or [],
        "accuracy": accuracy or {},
        "latency": latency or {},
        "machine": machine or {},
        "ortpilot_version": ortpilot_version(),
        **(extra or {}),
    }
    return atomic_write_json(dest, doc)


PROFILE_FILE = "profile.json"


def profile_file(path: str | os.PathLike) -> Path:
    """The profile ``path`` names: a profile file, or the tune output folder holding ``profile.json`` (what
    ``ortpilot tune -o DIR`` printed), so every command takes the folder the same way. A folder without one is
    exit 2 naming what it lacks; anything else is returned as given (``read_profile`` says what is wrong)."""
    p = Path(path)
    if not p.is_dir():
        return p
    if (p / PROFILE_FILE).is_file():
        return p / PROFILE_FILE
    raise UsageError(
        f"'{p}' is a folder without {PROFILE_FILE}: give a tune output folder ('ortpilot tune MODEL -o DIR'), "
        f"its {PROFILE_FILE}, or a bundle folder holding bundle.json."
    )


def read_profile(path: str | os.PathLike) -> dict[str, Any]:
    """Parse and shape-check a profile; every problem is a UsageError (exit 2) naming the fix."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"Profile '{p}' does not exist. Create one with 'ortpilot tune MODEL -o DIR'.")
    doc = read_document(
        p,
        what="Profile",
        noun="an ortpilot profile",
        fmt=PROFILE_FORMAT,
        version=PROFILE_VERSION,
        limit=MAX_PROFILE_BYTES,
        fix="regenerate it with 'ortpilot tune'",
    )
    check_profile(doc, str(p))  # every field by type and range: a profile is an input, not trusted state
    return doc


def profile_model_path(doc: dict[str, Any], profile_path: str | os.PathLike) -> Path:
    file = Path(doc["model"]["file"])
    return file if file.is_absolute() else Path(profile_path).parent / file


def verify_model_file(doc: dict[str, Any], profile_path: str | os.PathLike) -> Path:
    """The profile's model file, after checking it is there and unchanged (its sha256); exit 1 if not.

    What an export needs: the model the profile measured, without requiring this machine to have
    the profile's ORT build or providers (the target server brings its own).
    """
    model = profile_model_path(doc, profile_path)
    if not model.is_file():
        raise StampMismatchError(
            f"The model file '{model}' named by profile '{profile_path}' is missing. "
            "Keep the profile next to its model, or re-run 'ortpilot tune'."
        )
    digest = file_sha256(model)
    if digest != doc["model"].get("sha256"):
        raise StampMismatchError(
            f"The model file '{model}' changed since it was tuned (sha256 {digest[:12]}…, "
            f"profile says {str(doc['model'].get('sha256'))[:12]}…). Re-run 'ortpilot tune' "
            "on the new model; the old profile's measurements do not apply to it."
        )
    return model


def verify_environment(
    doc: dict[str, Any], profile_path: str | os.PathLike, available: Sequence[str] | None = None
) -> Path:
    """Check model hash, ORT build and providers against the profile; returns the model path."""
    model = verify_model_file(doc, profile_path)
    recorded = doc["onnxruntime"]
    version = str(recorded.get("version", ""))
    if version.split(".")[:2] != ort.__version__.split(".")[:2]:
        message = (
            f"Profile '{profile_path}' was measured with ONNX Runtime {version}; this is {ort.__version__}. "
            "It loads, but its latency figures may not hold: re-run 'ortpilot tune' to re-measure."
        )
        log.warning(message)
        warnings.warn(message, OrtVersionWarning, stacklevel=3)
    dist_then = _dist_names(str(recorded.get("distribution", "")))
    dist_now = _dist_names(ort_distribution())
    if dist_then and dist_now and dist_then != dist_now:
        raise StampMismatchError(
            f"Profile '{profile_path}' was made with ORT build {', '.join(sorted(dist_then))}; "
            f"this environment has {', '.join(sorted(dist_now))}. Another build has other "
            "execution providers and kernels: re-run 'ortpilot tune' here."
        )
    # ``available``: the providers that can run here (plugin EPs with a device included), from the caller
    available = list(available) if available is not None else ort.get_available_providers()
    for spec in doc["providers"]:
        name = spec.get("name") if isinstance(spec, dict) else str(spec)
        if name not in available:
            raise ProviderFallbackError(
                f"Profile '{profile_path}' runs on {name}, which this ORT build "
                f"({ort.__version__}) lacks (available: {', '.join(available)}). "
                "Install the ORT build the profile was made with, or re-tune here.",
                requested=name,
                loaded=available,
                layer=1,
            )
    return model


def _dist_names(text: str) -> set[str]:
    return {item.split("==")[0] for item in text.split(",") if item and item != "unknown"}


__all__ = [
    "PROFILE_FILE",
    "PROFILE_FORMAT",
    "OrtVersionWarning",
    "profile_file",
    "read_profile",
    "verify_environment",
    "verify_model_file",
    "write_profile",
]
