"""Load a deploy profile as a verified session (``ortpilot.load_profile``).

The profile format and its environment checks live in ``ortpilot.artifacts.profile``; this
module recreates the session above them, so imports keep pointing down.
"""

from __future__ import annotations

import os
from typing import Any

from ortpilot.artifacts.profile import read_profile, verify_environment
from ortpilot.errors import StampMismatchError, UsageError
from ortpilot.session.options import SessionSettings
from ortpilot.session.verified import VerifiedSession, load


def load_profile(path: str | os.PathLike, policy: str = "strict", **kwargs: Any) -> VerifiedSession:
    """Recreate the profiled session exactly and verify it (``ortpilot.load_profile``).

    Returns a ``VerifiedSession``; its ``profile`` attribute holds the parsed profile (whether
    to use IOBinding, the measured latency). ``kwargs`` go to ``ortpilot.session.load``.
    """
    doc = read_profile(path)
    model = verify_environment(doc, path)
    try:
        settings = SessionSettings.from_dict(dict(doc["session_settings"]))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"Profile '{path}' has invalid session settings ({exc}); regenerate it.") from None
    providers = [(p["name"], dict(p.get("options") or {})) for p in doc["providers"]]
    shapes = {k: tuple(v) for k, v in (doc.get("shapes") or {}).items()} or None
    session = load(str(model), providers, policy, settings=settings, shapes=shapes, **kwargs)
    expected = (doc.get("placement") or {})
    if expected and session.placement is not None and policy == "strict":
        got = session.placement.counts
        if got != expected:
            raise StampMismatchError(f"Profile '{path}' recorded placement {expected}, but this session places "
                                     f"nodes as {got}. The environment differs from the one tuned; re-tune.")
    session.profile = doc
    return session
