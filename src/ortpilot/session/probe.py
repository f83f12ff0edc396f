"""The doctor's proof that a provider works here: a tiny strict session on it alone, run once.

It sits in the session layer because it builds verified sessions; ``providers.doctor`` gathers
every other fact and takes this probe as a function (:func:`run_doctor` wires the two).
"""

from __future__ import annotations

import time

from ortpilot.errors import OrtpilotError
from ortpilot.providers.doctor import NOT_PROBED, DoctorReport, ProbeResult, examine
from ortpilot.session.verified import load


def probe_provider(provider: str, kind: str = "built-in") -> ProbeResult:
    """Build a strict verified session of the demo MLP on ``provider`` alone, and run it once."""
    if provider in NOT_PROBED:
        return ProbeResult(provider, "skipped", NOT_PROBED[provider], kind=kind)
    from ortpilot.graph.feeds import make_feeds
    from ortpilot.models import make_mlp

    start = time.perf_counter()
    try:
        sess = load(make_mlp(), [provider], policy="strict")
        sess.run(None, make_feeds(sess.model))
    except OrtpilotError as exc:
        return ProbeResult(
            provider, "failed", getattr(exc, "reason", "") or str(exc), seconds=time.perf_counter() - start, kind=kind
        )
    except Exception as exc:  # ORT's own errors from run()
        return ProbeResult(
            provider,
            "failed",
            f"{type(exc).__name__}: {exc}".splitlines()[0],
            seconds=time.perf_counter() - start,
            kind=kind,
        )
    share = sess.placement.share(provider) if sess.placement else None
    return ProbeResult(provider, "ok", "", share, time.perf_counter() - start, kind)


def run_doctor(probe: bool = True) -> DoctorReport:
    """Examine this environment (``ortpilot doctor``). ``probe=False`` skips building sessions (faster, less proof)."""
    return examine(probe_provider if probe else None)


__all__ = ["probe_provider", "run_doctor"]
