"""Ray's gRPC servers on loopback, in every Ray process of a loopback server, whichever stack it runs.

Ray Serve binds its gRPC servers on every interface (``[::]:PORT``): each replica's server for calls
between deployments (``[::]:0``, in every replica of every stack) and the KServe v2 servers of the
proxies and direct-ingress replicas. A server started with a loopback ``--host`` must listen on
nothing else, so where the controller's environment says so (``fastpath.GRPC_LOOPBACK_ENV``, set by
``runner`` for a loopback host on a one-host cluster) ``install`` rewrites those binds to
``127.0.0.1:PORT``. Ray binds the replica's server after the deployment's constructor ran, so a
module that every replica of a stack imports calls ``install`` at import time (the OIP stack's
``oip.grpc_service``, the OpenAI stack's ``openai.deployment``); the proxy gets it through the proxy
callback. It patches two private Ray functions by name; the serve tests read every port a server's
process tree listens on, for both stacks.
"""

from __future__ import annotations

import os
from typing import Any

from ortpilot.serve.fastpath import GRPC_LOOPBACK_ENV

ALL_INTERFACES = "[::]:"


def install() -> bool:
    """Move Ray's all-interface gRPC binds in this process onto 127.0.0.1 when the environment asks for it;
    whether it did (False: not asked, or a Ray without those functions). Safe to call more than once."""
    if os.environ.get(GRPC_LOOPBACK_ENV) != "1":
        return False
    try:
        import ray.serve._private.default_impl as impl
        import ray.serve._private.replica as replica
    except ImportError:
        return False
    impl.add_grpc_address = on_loopback(impl.add_grpc_address)  # the proxies' and replicas' KServe servers
    replica.add_port_to_grpc_server = on_loopback(replica.add_port_to_grpc_server)  # between deployments
    return True


def on_loopback(bind: Any) -> Any:
    """``bind(server, address)`` with Ray's all-interface ``[::]:PORT`` turned into ``127.0.0.1:PORT``."""
    if getattr(bind, "_ortpilot_loopback", False):
        return bind

    def bind_on_loopback(server: Any, address: str) -> Any:
        if address.startswith(ALL_INTERFACES):
            address = "127.0.0.1:" + address[len(ALL_INTERFACES) :]
        return bind(server, address)

    bind_on_loopback._ortpilot_loopback = True  # type: ignore[attr-defined]
    return bind_on_loopback


__all__ = ["install", "on_loopback"]
