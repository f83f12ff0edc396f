"""ortpilot: ONNX Runtime sessions that run where you asked, measured and tuned.

The public surface is small; everything else lives in one module per job (see README).
"""

from __future__ import annotations

from typing import Any

from ortpilot.api import load
from ortpilot.errors import (
    AccuracyGateError,
    InputError,
    ModelLoadError,
    OrtpilotError,
    ProviderError,
    ProviderFallbackError,
    StampMismatchError,
    UsageError,
    VerificationError,
)
from ortpilot.session import SessionSettings, VerifiedSession
from ortpilot.version import __version__


def __getattr__(name: str) -> Any:
    """``ortpilot.TuneRequest`` without importing the tuning package (and ORT's tools) at ``import ortpilot``."""
    if name == "TuneRequest":
        from ortpilot.tuning.request import TuneRequest

        return TuneRequest
    raise AttributeError(f"module 'ortpilot' has no attribute {name!r}")


def doctor(**kwargs: Any):
    """Inspect this environment: ORT distributions, providers, plugin EPs, GPU libraries, CPU ISA."""
    from ortpilot.session.probe import run_doctor

    return run_doctor(**kwargs)


def tune(
    model: Any = None,
    out_dir: str | None = None,
    budget_s: float | None = None,
    *,
    ray_address: str | None = None,
    progress: Any = None,
    **options: Any,
):
    """Search for the fastest configuration that passes the accuracy gate; write a profile.

    Takes a ``TuneRequest`` or its fields (``ortpilot.tuning.request``: every option and its default);
    ``progress`` is called with each ``Progress`` update (a line of text for a fleet).

    With ``ray_address`` (a Ray cluster's address), tune every machine class of that cluster and write
    a bundle (one profile per class) instead: ``model`` may then be a list of models (one bundle each,
    in ``out_dir/NAME``); returns a ``fleet.result.FleetResult``. See ``ortpilot.fleet.run.tune_fleet``.
    """
    if ray_address is not None:
        from ortpilot.fleet.run import fleet_request, tune_fleet

        models, request = fleet_request(model, out_dir, budget_s, **options)
        return tune_fleet(models, ray_address, request, progress=progress)
    from ortpilot.tuning import tune as _tune

    return _tune(model, out_dir, budget_s, progress=progress, **options)


def load_profile(path: str, **kwargs: Any) -> VerifiedSession:
    """Recreate and re-verify the session a tune profile describes; of a bundle (``ortpilot tune --ray``),
    the profile of this machine's class (``session.bundle`` says which)."""
    from ortpilot.session.profile import load_profile as _load_profile

    return _load_profile(path, **kwargs)


def verify(profile: str, **kwargs: Any):
    """Re-verify a tune profile here (environment, machine, reference outputs; latency with
    ``max_slowdown_pct``): what ``ortpilot verify`` runs. See ``ortpilot.tuning.verify.verify_profile``."""
    from ortpilot.tuning.verify import verify_profile

    return verify_profile(profile, **kwargs)


def probe(provider: str):
    """Build and run a tiny strict session on ``provider`` alone: the doctor's proof that it works here.
    Returns a ``ProbeResult`` (``status`` ok/failed/skipped, ``reason``)."""
    from ortpilot.providers.names import canonical_name
    from ortpilot.session.probe import probe_provider

    return probe_provider(canonical_name(provider))


__all__ = [
    "AccuracyGateError",
    "InputError",
    "ModelLoadError",
    "OrtpilotError",
    "ProviderError",
    "ProviderFallbackError",
    "SessionSettings",
    "StampMismatchError",
    "TuneRequest",
    "UsageError",
    "VerificationError",
    "VerifiedSession",
    "__version__",
    "doctor",
    "load",
    "load_profile",
    "probe",
    "tune",
    "verify",
]
