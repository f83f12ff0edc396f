"""Every default a served request is held to, defined once: the CLI's flags, the option records, the
replicas and HAProxy's config all read them here, so a changed default changes everywhere at once."""

from __future__ import annotations

import inspect
from typing import Any

DEFAULT_PORT = 8000
DEFAULT_MAX_REQUEST_MB = 64.0  # request bodies (REST, gRPC messages, /v1) over this get 413
DEFAULT_HEADER_TIMEOUT_S = 10  # request line and headers (HAProxy ``timeout http-request``)
DEFAULT_REQUEST_TIMEOUT_S = 300  # a request, from its first byte to its answer (replicas enforce it)
DEFAULT_IDLE_TIMEOUT_S = 60  # a kept-alive connection with no request
DEFAULT_READY_TIMEOUT_S = 300.0  # the driver waits this long for a verified replica of each model
DEFAULT_MAX_HEADER_KB = 32  # request line and headers together (HAProxy: 431 beyond)
# Text models (``TextOptions``): the limits OpenAI documents for /v1/embeddings (2,048 inputs, 300,000 tokens
# summed over them), and the texts one run takes (``ortpilot.embed``'s default).
DEFAULT_MAX_TEXTS = 2048
DEFAULT_MAX_REQUEST_TOKENS = 300_000
DEFAULT_TEXT_BATCH = 32
LIVE_PATH, READY_PATH = "/v2/health/live", "/v2/health/ready"  # both stacks answer the OIP probes
HEALTH_PATHS = (LIVE_PATH, READY_PATH)  # open without a key unless --auth-health
# A call whose replica died (not the request's fault) runs again on another replica this many times,
# after ``retry_delay_s(attempt)``: inference is idempotent, and a restarted replica takes a moment.
REPLICA_RETRIES = 2
# A stopping replica finishes what it holds, checking this often whether anything is left (Ray Serve's own
# default is 2 s, which every replica waited at least once however idle: the whole of a Ctrl-C's wait).
SHUTDOWN_POLL_S = 0.5


def start_tries(replicas: int) -> int:
    """Failed replica starts a model's deployment takes before Ray gives it up (its ``max_constructor_retry_count``),
    while none of its replicas has started: one per replica. A replica's start loads the profile and verifies it on
    its node, which on that node fails the same way every time (a reference that does not reproduce, a model that
    does not load); Ray's default of three per replica made ``serve`` wait through two more model loads per
    replica before it said why (24 s for one replica). Once a replica has started, Ray restarts failed ones as
    before. On a cluster of several machine classes a plain profile verifies on its own class only: a replica
    placed elsewhere fails (serve a bundle, ``tune --ray``, or pass ``--accept-machine``)."""
    return max(1, replicas)


def start_tries_option(serve: Any, replicas: int) -> dict[str, int]:
    """``serve.deployment``'s ``max_constructor_retry_count`` of ``start_tries``, where this Ray Serve takes it
    (Ray 2.50 and later; before, Ray's own count holds)."""
    if "max_constructor_retry_count" not in inspect.signature(serve.deployment).parameters:
        return {}
    return {"max_constructor_retry_count": start_tries(replicas)}


def retry_delay_s(attempt: int) -> float:
    """The pause before retry number ``attempt + 1`` of a call whose replica died."""
    return 0.2 * (attempt + 1)


def megabytes(mb: float) -> int:
    """``--max-request-mb`` in bytes (MiB, as the flag's help says)."""
    return int(mb * 1024 * 1024)


__all__ = [
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_HEADER_KB",
    "DEFAULT_MAX_REQUEST_MB",
    "DEFAULT_MAX_REQUEST_TOKENS",
    "DEFAULT_MAX_TEXTS",
    "DEFAULT_PORT",
    "DEFAULT_READY_TIMEOUT_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_TEXT_BATCH",
    "HEALTH_PATHS",
    "LIVE_PATH",
    "READY_PATH",
    "REPLICA_RETRIES",
    "megabytes",
    "retry_delay_s",
    "start_tries",
    "start_tries_option",
]
