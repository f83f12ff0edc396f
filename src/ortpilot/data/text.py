"""Sentences in, model feeds out: a text file (one sample per line) through the model's ``tokenizer.json``.

Only the ``tokenizers`` package is needed. Every line becomes one sample of batch 1 at its own
length, as ``tokenizer(text)`` and sentence-transformers send it (the padding a tokenizer.json may
ask for is not applied: real sentences are short, and a tune measures what users send), truncated
where a deployment of the folder cuts texts (its ``max_seq_length``: ``text_model`` and serving cut there)
and never past the model's position limit (``max_position_embeddings`` from the folder's config, or the
input's static length). ``--shape`` fixes one length instead: every line is then padded or truncated to it.
``attention_mask`` and ``token_type_ids`` are filled as the tokenizer says (masks 0 on padding), and
each array takes the dtype the model declares. Inputs the text cannot fill are refused by name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.errors import UsageError
from ortpilot.graph.shapes import InputInfo

# Model input -> which field of a tokenizers Encoding fills it.
TEXT_INPUTS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
MAX_LINES = 100_000


def tokenizer_file(path: str | os.PathLike) -> Path:
    """``path`` if it is a tokenizer file, or the ``tokenizer.json`` in the folder it names; a UsageError
    when there is none (every ``--tokenizer`` flag reads it through here)."""
    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise UsageError(f"Tokenizer file '{file}' does not exist; pass the tokenizer.json saved with the model.")
    return file


def load_tokenizer(path: str | os.PathLike) -> Any:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json`` (or a folder holding one)."""
    file = tokenizer_file(path)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("Reading text needs the 'tokenizers' package: pip install tokenizers.") from None
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:
        raise UsageError(f"'{file}' is not a Hugging Face tokenizer.json ({exc}).") from None


def read_lines(path: str | os.PathLike) -> list[str]:
    """The file's non-empty lines (UTF-8); an empty or undecodable file is a UsageError naming it."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise UsageError(f"Text file '{p}' cannot be read ({exc.strerror or exc}).") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UsageError(
            f"Text file '{p}' is not UTF-8 (line {line}, byte {exc.start}: {exc.reason}). Save it as "
            "UTF-8, one sample per line."
        ) from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise UsageError(f"Text file '{p}' holds no text: give one sample (a sentence, a paragraph) per line.")
    if len(lines) > MAX_LINES:
        raise UsageError(f"Text file '{p}' has {len(lines)} lines; {MAX_LINES} samples at most are read.")
    return lines


def text_inputs(inputs: Sequence[InputInfo]) -> dict[str, InputInfo]:
    """The model inputs a tokenizer fills, by name; any other input is a UsageError."""
    by_name = {i.name: i for i in inputs}
    unknown = [name for name in by_name if name not in TEXT_INPUTS]
    if unknown or "input_ids" not in by_name:
        raise UsageError(
            f"Text samples fill the inputs {', '.join(TEXT_INPUTS)}, but the model takes "
            f"{', '.join(by_name)}: {', '.join(unknown) or 'no input_ids'} cannot come from text. Give "
            "--calibration with arrays for this model instead."
        )
    return by_name


def encode_lines(
    lines: Sequence[str],
    tokenizer: Any,
    inputs: Sequence[InputInfo],
    *,
    sequence: int | None = None,
    max_positions: int | None = None,
    max_length: int | None = None,
) -> tuple[list[dict[str, np.ndarray]], list[str]]:
    """(samples, notes): each line as one feed dict of batch 1, at its own length (cut at ``max_length`` where
    given, as a deployment cuts it) or at ``sequence`` (``--shape``: up to the position limit)."""
    by_name = text_inputs(inputs)
    pad_value = pad_id(tokenizer)
    tokenizer.no_padding()  # a tokenizer.json that pads to a fixed length would hide the lengths users send
    encodings = tokenizer.encode_batch(list(lines))
    limit = max_positions
    dims = by_name["input_ids"].dims
    static = dims[1] if len(dims) > 1 else None
    if isinstance(static, int) and static > 0:
        limit = static if limit is None else min(limit, static)
        sequence = sequence or static
    if sequence and limit and sequence > limit:
        raise UsageError(
            f"--shape asks for {sequence} tokens, but the model's position limit is {limit} "
            "(max_position_embeddings or the input's length): give a shorter sequence."
        )
    longest = max(len(e.ids) for e in encodings)
    cut = sequence or min((n for n in (limit, max_length) if n), default=None)
    notes = []
    truncated = sum(1 for e in encodings if cut and len(e.ids) > cut)
    if truncated:
        notes.append(
            f"{truncated} of {len(lines)} text samples were longer than {cut} tokens and were truncated "
            f"(longest: {longest})"
        )
    samples = []
    for enc in encodings:
        if cut:
            enc.truncate(cut)
        if sequence:
            enc.pad(sequence, pad_id=pad_value)
        sample = {}
        for name, info in by_name.items():
            values = getattr(enc, TEXT_INPUTS[name])
            sample[name] = np.asarray([values], dtype=np.dtype(info.dtype))
        samples.append(sample)
    return samples, notes


def pad_id(tokenizer: Any) -> int:
    """The id a tokenizer pads with: its padding setting's, else the first pad-like token it knows, else 0."""
    padding = tokenizer.padding or {}
    if padding.get("pad_id") is not None:
        return int(padding["pad_id"])
    for token in ("[PAD]", "<pad>", "<|pad|>", "<|endoftext|>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


def text_samples(
    path: str | os.PathLike,
    tokenizer: Any,
    inputs: Sequence[InputInfo],
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    max_positions: int | None = None,
    max_length: int | None = None,
) -> tuple[list[dict[str, np.ndarray]], list[str]]:
    """Samples from a text file; ``shapes`` (parsed ``--shape``) may fix the sequence length."""
    sequence = None
    ids = next((i for i in inputs if i.name == "input_ids"), None)
    dim_name = ids.dims[1] if ids is not None and len(ids.dims) > 1 and isinstance(ids.dims[1], str) else None
    for key in ("input_ids", dim_name):
        dims = (shapes or {}).get(key) if key else None
        if dims:
            sequence = int(dims[-1])
            break
    return encode_lines(
        read_lines(path), tokenizer, inputs, sequence=sequence, max_positions=max_positions, max_length=max_length
    )


__all__ = [
    "TEXT_INPUTS",
    "encode_lines",
    "load_tokenizer",
    "pad_id",
    "read_lines",
    "text_inputs",
    "text_samples",
    "tokenizer_file",
]
