"""The batched shared-buffer loop: many sequences in one run, one KV buffer per cache pair.

Each past/present pair gets one ``[slots, kv_heads, max_length, head_dim]`` buffer, bound as
both past and present, so GroupQueryAttention appends every row's new token in place. Each
slot holds one sequence with its own length: GQA reads a length per row (``seqlens_k``, which a
fused graph derives from ``position_ids`` or ``attention_mask``), so sequences that started at
different times decode in one run, and the weights are read once per step for all of them.

A new sequence is prefilled by a batch-1 run bound to its slot's region of the buffers (the
batch axis is the outer one, so a slot is one contiguous block). It cannot share a run with
the decoding rows: ORT's CPU GroupQueryAttention refuses ``sequence_length > 1`` after a past
unless the batch is 1 ("batch_size must be 1 when sequence_length > 1 and past context is
given"). It does accept that for batch 1 (its "subsequent prompt" mode), so a long prompt can
be prefilled in chunks between decode steps, and the decoding rows wait one chunk, not the
whole prompt.

Why every row gets the tokens single-stream ``generate`` gives it: each op computes a row from
that row alone, and the kernels do the same arithmetic for a row whatever the batch. Weight
MatMuls run on ORT's prepacked weights (MLAS's packed SGEMM has no special case for one row,
and ``MatMulNBits`` with int8 compute quantizes each row on its own); GroupQueryAttention runs
one GEMM per (row, head) over that row's own length. The one kernel that rounds differently
is MLAS's one-row SGEMM for an unpacked B (AVX multiply-then-add, no FMA), which GQA's
``Q K^T`` and ``probs V`` take when a run has one token: a decode step has one token per row
in both loops, so they agree, but a one-token prefill chunk after a longer prompt would not
(logits 1e-6 apart, measured), so :func:`chunk_length` never plans one. ``MatMulNBits`` with
fp32 compute (``accuracy_level`` 1) has a one-row kernel of its own: a batch of rows is 1e-6
away from the same rows one at a time (measured on the demo decoder), so greedy tokens of
such a model can differ from single-stream ones at a near tie.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort

from ortpilot.decode.loops import Traffic, cast_feed, logits_dtype
from ortpilot.decode.signature import CacheEntry, DecoderSignature
from ortpilot.errors import UsageError


def chunk_length(remaining: int, budget: int) -> int:
    """Tokens of the next prefill run: at most ``budget`` (0: all), never a lone token.

    A one-token run after a longer prefix takes MLAS's one-row GEMM in attention and rounds
    differently from a full prefill (module docstring), so a last chunk of one token is merged
    into the run before it, and a budget of one still takes two.
    """
    if remaining <= 2 or budget <= 0 or budget >= remaining:
        return remaining
    take = max(budget, 2)
    if remaining - take == 1:
        take += 1
    return min(take, remaining)


def kv_buffer_bytes(sig: DecoderSignature, slots: int, max_length: int) -> int:
    """Bytes of the KV buffer a batched loop of ``slots`` streams of ``max_length`` tokens holds."""
    return sum(math.prod(c.shape(slots, max_length)) * np.dtype(c.dtype).itemsize for c in sig.cache)


def check_kv_memory(sig: DecoderSignature, slots: int, max_length: int) -> None:
    """Refuse a KV buffer larger than the memory available before allocating it (a UsageError naming the two
    settings that size it; numpy said only "Unable to allocate 122. GiB" for one of its arrays)."""
    from ortpilot.graph.feeds import available_memory

    need, available = kv_buffer_bytes(sig, slots, max_length), available_memory()
    if available is not None and need > available:
        raise UsageError(
            f"The KV buffer of {slots:,} stream(s) x {max_length:,} tokens needs {need / 2**30:,.1f} GiB, more than "
            f"the {available / 2**30:,.1f} GiB of memory available (each replica holds one): lower max_streams "
            "(--max-streams) or max_length (--max-length)."
        )


def check_batchable(sig: DecoderSignature) -> None:
    """Refuse a decoder whose rows cannot decode in one run, saying why (a UsageError, exit 2)."""
    why = sig.no_shared_buffer_reason
    if why:
        raise UsageError(
            f"Batched decoding needs GroupQueryAttention on every past/present pair (one shared "
            f"buffer per pair, a length per row), and {why}. Fuse the model first "
            "(ortpilot.passes.decoder_fusion, or --fuse)."
        )
    if any(c.batch_axis != 0 for c in sig.cache):
        raise UsageError(
            "Batched decoding needs the batch axis first in every past input "
            "([batch, kv_heads, past, head_dim]), so that a slot is one block of the buffer."
        )
    if sig.cache_position and sig.cache_position not in sig.unread_inputs:
        raise UsageError(
            f"The model reads '{sig.cache_position}', one cache position for the whole batch, so "
            "rows of different lengths cannot share a run; serve it one stream at a time."
        )


def kv_layout(sig: DecoderSignature) -> tuple[tuple[object, ...], ...]:
    """What must agree for two sessions to share one KV buffer: every pair's dims, axes and dtype."""
    return tuple((c.dims, c.seq_axis, c.batch_axis, str(c.dtype)) for c in sig.cache)


def _rows(array: np.ndarray, entry: CacheEntry, slot: int, start: int, stop: int) -> np.ndarray:
    """A view of ``slot``'s rows ``start .. stop`` along the pair's sequence axis (batch axis first)."""
    index: list[object] = [slice(None)] * (array.ndim - 1)
    index[entry.seq_axis - 1] = slice(start, stop)
    return array[slot][tuple(index)]


class _StepBinding:
    """The decode run for ``rows`` slots: cache bound once, fixed-shape inputs rewritten in place.

    A binding call right after a run costs 50-90 us on a 2-core machine (generate.md, the shared
    loop); a step rebinds only the attention mask, and only when a node reads it.
    """

    def __init__(self, loop: BatchedLoop, rows: int) -> None:
        self.io = loop.session.io_binding()
        self.rows = rows
        self.inputs: dict[str, np.ndarray] = {}
        vocab = loop.sig.vocab_size
        self.logits: np.ndarray | None = None
        if vocab:
            self.logits = np.empty((rows, 1, vocab), dtype=loop.logits_dtype)
            self.io.bind_output(
                loop.sig.logits, "cpu", 0, self.logits.dtype, list(self.logits.shape), self.logits.ctypes.data
            )
        else:
            self.io.bind_output(loop.sig.logits, "cpu")
        loop.bind_cache(self.io, 0, rows)  # after the logits, which stay output 0
        mask = loop.sig.attention_mask
        self.grows = mask if mask and mask not in loop.sig.unread_inputs else None
        # A mask no node reads (an onnxscript-fused graph takes lengths from position_ids) stays as first
        # bound: ORT still wants the input, but rebinding it as it grows would cost a call per step.
        self.unread = mask if mask and mask in loop.sig.unread_inputs else None

    def run(self, session: ort.InferenceSession, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        for name, value in feeds.items():
            held = self.inputs.get(name)
            if name == self.unread and held is not None:
                continue
            if name == self.grows or held is None or held.shape != value.shape:
                self.inputs[name] = value.copy()
                self.io.bind_cpu_input(name, self.inputs[name])
            else:
                held[...] = value
        session.run_with_iobinding(self.io)
        logits = self.logits if self.logits is not None else self.io.get_outputs()[0].numpy()
        return logits[:, -1, :]


class BatchedLoop:
    """Slots of one shared KV buffer per cache pair; prefill one slot, decode any set of slots.

    ``lengths[slot]`` is the number of tokens in that slot's cache (0: free). ``step`` runs rows
    ``0 .. max(slot)``: a row with no token (a free slot, or one still being prefilled) rides
    along at its own next position, so the garbage it writes lands where its next real token
    will be written over it. Admitting into the lowest free slot keeps that tail short.
    """

    name = "batched"

    def __init__(
        self,
        session: ort.InferenceSession,
        signature: DecoderSignature,
        slots: int,
        max_length: int,
        *,
        share: BatchedLoop | None = None,
    ) -> None:
        sig = signature
        check_batchable(sig)
        if slots < 1 or max_length < 2:
            raise UsageError(
                f"Batched decoding needs at least one slot and a max_length of at least 2; got "
                f"{slots} slot(s) and max_length {max_length}."
            )
        self.session = session
        self.sig = sig
        self.slots = slots
        self.max_length = max_length
        self.logits_dtype = logits_dtype(session, sig)
        self.traffic = Traffic()
        if share is not None:
            # Another weight format of the same decoder: its runs read and write the very same cache
            # rows and lengths (decode/formats.py checks that the layouts agree before it gets here).
            if kv_layout(share.sig) != kv_layout(sig) or (share.slots, share.max_length) != (slots, max_length):
                raise ValueError("a loop can share the KV buffer only of a loop with the same cache layout")
            self.lengths, self._arrays = share.lengths, share._arrays
        else:
            check_kv_memory(sig, slots, max_length)
            self.lengths = np.zeros(slots, dtype=np.int64)
            self._arrays = [np.zeros(c.shape(slots, max_length), dtype=c.dtype) for c in sig.cache]
        self._steps: dict[int, _StepBinding] = {}
        self._prefills: dict[int, ort.IOBinding] = {}

    @property
    def kv_cache_bytes(self) -> int:
        return int(sum(a.nbytes for a in self._arrays))

    def bind_cache(self, io: ort.IOBinding, first_slot: int, rows: int) -> None:
        """Bind slots ``first_slot .. first_slot + rows`` of every buffer as past and present."""
        for entry, array in zip(self.sig.cache, self._arrays):
            pointer = array.ctypes.data + first_slot * array[0].nbytes
            shape = list(entry.shape(rows, self.max_length))
            io.bind_input(entry.past, "cpu", 0, entry.dtype, shape, pointer)
            io.bind_output(entry.present, "cpu", 0, entry.dtype, shape, pointer)

    def prefill(self, slot: int, ids: Sequence[int] | np.ndarray, start: int = 0) -> np.ndarray:
        """Run ``ids`` into ``slot`` after its first ``start`` tokens; last-position logits [vocab]."""
        return self.run(slot, ids, start)[-1]

    def run(self, slot: int, ids: Sequence[int] | np.ndarray, start: int = 0) -> np.ndarray:
        """Run ``ids`` into ``slot`` after its first ``start`` tokens; logits of every position [seq, vocab].

        A prefill reads the last row; a speculative verify run reads them all (decode/speculative.py).
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        if not 0 <= slot < self.slots or start != self.lengths[slot]:
            raise ValueError(
                f"slot {slot} holds {self.lengths[slot] if 0 <= slot < self.slots else '?'} tokens, not {start}"
            )
        if start + ids.shape[1] > self.max_length:
            raise ValueError(f"{start} + {ids.shape[1]} tokens do not fit the {self.max_length}-token slot")
        io = self._prefills.get(slot)
        if io is None:
            io = self._prefills[slot] = self.session.io_binding()
            io.bind_output(self.sig.logits, "cpu")  # output 0, before the cache
            self.bind_cache(io, slot, 1)
        else:
            io.bind_output(self.sig.logits, "cpu")  # ORT keeps the last run's logits bound, shaped for that prompt
        for name, value in self._feeds(ids, np.array([start])).items():
            io.bind_cpu_input(name, value)
        self.session.run_with_iobinding(io)
        logits = io.get_outputs()[0].numpy()
        self.traffic.add(logits.nbytes)
        self.lengths[slot] = start + ids.shape[1]
        return logits[0]

    def step(self, tokens: Mapping[int, int]) -> np.ndarray:
        """One token for each slot in ``tokens``; logits [rows, vocab], row = slot.

        The array is reused by the next step: sample from it before calling ``step`` again.
        """
        if not tokens:
            raise ValueError("step needs at least one slot")
        rows = max(tokens) + 1
        ids = np.zeros((rows, 1), dtype=np.int64)
        for slot, token in tokens.items():
            if self.lengths[slot] < 1 or self.lengths[slot] >= self.max_length:
                raise ValueError(f"slot {slot} holds {self.lengths[slot]} tokens of {self.max_length}")
            ids[slot, 0] = token
        binding = self._steps.get(rows)
        if binding is None:
            binding = self._steps[rows] = _StepBinding(self, rows)
        logits = binding.run(self.session, self._feeds(ids, self.lengths[:rows]))
        self.traffic.add(logits.nbytes)
        for slot in tokens:
            self.lengths[slot] += 1
        return logits

    def release(self, slot: int) -> None:
        """The slot is free again; its stale cache is never read (GQA reads a row's own length)."""
        self.lengths[slot] = 0

    def truncate(self, slot: int, length: int) -> None:
        """Keep the first ``length`` tokens of ``slot``: rows past them are stale and never read again."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} tokens; cannot keep {length}")
        self.lengths[slot] = length

    @property
    def token_bytes(self) -> int:
        """Bytes of cache one token of one slot takes, over every past/present pair."""
        return int(sum(a[0].nbytes // self.max_length for a in self._arrays))

    def copy_rows(self, slot: int, start: int, stop: int) -> list[np.ndarray]:
        """Copies of ``slot``'s cache rows ``start .. stop`` (one array per pair, the sequence axis cut)."""
        return [np.array(_rows(array, entry, slot, start, stop)) for entry, array in zip(self.sig.cache, self._arrays)]

    def write_rows(self, slot: int, start: int, rows: Sequence[np.ndarray]) -> None:
        """Put ``rows`` (from :meth:`copy_rows`) into ``slot`` at ``start``; the caller sets the length."""
        for entry, array, block in zip(self.sig.cache, self._arrays, rows):
            stop = start + block.shape[entry.seq_axis - 1]
            _rows(array, entry, slot, start, stop)[...] = block

    def _feeds(self, ids: np.ndarray, past: np.ndarray) -> dict[str, np.ndarray]:
        """ids [rows, seq] after ``past[row]`` cached tokens: positions, a right-padded mask, GQA lengths."""
        sig = self.sig
        seq = ids.shape[1]
        total = past + seq
        longest = int(total.max())
        feeds = {sig.input_ids: cast_feed(sig, sig.input_ids, ids)}
        if sig.attention_mask:
            mask = (np.arange(longest)[None, :] < total[:, None]).astype(np.int64)
            feeds[sig.attention_mask] = cast_feed(sig, sig.attention_mask, mask)
        if sig.position_ids:
            feeds[sig.position_ids] = cast_feed(sig, sig.position_ids, past[:, None] + np.arange(seq)[None, :])
        if sig.cache_position:
            feeds[sig.cache_position] = cast_feed(sig, sig.cache_position, np.arange(int(past[0]), int(past[0]) + seq))
        if sig.seqlens_k:
            feeds[sig.seqlens_k] = cast_feed(sig, sig.seqlens_k, total - 1)
        if sig.total_sequence_length:
            info = sig.inputs.get(sig.total_sequence_length)
            value = np.array([longest] if info is not None and len(info.dims) == 1 else longest)
            feeds[sig.total_sequence_length] = cast_feed(sig, sig.total_sequence_length, value)
        for value in feeds.values():
            self.traffic.add(value.nbytes)
        return feeds
