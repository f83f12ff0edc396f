"""Why a request body is not JSON, in words a client can act on, for every protocol's parser.

A JSON parser given bytes that are not UTF-8 answers in its own terms ("surrogates not allowed: line 1 column 1",
or a byte offset into its decoded text); the body's encoding is the client's mistake, so it is named first.
"""

from __future__ import annotations


def not_json_reason(body: bytes, error: BaseException, limit: int = 160) -> str:
    """What is wrong with ``body``, which a JSON parser refused with ``error``: not UTF-8 (at which byte), or the
    parser's own reason on one line."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"it is not UTF-8: byte {exc.start} (0x{body[exc.start]:02x}) {exc.reason}"
    return " ".join(str(error).split())[:limit]


__all__ = ["not_json_reason"]
