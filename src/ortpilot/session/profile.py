"""Load a deploy profile as a verified session (``ortpilot.load_profile``).

The profile format and its environment checks live in ``ortpilot.artifacts.profile``; this
module recreates the session above them, so imports keep pointing down.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ortpilot.artifacts.profile import read_profile, verify_environment
from ortpilot.artifacts.profile_schema import file_settings, model_outside_folder
from ortpilot.errors import StampMismatchError, UsageError
from ortpilot.session.options import SessionSettings
from ortpilot.session.verified import VerifiedSession, load


def load_profile(path: str | os.PathLike, policy: str = "strict", *, accept_fields: Sequence[str] = (),
                 accept_model_outside: bool = False, **kwargs: Any) -> VerifiedSession:
    """Recreate the profiled session exactly and verify it (``ortpilot.load_profile``).

    Returns a ``VerifiedSession``; its ``profile`` attribute holds the parsed profile (whether
    to use IOBinding, the measured latency). ``kwargs`` go to ``ortpilot.session.load``.
    A profile is an input: settings that make ORT write or load files are refused unless named
    in ``accept_fields`` (as the error names them), and a model outside the profile's folder
    unless ``accept_model_outside``.
    """
    doc = read_profile(path)
    _refuse_file_settings(doc, path, accept_fields, accept_model_outside)
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


def _refuse_file_settings(doc: dict[str, Any], path: str | os.PathLike, accept_fields: Sequence[str],
                          accept_model_outside: bool) -> None:
    """A profile from elsewhere must not make ORT write or load files its reader did not ask for."""
    refused = [f for f in file_settings(doc) if f not in set(accept_fields)]
    if refused:
        raise UsageError(f"Profile '{path}' sets {', '.join(refused)}, which make(s) ONNX Runtime write or load files "
                         "(a saved model, an EP cache or library, a config entry outside the safe list). ortpilot "
                         "does not take such settings from a profile file; if you trust it, pass "
                         f"accept_fields={refused!r} to load_profile.")
    outside = None if accept_model_outside else model_outside_folder(doc, path)
    if outside is not None:
        raise UsageError(f"Profile '{path}' names the model '{doc['model']['file']}', which resolves to '{outside}', "
                         "outside the profile's folder. Keep the model next to its profile, or pass "
                         "accept_model_outside=True to load_profile if you trust this profile.")
