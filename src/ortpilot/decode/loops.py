"""The generation loops: how the KV cache travels from one step to the next.

- ``plain``: numpy in, numpy out; every step copies the whole cache out of ORT and back in.
  It is the reference the others must match token for token.
- ``bound``: IOBinding; the present OrtValues of step t are bound as the past of step t+1, so
  the cache never becomes numpy. On a CPU this changes little (the model still concatenates
  the past every step); on a GPU it removes two bus transfers of the cache per token.
- ``shared``: for GroupQueryAttention graphs; one [batch, kv_heads, max_len, head_dim] buffer per
  past/present pair is bound as both, and GQA writes the new token's keys in place.
- ``recompute``: a model without a KV cache; every step runs the whole sequence again.

Every loop counts the bytes of the numpy arrays that cross into and out of ORT (``traffic``),
separately for the KV cache, so "zero host copies of the cache" is measured, not claimed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from ortpilot.decode.signature import DecoderSignature

LOOPS = ("plain", "bound", "shared", "recompute")


@dataclass
class Traffic:
    """Bytes of numpy data handed to ORT or read back from it, all of it and the KV part."""

    host_bytes: int = 0
    kv_host_bytes: int = 0

    def add(self, nbytes: int, kv: bool = False) -> None:
        self.host_bytes += int(nbytes)
        if kv:
            self.kv_host_bytes += int(nbytes)

    def snapshot(self) -> Traffic:
        return Traffic(self.host_bytes, self.kv_host_bytes)

    def since(self, before: Traffic) -> Traffic:
        return Traffic(self.host_bytes - before.host_bytes, self.kv_host_bytes - before.kv_host_bytes)


def cast_feed(sig: DecoderSignature, name: str, value: np.ndarray) -> np.ndarray:
    """``value`` as the dtype the model declares for input ``name`` (int64 when it declares none)."""
    info = sig.inputs.get(name)
    return np.ascontiguousarray(value, dtype=info.dtype if info is not None else np.int64)


def logits_dtype(session: ort.InferenceSession, signature: DecoderSignature) -> type:
    kind = next(o.type for o in session.get_outputs() if o.name == signature.logits)
    return np.float16 if "float16" in kind else np.float32


class DecodeLoop(ABC):
    """Prefill once, then one token per ``step``; both return last-position logits [batch, vocab].

    The loop owns the attention mask and positions: ``prefill`` takes the prompt's mask (0 for
    left padding), every ``step`` appends one real token per row.
    """

    name = ""

    def __init__(self, session: ort.InferenceSession, signature: DecoderSignature, max_length: int) -> None:
        self.session = session
        self.sig = signature
        self.max_length = max_length
        self.traffic = Traffic()
        self.length = 0  # tokens (incl. padding) the model has seen
        self._mask = np.zeros((0, 0), dtype=np.int64)
        self._next_pos = np.zeros(0, dtype=np.int64)

    def prefill(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self._mask = mask.astype(np.int64)
        positions = np.clip(np.cumsum(self._mask, axis=1) - 1, 0, None)
        self._next_pos = positions[:, -1] + 1
        return self._run(ids, positions, past_length=0)

    def step(self, ids: np.ndarray) -> np.ndarray:
        batch = ids.shape[0]
        self._mask = np.concatenate([self._mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        positions = self._next_pos[:, None].copy()
        self._next_pos = self._next_pos + 1
        return self._run(ids, positions, past_length=self.length)

    @abstractmethod
    def _run(self, ids: np.ndarray, positions: np.ndarray, past_length: int) -> np.ndarray:
        """Run the model on ``ids`` after ``past_length`` cached tokens; last logits [batch, vocab]."""

    def _small_inputs(self, ids: np.ndarray, positions: np.ndarray, past_length: int) -> dict[str, np.ndarray]:
        """Everything but the cache: ids, mask, positions and the GQA length inputs."""
        sig = self.sig
        total = past_length + ids.shape[1]
        feeds: dict[str, np.ndarray] = {sig.input_ids: self._cast(sig.input_ids, ids)}
        if sig.attention_mask:
            feeds[sig.attention_mask] = self._cast(sig.attention_mask, self._mask)
        if sig.position_ids:
            feeds[sig.position_ids] = self._cast(sig.position_ids, positions)
        if sig.cache_position:
            feeds[sig.cache_position] = self._cast(sig.cache_position, np.arange(past_length, total))
        if sig.seqlens_k:
            feeds[sig.seqlens_k] = self._cast(sig.seqlens_k, self._mask.sum(axis=1) - 1)
        if sig.total_sequence_length:
            info = sig.inputs.get(sig.total_sequence_length)
            value = np.array([total] if info is not None and len(info.dims) == 1 else total)
            feeds[sig.total_sequence_length] = self._cast(sig.total_sequence_length, value)
        for value in feeds.values():
            self.traffic.add(value.nbytes)
        return feeds

    def _cast(self, name: str, value: np.ndarray) -> np.ndarray:
        return cast_feed(self.sig, name, value)

    def _empty_past(self, batch: int) -> dict[str, np.ndarray]:
        return {c.past: np.zeros(c.shape(batch, 0), dtype=c.dtype) for c in self.sig.cache}


class PlainLoop(DecodeLoop):
    """The reference: numpy feeds, numpy outputs, presents fed back as the next pasts."""

    name = "plain"

    def __init__(self, session: ort.InferenceSession, signature: DecoderSignature, max_length: int) -> None:
        super().__init__(session, signature, max_length)
        self._past: dict[str, np.ndarray] = {}
        self._outputs = [signature.logits] + [c.present for c in signature.cache]

    def _run(self, ids: np.ndarray, positions: np.ndarray, past_length: int) -> np.ndarray:
        feeds = self._small_inputs(ids, positions, past_length)
        past = self._past if past_length else self._empty_past(ids.shape[0])
        for value in past.values():
            self.traffic.add(value.nbytes, kv=True)
        feeds.update(past)
        logits, *presents = self.session.run(self._outputs, feeds)
        self.traffic.add(logits.nbytes)
        for value in presents:
            self.traffic.add(value.nbytes, kv=True)
        self._past = {c.past: p for c, p in zip(self.sig.cache, presents)}
        self.length = past_length + ids.shape[1]
        return logits[:, -1, :]


class RecomputeLoop(DecodeLoop):
    """No KV cache in the model: every step runs the whole sequence so far again."""

    name = "recompute"

    def __init__(self, session: ort.InferenceSession, signature: DecoderSignature, max_length: int) -> None:
        super().__init__(session, signature, max_length)
        self._ids = np.zeros((0, 0), dtype=np.int64)

    def _run(self, ids: np.ndarray, positions: np.ndarray, past_length: int) -> np.ndarray:
        self._ids = ids if not past_length else np.concatenate([self._ids, ids], axis=1)
        all_positions = np.clip(np.cumsum(self._mask, axis=1) - 1, 0, None)
        feeds = self._small_inputs(self._ids, all_positions, 0)
        (logits,) = self.session.run([self.sig.logits], feeds)
        self.traffic.add(logits.nbytes)
        self.length = self._ids.shape[1]
        return logits[:, -1, :]


class _BindingLoop(DecodeLoop):
    """Shared IOBinding plumbing: small inputs from numpy, logits into a preallocated array."""

    def __init__(self, session: ort.InferenceSession, signature: DecoderSignature, max_length: int) -> None:
        super().__init__(session, signature, max_length)
        self.io = session.io_binding()
        self._logits_buf: np.ndarray | None = None
        self._logits_dtype = logits_dtype(session, signature)

    def _bind_small(self, ids: np.ndarray, positions: np.ndarray, past_length: int) -> None:
        for name, value in self._small_inputs(ids, positions, past_length).items():
            self.io.bind_cpu_input(name, value)

    def _bind_logits(self, batch: int, seq: int) -> None:
        """Decode steps write logits straight into one reused array; prefill lets ORT allocate."""
        vocab = self.sig.vocab_size
        if seq != 1 or not vocab:
            self.io.bind_output(self.sig.logits, "cpu")
            return
        if self._logits_buf is None or self._logits_buf.shape[0] != batch:
            self._logits_buf = np.empty((batch, 1, vocab), dtype=self._logits_dtype)
        buf = self._logits_buf
        self.io.bind_output(self.sig.logits, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)

    def _read_logits(self, seq: int) -> np.ndarray:
        if seq == 1 and self._logits_buf is not None and self.sig.vocab_size:
            logits = self._logits_buf
        else:
            logits = self.io.get_outputs()[0].numpy()
        self.traffic.add(logits.nbytes)
        return logits[:, -1, :]


class BoundLoop(_BindingLoop):
    """Present of step t becomes the past of step t+1 without leaving ORT.

    Two preallocated max-length buffers per cache pair take turns: step t reads its past from
    one and ORT writes the present (past + new, contiguous) into the other. Nothing is
    allocated per step, so the cache stays in the same, warm memory.
    """

    name = "bound"

    def __init__(self, session: ort.InferenceSession, signature: DecoderSignature, max_length: int) -> None:
        super().__init__(session, signature, max_length)
        self._buffers: list[tuple[np.ndarray, np.ndarray]] = []
        self._turn = 0

    def _run(self, ids: np.ndarray, positions: np.ndarray, past_length: int) -> np.ndarray:
        io, batch, seq = self.io, ids.shape[0], ids.shape[1]
        if not past_length or not self._buffers:
            self._buffers = [
                tuple(np.empty(int(np.prod(c.shape(batch, self.max_length))), dtype=c.dtype) for _ in range(2))
                for c in self.sig.cache
            ]  # type: ignore[misc]
            self._turn = 0
        io.clear_binding_inputs()
        io.clear_binding_outputs()
        self._bind_small(ids, positions, past_length)
        self._bind_logits(batch, seq)
        for entry, pair in zip(self.sig.cache, self._buffers):
            past, present = pair[self._turn], pair[1 - self._turn]
            io.bind_input(entry.past, "cpu", 0, entry.dtype, list(entry.shape(batch, past_length)), past.ctypes.data)
            io.bind_output(
                entry.present, "cpu", 0, entry.dtype, list(entry.shape(batch, past_length + seq)), present.ctypes.data
            )
        self.session.run_with_iobinding(io)
        self._turn = 1 - self._turn
        self.length = past_length + seq
        return self._read_logits(seq)


class SharedBufferLoop(_BindingLoop):
    """One max-length buffer per past/present pair, bound as both; GQA appends in place.

    The buffers are allocated once (zeros) and never cross again; per step only ids, mask,
    positions and logits move.
    """

    name = "shared"

    def __init__(self, session: ort.InferenceSession, signature: DecoderSignature, max_length: int) -> None:
        super().__init__(session, signature, max_length)
        self._arrays: list[np.ndarray] = []
        self._values: list[ort.OrtValue] = []
        self._step_inputs: dict[str, np.ndarray] = {}  # bound once per sequence, rewritten in place

    def _allocate(self, batch: int) -> None:
        self._arrays = [np.zeros(c.shape(batch, self.max_length), dtype=c.dtype) for c in self.sig.cache]
        self._values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._arrays]

    def _run(self, ids: np.ndarray, positions: np.ndarray, past_length: int) -> np.ndarray:
        io, batch, seq = self.io, ids.shape[0], ids.shape[1]
        if not past_length or not self._values:
            self._allocate(batch)
            # The cache is bound once per sequence; a step rebinds only the small inputs and the
            # logits (binding a name again replaces it), which saves ~60 bind calls per token.
            io.clear_binding_inputs()
            io.clear_binding_outputs()
            io.bind_output(self.sig.logits, "cpu")  # logits stay output 0 (``_read_logits``)
            for entry, value in zip(self.sig.cache, self._values):
                io.bind_ortvalue_input(entry.past, value)
                io.bind_ortvalue_output(entry.present, value)
            self._step_inputs = {}
        if seq == 1 and past_length:
            self._bind_step(ids, positions, past_length)
        else:
            self._step_inputs = {}  # a prefill binds its own arrays; the next decode step rebinds
            self._bind_small(ids, positions, past_length)
            self._bind_logits(batch, seq)
        self.session.run_with_iobinding(io)
        self.length = past_length + seq
        return self._read_logits(seq)

    def _bind_step(self, ids: np.ndarray, positions: np.ndarray, past_length: int) -> None:
        """Decode step: inputs of fixed shape (ids, positions, GQA lengths) and the logits buffer are
        bound on the first step and then rewritten in place; only the growing mask is bound anew,
        and not even that when no node reads it (an onnxscript-fused graph takes lengths from the
        positions; ORT still wants the input, so the first step's mask stays bound).

        A binding call right after a run cost 50-90 us on the 2-core box, against 5 us otherwise;
        rebinding everything every step spent ~0.24 ms per token before the run started.
        """
        feeds = self._small_inputs(ids, positions, past_length)
        mask = self.sig.attention_mask
        grows = mask if mask and mask not in self.sig.unread_inputs else None
        if not self._step_inputs:
            for name, value in feeds.items():
                if name != grows:
                    self._step_inputs[name] = value.copy()
                    self.io.bind_cpu_input(name, self._step_inputs[name])
            self._bind_logits(ids.shape[0], 1)
        else:
            for name, buffer in self._step_inputs.items():
                if name not in self.sig.unread_inputs:
                    buffer[...] = feeds[name]
        if grows:
            self.io.bind_cpu_input(grows, feeds[grows])


def make_loop(name: str, session: ort.InferenceSession, signature: DecoderSignature, max_length: int) -> DecodeLoop:
    classes: dict[str, type[DecodeLoop]] = {
        "plain": PlainLoop,
        "bound": BoundLoop,
        "shared": SharedBufferLoop,
        "recompute": RecomputeLoop,
    }
    return classes[name](session, signature, max_length)
