"""``ortpilot serve``: verified profiles as a Ray Serve application (Open Inference Protocol, /metrics).

``deployment(profile, ...)`` returns the Ray Serve application; ``run_server`` is what the CLI
runs (a local Ray instance by default, or ``address=`` an existing cluster). Ray is imported
only when one of them is called, so ``import ortpilot.serve`` works without the extra.
Decoders have their own application behind an OpenAI-compatible API, mounted at ``/v1``
(``openai_app.openai_deployment``, replicas in ``decoder``, the wire format in ``openai``).
"""

from __future__ import annotations

from typing import Any

from ortpilot.serve.options import ModelSpec, ServeOptions, resolve_models


def deployment(profiles: Any, names: Any = (), **kwargs: Any) -> Any:
    """The Ray Serve application of verified replicas for ``profiles`` (see ``ortpilot.serve.app``)."""
    from ortpilot.serve.app import deployment as _deployment

    return _deployment(profiles, names, **kwargs)


def run_server(*args: Any, **kwargs: Any) -> Any:
    """Start (or join) Ray, run the application, report readiness, serve until a signal."""
    from ortpilot.serve.runner import run_server as _run_server

    return _run_server(*args, **kwargs)


__all__ = ["ModelSpec", "ServeOptions", "deployment", "resolve_models", "run_server"]
