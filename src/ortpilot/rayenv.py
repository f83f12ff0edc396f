"""The environment a Ray client of ortpilot's needs, set before Ray is imported.

Ray on Linux rewrites a ``127.0.0.1`` address to this machine's network address and waits for a
raylet there; a cluster started on loopback (``ray start --head --node-ip-address 127.0.0.1``, a
test's two-node cluster) has none, so ``ray.init`` waits without a word. Ray's single-machine mode
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) keeps loopback as loopback: every client of a loopback
address (``serve --address``, ``tune --ray``) and every local instance runs in it. Usage stats stay
off, and every access-log line is forwarded as it is.
"""

from __future__ import annotations

import os
import socket
import sys

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or address, IPv6 without brackets) is one of this machine's loopback
    names: the one rule for a Ray client, a server's ``--host`` and the Host names it accepts."""
    return host in LOOPBACK_HOSTS


def is_loopback(address: str | None) -> bool:
    """Whether ``address`` (HOST:PORT, ``ray://HOST:PORT``, or None for a local instance) stays on this machine."""
    host = (address or "").removeprefix("ray://").rpartition(":")[0].strip("[]")
    return not address or is_loopback_host(host)


def ray_environment(address: str | None) -> None:
    """Set Ray's environment for a client of ``address`` (None: a local instance); what the user set wins."""
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    if not is_loopback(address):
        return
    os.environ.setdefault(SINGLE_MACHINE, "0")
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and os.environ[SINGLE_MACHINE] == "0":
        # Ray was imported before (the caller's own code): it read the switch then, so set what it read.
        constants.ENABLE_RAY_CLUSTER = False


def unreachable(address: str, flag: str) -> str:
    """Why a HOST:PORT address (given as ``flag``) cannot be a Ray cluster now ("" when it accepts a TCP
    connection): the user hears it at once, where Ray itself retries a closed port for a minute. ``auto``
    and ``local`` are Ray's to find."""
    if address in ("auto", "local"):
        return ""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return f"{flag} '{address}' is not HOST:PORT (the Ray head's GCS address, e.g. 10.0.0.5:6379) or auto."
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
            return ""
    except OSError as exc:
        return (
            f"No Ray cluster answers at '{address}' ({exc.strerror or exc}). Start one ('ray start --head' on the "
            "head, 'ray start --address HEAD:6379' on each node), or give the address 'ray status' prints."
        )


def join_error(address: str, exc: BaseException) -> str:
    """What a client says when ``ray.init(address=...)`` raised: what Ray said, and what to check."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    said = lines[0][:300] if lines else ""
    return (
        f"Could not join the Ray cluster at '{address}' ({type(exc).__name__}: {said}). Check the address "
        "('ray status' on the head prints it), that this machine's Ray version is the cluster's, and, for a "
        "cluster started with token auth, RAY_AUTH_MODE=token and RAY_AUTH_TOKEN."
    )


__all__ = [
    "LOOPBACK_HOSTS",
    "RAY_ENV",
    "is_loopback",
    "is_loopback_host",
    "join_error",
    "ray_environment",
    "unreachable",
]
