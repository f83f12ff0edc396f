"""Sequences of different lengths in one run: pad them, mask the padding, and cut a list into batches.

A model run takes one rectangle of token ids, so sentences of different lengths share a run only
padded to one length, with an attention mask of 0 on the padded positions. Padding is on the
right, so a real token keeps its position. Which length: the longest in the batch, or, with
length *buckets* (a few static lengths a shape plan compiled for), the smallest bucket that holds
the longest; beyond the largest bucket, the longest itself. Sorting by length before cutting
batches keeps a long sentence from padding the short ones. Text serving and a tune's shape plan
pad with these same functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike


def pad_ids(seqs: Sequence[Sequence[int]], length: int, pad_value: int = 0, dtype: DTypeLike = np.int64) -> np.ndarray:
    """``[len(seqs), length]``: each sequence on the left, ``pad_value`` after it. A sequence longer than
    ``length`` is a ValueError (cutting it is the tokenizer's truncation, which says so)."""
    out = np.full((len(seqs), length), pad_value, dtype=dtype)
    for row, seq in enumerate(seqs):
        if len(seq) > length:
            raise ValueError(f"sequence {row} has {len(seq)} tokens, more than the padded length {length}")
        out[row, : len(seq)] = seq
    return out


def attention_mask(lengths: Sequence[int], length: int, dtype: DTypeLike = np.int64) -> np.ndarray:
    """``[len(lengths), length]``: 1 on each row's first ``lengths[row]`` positions, 0 on its padding."""
    counts = np.asarray(lengths, dtype=np.int64).reshape(-1, 1)
    if counts.size and (counts.min() < 0 or counts.max() > length):
        raise ValueError(f"lengths {counts.ravel().tolist()} do not fit a padded length of {length}")
    return (np.arange(length)[None, :] < counts).astype(dtype)


def check_buckets(buckets: Sequence[int] | None) -> tuple[int, ...] | None:
    """Length buckets sorted and without repeats; a length below 1 or not an integer is a ValueError."""
    if buckets is None:
        return None
    values = tuple(buckets)
    if not values or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in values):
        raise ValueError(f"length buckets must be positive integers, got {list(values)}")
    return tuple(sorted({int(b) for b in values}))


def padded_length(longest: int, buckets: Sequence[int] | None = None) -> int:
    """The length a batch whose longest sequence has ``longest`` tokens is padded to: the smallest bucket
    that holds it, else (no buckets, or longer than the largest) ``longest`` itself."""
    for bucket in sorted(buckets or ()):
        if bucket >= longest:
            return int(bucket)
    return int(longest)


@dataclass(frozen=True)
class Batch:
    """One run: which items (indices into the caller's list, longest first) and the length they are padded to."""

    items: tuple[int, ...]
    length: int

    @property
    def rows(self) -> int:
        return len(self.items)

    def fill(self, lengths: Sequence[int]) -> float:
        """The share of the padded rectangle that real tokens fill (1.0: no padding)."""
        return sum(lengths[i] for i in self.items) / max(1, self.rows * self.length)


# What one more run costs, in padded tokens: MiniLM's INT8 profile on 2 CPUs took 0.6 ms a call plus
# 0.05 ms a token (1x8 to 16x64, AMD VNNI, 2026-12-06), i.e. a call is worth about 12 tokens of padding.
RUN_COST_TOKENS = 12.0


def plan_batches(
    lengths: Sequence[int], max_batch: int, buckets: Sequence[int] | None = None, run_cost: float = RUN_COST_TOKENS
) -> list[Batch]:
    """Cut items of these token counts into runs of at most ``max_batch``: sorted longest first (ties keep
    their order), each run padded to its longest item or that item's bucket, and cut where a run's padding
    would cost more than another run: the cuts minimize the padded tokens plus ``run_cost`` per run (16
    sentences of 6 to 60 tokens padded to 60 cost twice what four runs of similar lengths do). An infinite
    ``run_cost`` (a static batch, whose every run costs its full rows) cuts every ``max_batch`` items."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    padded = [padded_length(lengths[i], buckets) for i in order]  # a run starting here pads to this
    if not math.isfinite(run_cost):
        starts = list(range(0, len(order), max_batch))
    else:
        best = [0.0] + [math.inf] * len(order)  # best[j]: the cheapest cut of the first j items
        cut = [0] * (len(order) + 1)
        for end in range(1, len(order) + 1):
            for start in range(max(0, end - max_batch), end):
                cost = best[start] + run_cost + (end - start) * padded[start]
                if cost < best[end]:
                    best[end], cut[end] = cost, start
        starts, end = [], len(order)
        while end > 0:
            end = cut[end]
            starts.append(end)
        starts.reverse()
    bounds = [*starts, len(order)]
    return [Batch(tuple(order[a:b]), padded[a]) for a, b in zip(bounds, bounds[1:])]


def pad_feeds(
    feeds: Mapping[str, np.ndarray], axes: Sequence[tuple[str, int]], size: int, pad_value: Callable[[str], float]
) -> dict[str, np.ndarray]:
    """``feeds`` with each (input, axis) of ``axes`` padded at its end to ``size`` with ``pad_value(input)``
    (a request of a shape plan's bucket: a mask pads with 0, token ids with the tokenizer's pad id)."""
    out = dict(feeds)
    for name, axis in axes:
        value = out[name]
        missing = size - value.shape[axis]
        if missing < 0:
            raise ValueError(f"input '{name}' has {value.shape[axis]} on axis {axis}, more than the padded {size}")
        if missing:
            widths = [(0, 0)] * value.ndim
            widths[axis] = (0, missing)
            out[name] = np.pad(value, widths, constant_values=np.asarray(pad_value(name)).astype(value.dtype))
    return out


def cut_outputs(
    outputs: Sequence[np.ndarray], axes: Sequence[Sequence[tuple[int, str]]], size: int, padded: int
) -> list[np.ndarray]:
    """Each output cut back from a request padded to ``padded`` to its own ``size``: ``axes[i]`` lists output
    i's (axis, how): an axis of the padded size is cut to ``size``; a ``scaled`` axis of another size (a CTC
    recognizer's steps, a fraction of its width) is cut in proportion where the proportion is exact."""
    if size == padded:
        return list(outputs)
    out = []
    for value, cuts in zip(outputs, axes):
        index: list[slice] = [slice(None)] * np.ndim(value)
        for axis, how in cuts:
            have = value.shape[axis]
            if have == padded:
                index[axis] = slice(0, size)
            elif how == "scaled" and (have * size) % padded == 0:
                index[axis] = slice(0, have * size // padded)
        out.append(value[tuple(index)] if any(i != slice(None) for i in index) else value)
    return out


__all__ = [
    "RUN_COST_TOKENS",
    "Batch",
    "attention_mask",
    "check_buckets",
    "cut_outputs",
    "pad_feeds",
    "pad_ids",
    "padded_length",
    "plan_batches",
]
