"""``ortpilot serve``: verified profiles as Ray Serve applications (Open Inference Protocol over REST and
gRPC, /metrics).

``applications(profiles, ...)`` returns a server's applications (one per model, whose replicas
answer its requests themselves, and a server-wide one); ``deployment(profile)`` one model's;
``run_server`` is what the CLI runs (a local Ray instance by default, or ``address=`` an existing
cluster). Ray is imported only when one of them is called, so ``import ortpilot.serve`` works
without the extra.
Decoders have their own application behind an OpenAI-compatible API, mounted at ``/v1``
(``openai_app.openai_deployment``, replicas in ``decoder``, the wire format in ``openai``).
"""

from __future__ import annotations

from typing import Any

from ortpilot.serve.options import DecoderOptions, ModelSpec, ServeOptions, ServerOptions, resolve_models


def deployment(profiles: Any, names: Any = (), **kwargs: Any) -> Any:
    """The Ray Serve application of verified replicas for ``profiles`` (see ``ortpilot.serve.app``)."""
    from ortpilot.serve.app import deployment as _deployment

    return _deployment(profiles, names, **kwargs)


def applications(profiles: Any, names: Any = (), **kwargs: Any) -> Any:
    """Every Ray Serve application of a server for ``profiles`` (see ``ortpilot.serve.app``)."""
    from ortpilot.serve.app import applications as _applications

    return _applications(profiles, names, **kwargs)


def run_server(*args: Any, **kwargs: Any) -> Any:
    """Start (or join) Ray, run the application, report readiness, serve until a signal."""
    from ortpilot.serve.runner import run_server as _run_server

    return _run_server(*args, **kwargs)


__all__ = [
    "DecoderOptions",
    "ModelSpec",
    "ServeOptions",
    "ServerOptions",
    "applications",
    "deployment",
    "resolve_models",
    "run_server",
]
