"""Who may talk to a server: API keys, browser origins (CORS), the Host names it answers to.

``AccessOptions`` is the flags (``--api-key``, ``--api-key-file``, ``--auth-health``,
``--cors-origin``, ``--allowed-host``), checked in the driver before Ray starts. What travels to
the replicas (``policy``) holds no key: only each literal key's SHA-256 digest, and the key
file's path, which every replica reads itself and reads again when it changes (rotation without a
restart). So a key is never in a process's arguments or environment that Ray starts, in Ray's
object store or in a log line; the replicas compare digests in constant time (``guard``).
Plain data, no Ray.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ortpilot.errors import UsageError
from ortpilot.rayenv import LOOPBACK_HOSTS, is_loopback_host
from ortpilot.serve.records import AccessPolicy

MAX_KEY_FILE_BYTES = 1024 * 1024


def digest(key: str) -> str:
    """The SHA-256 of a key, hex: what a replica holds instead of the key."""
    return hashlib.sha256(key.encode()).hexdigest()


def parse_key_file(text: str) -> list[str]:
    """The keys of a key file: one per line; blank lines and lines starting with '#' are skipped."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def check_key(key: str, where: str) -> str:
    """``key`` if it can travel in an ``Authorization: Bearer`` header (visible ASCII, no spaces)."""
    if not key or not all(33 <= ord(c) <= 126 for c in key):
        raise UsageError(
            f"{where} holds a key with spaces, control or non-ASCII characters (or an empty one); a key "
            "travels in an 'Authorization: Bearer KEY' header: use visible ASCII characters only."
        )
    return key


def read_key_file(path: str | os.PathLike) -> list[str]:
    """The keys in ``path`` (UsageError when it cannot be read, is too large or holds none)."""
    try:
        raw = Path(path).read_bytes()[: MAX_KEY_FILE_BYTES + 1]
    except OSError as exc:
        raise UsageError(f"Cannot read the API key file '{path}': {exc.strerror or exc}.") from None
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise UsageError(f"The API key file '{path}' is over {MAX_KEY_FILE_BYTES} bytes; it holds one key per line.")
    try:
        keys = parse_key_file(raw.decode("ascii"))
    except UnicodeDecodeError:
        raise UsageError(f"The API key file '{path}' is not ASCII text (one key per line).") from None
    if not keys:
        raise UsageError(f"The API key file '{path}' holds no key (one per line; '#' starts a comment).")
    return [check_key(k, f"The API key file '{path}'") for k in keys]


def _origin(text: str) -> str:
    if text == "*" or text == "null":
        return text
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("http", "https") or not rest or "/" in rest or any(c.isspace() for c in rest):
        raise UsageError(
            f"--cors-origin '{text}' is not an origin: give scheme://host[:port] (e.g. https://app.example.com, "
            "no path), or '*' for any origin."
        )
    return text.lower()


def _host_name(text: str) -> str:
    name = text.strip().lower()
    if not name or any(c.isspace() or c in "/@?#" for c in name):
        raise UsageError(f"--allowed-host '{text}' is not a host name or address (give it without a port).")
    return name.strip("[]")


@dataclass(frozen=True)
class AccessOptions:
    """The access flags of a server (``ServerOptions.access``)."""

    api_keys: tuple[str, ...] = field(default=(), repr=False)  # never printed: repr hides them
    api_key_file: str | None = None  # absolute path; every replica reads it (and again when it changes)
    auth_health: bool = False  # /v2/health/* (and gRPC ServerLive/ServerReady) need a key too
    cors_origins: tuple[str, ...] = ()  # origins a browser page may call from ('*': any)
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted besides the loopback ones

    def __post_init__(self) -> None:
        for key in self.api_keys:
            check_key(key, "--api-key")
        if self.api_key_file is not None:
            path = Path(self.api_key_file).expanduser().resolve()
            read_key_file(path)  # unreadable or empty: exit 2 before anything starts
            object.__setattr__(self, "api_key_file", str(path))
        object.__setattr__(self, "cors_origins", tuple(_origin(o) for o in self.cors_origins))
        object.__setattr__(self, "allowed_hosts", tuple(_host_name(h) for h in self.allowed_hosts))

    @property
    def auth(self) -> bool:
        return bool(self.api_keys or self.api_key_file)

    def client_key(self) -> str | None:
        """A key the driver itself sends (its readiness probes), or None without authentication."""
        if self.api_keys:
            return self.api_keys[0]
        if self.api_key_file:
            keys = read_key_file(self.api_key_file)
            return keys[0]
        return None

    def client_headers(self) -> dict[str, str]:
        key = self.client_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def policy(self, host: str) -> AccessPolicy:
        """What a replica needs to check a request (digests, never keys): ``host`` is the server's
        ``--host``, which decides the Host names accepted without ``--allowed-host``."""
        hosts: tuple[str, ...] | None = None  # a server on a public address answers any Host unless told which
        if is_loopback_host(host) or self.allowed_hosts:
            hosts = tuple(dict.fromkeys([*LOOPBACK_HOSTS, *self.allowed_hosts]))
        return AccessPolicy(
            auth=self.auth,
            digests=tuple(sorted({digest(k) for k in self.api_keys})),
            key_file=self.api_key_file,
            auth_health=self.auth_health,
            cors_origins=self.cors_origins,
            hosts=hosts,
        )

    def warnings(self, host: str) -> list[str]:
        """What the CLI warns about before it starts: a public address without a key."""
        if is_loopback_host(host) or self.auth:
            return []
        return [
            f"--host {host} accepts connections from other machines and no --api-key/--api-key-file is "
            "set: anyone who can reach the port can run the models. Add a key (docs: ortpilot serve, Security)."
        ]


def access_options(
    api_keys: Iterable[str] = (),
    api_key_file: str | None = None,
    *,
    auth_health: bool = False,
    cors_origins: Iterable[str] = (),
    allowed_hosts: Iterable[str] = (),
) -> AccessOptions:
    """``AccessOptions`` from the CLI's values (repeatable flags as iterables)."""
    return AccessOptions(tuple(api_keys), api_key_file, auth_health, tuple(cors_origins), tuple(allowed_hosts))


__all__ = [
    "AccessOptions",
    "access_options",
    "check_key",
    "digest",
    "parse_key_file",
    "read_key_file",
]
