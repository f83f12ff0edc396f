"""``ortpilot serve``: verified profiles as Ray Serve applications (Open Inference Protocol over REST and
gRPC, /metrics).

``applications(profiles, ...)`` returns a server's applications (one per model, whose replicas
answer its requests themselves, and a server-wide one); ``deployment(profile)`` one model's;
``run_server`` is what the CLI runs (a local Ray instance by default, or ``address=`` an existing
cluster). Ray is imported only when one of them is called, so ``import ortpilot.serve`` works
without the extra.

Two stacks on one core. ``serve.oip`` is the Open Inference Protocol (KServe v2 REST and gRPC,
Triton-compatible) for profiles and plain models; ``serve.openai`` serves decoders behind an
OpenAI-compatible API at ``/v1``; ``plan`` picks one per server. The core (this package's modules)
holds what both share: the option records and defaults, the access guard, the request pipeline,
the ingress path and HAProxy wrapper, and the Ray lifecycle. Neither stack imports the other
(an import-linter contract).
"""

from __future__ import annotations

from typing import Any

from ortpilot.serve.options import DecoderOptions, ModelSpec, ServeOptions, ServerOptions, resolve_models


def deployment(profiles: Any, names: Any = (), **kwargs: Any) -> Any:
    """The Ray Serve application of verified replicas for ``profiles`` (see ``ortpilot.serve.oip.app``)."""
    from ortpilot.serve.oip.app import deployment as _deployment

    return _deployment(profiles, names, **kwargs)


def applications(profiles: Any, names: Any = (), **kwargs: Any) -> Any:
    """Every Ray Serve application of a server for ``profiles`` (see ``ortpilot.serve.oip.app``)."""
    from ortpilot.serve.oip.app import applications as _applications

    return _applications(profiles, names, **kwargs)


def run_server(*args: Any, **kwargs: Any) -> Any:
    """Start (or join) Ray, run the application, report readiness, serve until a signal."""
    from ortpilot.serve.oip.readiness import run_server as _run_server

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
