"""The checks every request passes before a route sees it: its Host, its browser Origin, its API key.

A replica (and the server-wide application, and the OpenAI ingress) builds one ``Guard`` from the
``policy`` the driver sent (``access.AccessOptions.policy``): the digests of the literal keys and
the path of the key file, which the guard reads itself and again when the file changes (checked
at most once a second), so keys rotate without a restart. A presented key is hashed and compared
with every digest in constant time (``hmac.compare_digest``); it is never logged or echoed.

``http`` answers a request it refuses (or a CORS preflight) with a ``Verdict``; each protocol puts
it in its own error shape (Open Inference Protocol, OpenAI, gRPC status). Plain code, no Ray.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ortpilot.serve.access import MAX_KEY_FILE_BYTES, parse_key_file
from ortpilot.serve.records import AccessPolicy

log = logging.getLogger("ortpilot.serve")
RECHECK_S = 1.0  # how often a replica looks at the key file for a change
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "authorization, content-type, inference-header-content-length"
CORS_EXPOSED = "inference-header-content-length, retry-after"
CORS_MAX_AGE_S = 600


@dataclass
class Verdict:
    """A request the guard answers itself: a refusal (401/403) or a CORS preflight's 204."""

    status: int
    message: str
    code: str  # a short machine-readable reason (OpenAI's ``code`` field)
    headers: dict[str, str] = field(default_factory=dict)


class KeyRing:
    """The SHA-256 digests of the keys a server takes: the literal ones, and the key file's, re-read on change."""

    def __init__(self, digests: Iterable[str] = (), key_file: str | None = None) -> None:
        self.fixed = tuple(bytes.fromhex(d) for d in digests)
        self.key_file = key_file
        self._from_file: tuple[bytes, ...] = ()
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        if key_file:
            self._reload(force=True)

    def _reload(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < RECHECK_S:
            return
        with self._lock:
            self._checked = now
            try:
                st = os.stat(self.key_file)  # type: ignore[arg-type]
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
                if stamp == self._stamp:
                    return
                with open(self.key_file, "rb") as fh:  # type: ignore[arg-type]
                    raw = fh.read(MAX_KEY_FILE_BYTES)
            except OSError as exc:  # a file being replaced must not open the door: the keys read last apply
                if self._stamp is not None or force:
                    log.warning("The API key file cannot be read now (%s); the keys read last still apply.", exc)
                self._stamp = None
                return
            keys = [k for k in parse_key_file(raw.decode("ascii", errors="replace")) if _usable(k)]
            if not keys:
                log.warning("The API key file holds no usable key now: requests need one of the --api-key keys.")
            self._from_file = tuple(hashlib.sha256(k.encode()).digest() for k in keys)
            self._stamp = stamp

    def accepts(self, presented: str | None) -> bool:
        """Whether ``presented`` is one of the keys; every digest is compared, in constant time each."""
        if self.key_file:
            self._reload()
        if not presented:
            return False
        given = hashlib.sha256(presented.encode(errors="surrogateescape")).digest()
        ok = False
        for known in (*self.fixed, *self._from_file):
            ok |= hmac.compare_digest(given, known)
        return ok


def _usable(key: str) -> bool:
    return all(33 <= ord(c) <= 126 for c in key)


def bearer(value: str | None) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header value (the scheme in any case), else None."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def host_name(value: str | None) -> str:
    """The name of a Host header without its port: ``[::1]:8000`` -> ``::1``, ``Example.com:80`` -> ``example.com``."""
    text = (value or "").strip().lower()
    if text.startswith("["):
        return text[1:].partition("]")[0]
    return text.rpartition(":")[0] if text.count(":") == 1 else text


class Guard:
    """Host, Origin and API-key checks for one deployment, from the driver's ``policy`` (None: none)."""

    def __init__(self, policy: AccessPolicy | None = None) -> None:
        policy = policy or AccessPolicy()
        self.auth = policy.auth
        self.keys = KeyRing(policy.digests, policy.key_file) if self.auth else None
        self.auth_health = policy.auth_health
        self.origins = frozenset(policy.cors_origins)
        self.hosts = frozenset(policy.hosts) if policy.hosts is not None else None

    # -- HTTP ---------------------------------------------------------------------------------------
    def http(self, method: str, headers: Mapping[str, str], health: bool = False) -> Verdict | None:
        """The answer to a request the guard does not let through (None: let it through). ``health``:
        the route is a health probe, open without a key unless ``--auth-health``."""
        if self.hosts is not None:
            name = host_name(headers.get("host"))
            if name not in self.hosts:
                return Verdict(
                    403,
                    "This server does not answer to that Host name (a page in a browser may be trying to reach "
                    "it through DNS rebinding); add the name with --allowed-host if it is yours.",
                    "host_not_allowed",
                )
        origin = headers.get("origin")
        if origin is not None:
            if not self._origin_allowed(origin):
                return Verdict(
                    403,
                    "Requests from this browser origin are not allowed; start the server with --cors-origin "
                    "ORIGIN to allow a page to call it.",
                    "origin_not_allowed",
                )
            if method == "OPTIONS" and "access-control-request-method" in headers:
                return Verdict(
                    204,
                    "",
                    "preflight",
                    {
                        **self.cors_headers(headers),
                        "Access-Control-Allow-Methods": CORS_METHODS,
                        "Access-Control-Allow-Headers": CORS_HEADERS,
                        "Access-Control-Max-Age": str(CORS_MAX_AGE_S),
                    },
                )
        if self.auth and (self.auth_health or not health):
            return self._key(headers.get("authorization"))
        return None

    def cors_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The CORS headers of a response to an allowed browser origin (none for other requests)."""
        origin = headers.get("origin")
        if origin is None or not self._origin_allowed(origin):
            return {}
        return {
            "Access-Control-Allow-Origin": "*" if "*" in self.origins else origin,
            "Access-Control-Expose-Headers": CORS_EXPOSED,
            "Vary": "Origin",
        }

    def _origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin.strip().lower() in self.origins

    # -- gRPC ---------------------------------------------------------------------------------------
    def grpc(self, context: Any, health: bool = False) -> Verdict | None:
        """The refusal of a gRPC call (None: let it through): its ``authorization`` metadata, as for HTTP.
        ``context`` None is a call through a Serve handle (the server-wide application relaying a call it
        checked already), never a client's: clients' calls always come with one."""
        if not self.auth or (health and not self.auth_health) or context is None:
            return None
        value = None
        for key, item in context.invocation_metadata() or ():
            if key.lower() == "authorization":
                value = item if isinstance(item, str) else item.decode(errors="replace")
                break
        return self._key(value)

    def _key(self, authorization: str | None) -> Verdict | None:
        key = bearer(authorization)
        if key is not None and self.keys is not None and self.keys.accepts(key):
            return None
        message = (
            "Missing API key: send it as 'Authorization: Bearer KEY'."
            if key is None
            else "Invalid API key (it is not one this server takes)."
        )
        return Verdict(401, message, "invalid_api_key", {"WWW-Authenticate": "Bearer"})


__all__ = ["Guard", "KeyRing", "Verdict", "bearer", "host_name"]
