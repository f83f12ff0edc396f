"""Field checks for the JSON files ortpilot reads back as input (profile.json, bundle.json).

Each check takes ``(value, name)`` and raises :class:`Bad` naming the field (``name``, dotted)
and the problem; ``fields`` builds the check of an object that accepts only the fields it names.
The callers turn a ``Bad`` into their own one-paragraph ``UsageError``. ``record_of``,
``as_strings`` and ``path_or_none`` are what the frozen records that travel as plain data share
(``TuneRequest``, ``GateOptions``): made strictly from a document, normalised, their data as paths.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ortpilot.errors import UsageError

Check = Callable[[Any, str], None]
R = TypeVar("R")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Bad(Exception):
    """A field that ortpilot would not have written: its dotted name and the problem."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field = field or "(top level)"
        self.problem = problem


def kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


def join(name: str, key: str) -> str:
    return f"{name}.{key}" if name else key


def string(value: Any, name: str, *, nonempty: bool = False, limit: int = 4096) -> None:
    if not isinstance(value, str):
        raise Bad(name, f"expected a string, got a {kind(value)}")
    if nonempty and not value:
        raise Bad(name, "it is empty")
    if len(value) > limit or "\0" in value:
        raise Bad(name, f"a string of {len(value)} characters{' with a NUL' if chr(0) in value else ''}")


def integer(value: Any, name: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Bad(name, f"expected an integer, got a {kind(value)}")
    if not low <= value <= high:
        raise Bad(name, f"{value} is outside {low}..{high}")


def number(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Bad(name, f"expected a finite number, got {value!r}")


def boolean(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise Bad(name, f"expected true or false, got a {kind(value)}")


def json_value(value: Any, name: str, depth: int = 0) -> None:
    """Plain JSON (informational sections): finite numbers, bounded depth."""
    if depth > 32:
        raise Bad(name, "nested more than 32 levels deep")
    if isinstance(value, float):
        number(value, name)
    elif isinstance(value, dict):
        for key, item in value.items():
            json_value(item, f"{name}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            json_value(item, f"{name}[{i}]", depth + 1)
    elif value is not None and not isinstance(value, (str, int, bool)):
        raise Bad(name, f"unexpected {kind(value)}")


def dict_of(check: Check) -> Check:
    def run(value: Any, name: str) -> None:
        if not isinstance(value, dict):
            raise Bad(name, f"expected an object, got a {kind(value)}")
        for key, item in value.items():
            string(key, f"{name} key")
            check(item, f"{name}.{key}")

    return run


def list_of(check: Check, *, nonempty: bool = False, limit: int = 4096) -> Check:
    def run(value: Any, name: str) -> None:
        if not isinstance(value, list):
            raise Bad(name, f"expected an array, got a {kind(value)}")
        if nonempty and not value:
            raise Bad(name, "it is empty")
        if len(value) > limit:
            raise Bad(name, f"{len(value)} items, more than {limit}")
        for i, item in enumerate(value):
            check(item, f"{name}[{i}]")

    return run


def fields(known: Mapping[str, Check], required: Sequence[str] = ()) -> Check:
    """An object with only the ``known`` fields (each checked by its check) and every ``required`` one."""

    def run(value: Any, name: str) -> None:
        if not isinstance(value, dict):
            raise Bad(name, f"expected an object, got a {kind(value)}")
        for key in required:
            if key not in value:
                raise Bad(join(name, key), "it is missing")
        for key, item in value.items():
            check = known.get(key)
            if check is None:
                raise Bad(join(name, str(key)), "ortpilot writes no such field")
            check(item, join(name, key))

    return run


def record_of(cls: Callable[..., R], doc: Mapping[str, Any], what: str) -> R:
    """The frozen record ``cls`` (a dataclass) from its plain-data form ``doc``; a field ``cls`` lacks is a
    ``UsageError`` naming ``what`` (data read back, a fleet job or a journal's, is checked, not trusted)."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(doc) - known)
    if unknown:
        raise UsageError(f"{what} has unknown fields: {', '.join(map(str, unknown))}.")
    return cls(**dict(doc))


def record_or_fields(
    cls: Callable[..., R], record: R | None, keywords: Mapping[str, Any], *, others: bool = False
) -> tuple[R, dict[str, Any]]:
    """``record``, or the record ``cls`` made of the ``keywords`` that are its fields, and the keywords that
    are not: how a function that takes a record also takes its fields as keywords. The record and its
    fields together, or (unless ``others``) a keyword that is no field, is a ``UsageError``."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    given = {k: v for k, v in keywords.items() if k in names}
    rest = {k: v for k, v in keywords.items() if k not in names}
    title = getattr(cls, "__name__", "record")
    if rest and not others:
        raise UsageError(f"Unknown arguments: {', '.join(sorted(rest))} (a {title}'s fields are the options).")
    if record is not None and given:
        raise UsageError(f"Give the {title} or its fields ({', '.join(sorted(given))}) as keywords, not both.")
    return (record if record is not None else cls(**given)), rest


def as_strings(items: str | Sequence[str] | None) -> tuple[str, ...]:
    """A record's names (flag values, outputs, metrics) as a tuple of strings: None is none, and one string
    is one item, not its letters."""
    if items is None:
        return ()
    if isinstance(items, str):
        return (items,)
    return tuple(str(i) for i in items)


def path_or_none(value: Any) -> str | None:
    """A path (``str`` or ``os.PathLike``) as text, anything else (in-memory data) as None: what of a record's
    data travels as plain data."""
    return os.fspath(value) if isinstance(value, (str, os.PathLike)) else None


def sha256(value: Any, name: str) -> None:
    string(value, name)
    if not SHA256.match(value):
        raise Bad(name, "not a sha256 hex digest")


def optional(check: Check) -> Check:
    return lambda v, n: None if v is None else check(v, n)


def read_document(
    path: str | os.PathLike, *, what: str, noun: str, fmt: str, version: int, limit: int, fix: str
) -> dict[str, Any]:
    """A JSON document ortpilot wrote (``{"format": fmt, "version": N, ...}``), read as input: too large, not
    JSON, not of ``fmt`` or of a newer version is a UsageError (exit 2) naming ``what`` and ``fix``.
    ``noun``: what the file is (``an ortpilot profile``); ``fix``: the sentence that says how to get a good one."""
    p = Path(path)
    size = p.stat().st_size
    if size > limit:
        raise UsageError(
            f"{what} '{p}' is {size} bytes, more than {noun} ever is ({limit} at most); it is not one. "
            f"{fix[0].upper()}{fix[1:]}."
        )
    try:
        doc = json.loads(p.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError; deep nesting recurses
        raise UsageError(
            f"{what} '{p}' is not valid JSON ({type(exc).__name__}: {str(exc)[:200]}). It was edited "
            f"or truncated; {fix}."
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise UsageError(f'\'{p}\' is not {noun} (no "format": "{fmt}").')
    found = doc.get("version", 0)
    if isinstance(found, int) and not isinstance(found, bool) and found > version:
        raise UsageError(
            f"{what} '{p}' has format version {found}, newer than this ortpilot reads ({version}). Upgrade ortpilot."
        )
    return doc


__all__ = [
    "SHA256",
    "Bad",
    "Check",
    "as_strings",
    "boolean",
    "dict_of",
    "fields",
    "integer",
    "join",
    "json_value",
    "kind",
    "list_of",
    "number",
    "optional",
    "path_or_none",
    "read_document",
    "record_of",
    "record_or_fields",
    "sha256",
    "string",
]
