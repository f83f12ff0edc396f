"""Errors that carry their own exit code and a one-paragraph explanation.

Every error a user can cause or ortpilot can detect is one of these; the CLI prints
``str(err)`` and exits with ``err.exit_code``. Anything else is a bug and shows a traceback.
"""

from __future__ import annotations


class OrtpilotError(Exception):
    """Base class. ``exit_code`` follows docs/concepts/failure-modes.md: 1 verification failed, 2 bad input."""

    exit_code: int = 2


class UsageError(OrtpilotError):
    """Bad usage or bad input: a wrong flag, a missing file, a malformed model or feed."""

    exit_code = 2


def require_bools(values: dict[str, object]) -> None:
    """A UsageError naming the first of ``values`` (option name -> value) that is not True or False: a Python
    caller's "false" or "no" is a true string."""
    for name, value in values.items():
        if not isinstance(value, bool):
            raise UsageError(f"{name} must be True or False, got {value!r}.")


class ModelLoadError(UsageError):
    """The model file cannot be read, parsed or checked (missing, truncated, external data)."""


class InputError(UsageError):
    """Feeds do not match the model (unknown names, wrong dtype, rank or shape)."""


class ProviderError(UsageError):
    """An unknown provider name or malformed provider options."""


class StorageError(UsageError):
    """The machine refused a write or read: no space, read-only, no permission, a file in the way."""

    def __init__(self, message: str, *, errno: int | None = None, path: str = "") -> None:
        super().__init__(message)
        self.errno = errno
        self.path = path


class VerificationError(OrtpilotError):
    """A check failed: strict fallback, accuracy gate, stamp mismatch."""

    exit_code = 1


class ProviderFallbackError(VerificationError):
    """The session did not run on the requested provider (any of the four fallback layers)."""

    def __init__(
        self, message: str, *, requested: str = "", loaded: list[str] | None = None, reason: str = "", layer: int = 0
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.loaded = list(loaded or [])
        self.reason = reason
        self.layer = layer


class StampMismatchError(VerificationError):
    """An artifact was built for another ORT version, EP or model than the one in use."""


class AccuracyGateError(VerificationError):
    """A transformed model's error against its source exceeds the allowed maximum."""


class OrtRunError(VerificationError):
    """ORT raised while running valid-looking inputs: out of memory, or a kernel that refuses them."""


class SamplingError(VerificationError):
    """No token can be drawn for one sequence (its logits hold NaN or infinity): that sequence ends, not its batch."""


class OrtCrashError(VerificationError):
    """ORT killed the (child) process while loading or running a model."""


class FleetError(OrtpilotError):
    """A fleet tune could not tune every machine class (a node died, a search failed): the bundle is
    written incomplete (``complete: false``), and ``result`` holds what was tuned."""

    def __init__(self, message: str, *, exit_code: int = 1, result: object = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.result = result


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the signal arrived so that cleanup runs as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class QueueFullError(OrtpilotError):
    """Every decode stream is busy and the request queue is at its limit (HTTP 429, Retry-After)."""

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
