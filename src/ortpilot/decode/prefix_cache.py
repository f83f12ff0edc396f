"""Prompts that share a prefix (a system prompt, a chat history) reuse its KV rows instead of prefilling.

The cache holds blocks of ``block`` tokens. A block's key hashes its tokens and its parent's key,
so one key names a whole prefix, and the longest cached prefix of a prompt is found by walking
its blocks from the start. A block's rows are copies of the shared buffer's rows for those
tokens (one array per past/present pair), kept outside the buffer: on a hit they are copied
into the new request's slot and only the rest of the prompt is prefilled, after them, as the
next chunk of a chunked prefill.

Greedy tokens with the cache equal those without it. Only prefill runs write cached rows (never
decode steps: a one-token run rounds attention differently, decode/batched.py), a prefill chunk
computes each row as a whole prefill would, and a hit always leaves at least two prompt tokens
to prefill, because a lone-token chunk after a prefix would take MLAS's one-row kernel.

The cache is bounded by ``capacity_bytes``: inserting past it evicts the least recently used
block that no other cached block extends and no request is still loading. A request pins the
blocks it matched from admission until its prefill is done (or it is cancelled, which unpins).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ortpilot.decode.batched import BatchedLoop
from ortpilot.errors import UsageError

MIN_REST = 2  # prompt tokens a hit leaves to prefill: never one (decode/batched.py, chunk_length)


@dataclass
class _Block:
    parent: bytes | None
    rows: list[np.ndarray]
    nbytes: int
    children: int = 0
    pins: int = 0


@dataclass(frozen=True)
class PrefixMatch:
    """The cached blocks that start a prompt (keys in order) and the tokens they cover."""

    keys: tuple[bytes, ...] = ()
    tokens: int = 0


@dataclass
class CacheCounters:
    """Cumulative: requests that reused a prefix (hits) or found none (misses), tokens reused, blocks."""

    hits: int = 0
    misses: int = 0
    hit_tokens: int = 0
    stored_blocks: int = 0
    evictions: int = 0


class PrefixCache:
    """Block-granular prefix index with LRU eviction under a memory cap (bytes)."""

    def __init__(self, capacity_bytes: int, block: int, token_bytes: int) -> None:
        self.block = block
        self.block_bytes = block * token_bytes
        if capacity_bytes < self.block_bytes:
            raise UsageError(
                f"prefix_cache_bytes {capacity_bytes} is below one block of the prefix cache "
                f"({self.block_bytes} bytes: prefix_block {block} tokens x {token_bytes} bytes of KV cache per "
                "token); give at least that, or 0 to turn the cache off."
            )
        self.capacity_bytes = capacity_bytes
        self.bytes_held = 0
        self.counters = CacheCounters()
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()

    def keys(self, prompt: Sequence[int], blocks: int) -> list[bytes]:
        """Keys of the first ``blocks`` full blocks of ``prompt`` (each hashes its parent's key too)."""
        out: list[bytes] = []
        parent = b""
        ids = np.asarray(prompt, dtype=np.int64)
        for i in range(blocks):
            parent = hashlib.blake2b(
                parent + ids[i * self.block : (i + 1) * self.block].tobytes(), digest_size=16
            ).digest()
            out.append(parent)
        return out

    def lookup(self, prompt: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix that leaves at least two tokens to prefill; its blocks are pinned."""
        usable = max(0, (len(prompt) - MIN_REST) // self.block)
        found: list[bytes] = []
        for key in self.keys(prompt, usable):
            if key not in self._blocks:
                break
            found.append(key)
        for key in found:
            self._blocks[key].pins += 1
            self._blocks.move_to_end(key)
        match = PrefixMatch(tuple(found), len(found) * self.block)
        if found:
            self.counters.hits += 1
            self.counters.hit_tokens += match.tokens
        else:
            self.counters.misses += 1
        return match

    def load(self, loop: BatchedLoop, slot: int, match: PrefixMatch) -> None:
        """Copy the matched rows into ``slot``, which then holds ``match.tokens`` tokens."""
        for i, key in enumerate(match.keys):
            loop.write_rows(slot, i * self.block, self._blocks[key].rows)
        loop.lengths[slot] = match.tokens

    def release(self, match: PrefixMatch) -> None:
        """The request no longer needs its matched blocks kept (prefill done, or cancelled)."""
        for key in match.keys:
            block = self._blocks.get(key)
            if block is not None and block.pins > 0:
                block.pins -= 1

    def store(self, loop: BatchedLoop, slot: int, prompt: Sequence[int]) -> int:
        """Keep the full blocks of ``slot``'s prefilled ``prompt`` that are not cached yet; blocks added."""
        added = 0
        parent: bytes | None = None
        for i, key in enumerate(self.keys(prompt, len(prompt) // self.block)):
            held = self._blocks.get(key)
            if held is not None:
                self._blocks.move_to_end(key)
                parent = key
                continue
            if not self._make_room(protect=parent):
                break
            rows = loop.copy_rows(slot, i * self.block, (i + 1) * self.block)
            self._blocks[key] = _Block(parent, rows, sum(r.nbytes for r in rows))
            if parent is not None:
                self._blocks[parent].children += 1
            self.bytes_held += self._blocks[key].nbytes
            added += 1
            parent = key
        self.counters.stored_blocks += added
        return added

    def _make_room(self, protect: bytes | None) -> bool:
        while self.bytes_held + self.block_bytes > self.capacity_bytes:
            victim = next(
                (k for k, b in self._blocks.items() if b.children == 0 and b.pins == 0 and k != protect), None
            )
            if victim is None:
                return False
            block = self._blocks.pop(victim)
            self.bytes_held -= block.nbytes
            if block.parent is not None and block.parent in self._blocks:
                self._blocks[block.parent].children -= 1
            self.counters.evictions += 1
        return True

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    @property
    def pinned(self) -> int:
        """Blocks some request still holds (admitted, prefill not done)."""
        return sum(1 for b in self._blocks.values() if b.pins)

    def stats(self) -> dict[str, int]:
        c = self.counters
        return {
            "hits": c.hits,
            "misses": c.misses,
            "hit_tokens": c.hit_tokens,
            "stored_blocks": c.stored_blocks,
            "evictions": c.evictions,
            "blocks": self.blocks,
            "bytes_held": self.bytes_held,
            "capacity_bytes": self.capacity_bytes,
            "block_tokens": self.block,
        }


__all__ = ["MIN_REST", "PrefixCache", "PrefixMatch"]
