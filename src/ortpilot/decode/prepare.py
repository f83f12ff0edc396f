"""A decoder made ready to generate: its model file, tokenizer, stop ids and fusion, found once.

``ortpilot generate`` and ``ortpilot serve`` both start from what a user has (a model file, a
folder with a model and its tokenizer, ``demo:decoder``) and need the same answers: which
tokenizer speaks for it, whether attention must be fused into GroupQueryAttention first (and
the note that says what the fusion did), and which token ids end a turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortpilot.errors import UsageError

DEMO = "demo:decoder"


@dataclass(frozen=True)
class PreparedDecoder:
    """``model``: what a session loads (a path, or the fused ModelProto); ``notes``: what was done to it."""

    model: Any
    tokenizer: Path | None
    notes: tuple[str, ...] = ()
    cache_path: Path | None = None  # the fused model's file in the content-addressed cache

    def load_tokenizer(self) -> Any:
        from ortpilot.decode.text import load_tokenizer

        return load_tokenizer(self.tokenizer) if self.tokenizer else None


def find_tokenizer(
    source: str, tokenizer: str | None, folders: list[Path] = (), *, required: bool = False, demo_own: bool = True
) -> Path | None:
    """``tokenizer`` (a tokenizer.json or its folder), else the demo decoder's own (``demo_own``), else a
    ``tokenizer.json`` in one of ``folders``; ``required`` makes a missing one a UsageError."""
    if tokenizer:
        from ortpilot.data.text import tokenizer_file

        return tokenizer_file(tokenizer).resolve()
    if source == DEMO and demo_own:
        from ortpilot.models import demo_tokenizer_path

        return Path(demo_tokenizer_path())  # the demo decoder's byte-level tokenizer, built offline
    for folder in folders:
        if (folder / "tokenizer.json").is_file():
            return (folder / "tokenizer.json").resolve()
    if required:
        raise UsageError(
            f"No tokenizer for '{source}': the OpenAI endpoints speak text, so give --tokenizer "
            "PATH/tokenizer.json (or serve a folder that holds one beside the model)."
        )
    return None


def fuse(model: Any, max_positions: int | None = None) -> tuple[Any, str, Path]:
    """``model`` with its attention fused into GroupQueryAttention (content-addressed cache, so only the
    first call pays): (the fused ModelProto, the note saying what the fusion did, its cached file)."""
    from ortpilot.passes.decoder_fusion import fuse_decoder, summary

    fused = fuse_decoder(model, use_cache=True, max_positions=max_positions)
    return fused.model, summary(fused), Path(fused.record.extra["cache_path"])


def prepare(
    source: str,
    model: Any,
    *,
    tokenizer: str | None = None,
    folders: list[Path] = (),
    fuse_attention: bool = False,
    max_positions: int | None = None,
    require_tokenizer: bool = False,
) -> PreparedDecoder:
    """The decoder ``model`` (what ``source`` names) with its tokenizer, its attention fused into
    GroupQueryAttention first when ``fuse_attention``."""
    tok = find_tokenizer(source, tokenizer, list(folders), required=require_tokenizer)
    if not fuse_attention:
        return PreparedDecoder(model, tok)
    fused, note, cached = fuse(model, max_positions)
    return PreparedDecoder(fused, tok, (note,), cached)


def stop_ids(tokenizer: Any, extra: list[int] = ()) -> list[int]:
    """``extra`` ids and the tokenizer's end-of-turn ids."""
    from ortpilot.decode import text as textmod

    return list(extra) + (textmod.stop_ids(tokenizer) if tokenizer is not None else [])


__all__ = ["PreparedDecoder", "find_tokenizer", "fuse", "prepare", "stop_ids"]
