"""Continuous batching: requests join the running batch between steps and leave it when done.

``Scheduler`` owns one :class:`BatchedLoop`. Requests wait in a FIFO queue (at most
``max_queue`` beyond the free slots; past that ``submit`` raises :class:`QueueFullError`, HTTP
429), are admitted into the lowest free slot, prefilled (whole, or ``prefill_chunk`` tokens per
iteration), and then decode together with every other admitted request, one token per step. A
request that meets a stop id, its ``max_new_tokens``, the slot's length or a ``cancel`` (a
client gone) frees its slot before the next step; one still queued at its ``deadline`` is never
admitted. Each request samples with its own settings and its own seeded generator.

What the engine adds on top (``EngineOptions``, docs/concepts/decode-engine.md): each step on the
weight format measured fastest for its row count (decode/formats.py), prompts that start with a
cached prefix load its KV rows instead of prefilling them (decode/prefix_cache.py), and a stream
decoding alone verifies prompt-lookup drafts in one run (decode/speculative.py). ``counters()``
returns cumulative plain data for a server's ``/metrics`` (decode/stats.py).

The scheduler is driven by one thread: ``step()`` by hand (tests, benchmarks that need exact
interleavings) or ``start()``'s engine thread (a server). ``submit`` and ``Stream.cancel`` are
safe from any thread; a stream hands its tokens to an iterator, or to ``on_token`` on the
engine thread (an asyncio server bridges them with ``call_soon_threadsafe``).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx

from ortpilot.decode.batched import chunk_length
from ortpilot.decode.formats import FormatPlan, FormatSet
from ortpilot.decode.generate import Generator
from ortpilot.decode.options import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_STREAMS,
    DEFAULT_PREFILL_CHUNK,
    EngineOptions,
)
from ortpilot.decode.prefix_cache import PrefixCache, PrefixMatch
from ortpilot.decode.sampling import Sampler, SamplingConfig
from ortpilot.decode.signature import DecoderSignature
from ortpilot.decode.speculative import Speculator, StreamSpeculation, accept, calibrate
from ortpilot.decode.stats import EngineStats
from ortpilot.errors import OrtpilotError, QueueFullError, UsageError
from ortpilot.session import SessionSettings, VerifiedSession

log = logging.getLogger("ortpilot")
DEFAULT_MAX_LENGTH = 1024  # tokens per stream when neither the caller nor the model says less
TokenCallback = Callable[["Stream", "int | None"], None]
_END = object()


def resolve_max_length(sig: DecoderSignature, max_length: int | None) -> int:
    """Tokens per stream: as asked (at most the model's positions), else the model's limit up to 1024."""
    limit = sig.max_positions
    if max_length is None:
        return min(limit or DEFAULT_MAX_LENGTH, DEFAULT_MAX_LENGTH)
    if limit is not None and max_length > limit:
        raise UsageError(
            f"max_length {max_length} is above the model's {limit} positions (its max_positions "
            "metadata or rotary tables); give at most that."
        )
    return max_length


@dataclass
class StreamMetrics:
    """What one request cost: tokens, time to first token, ms per token after it."""

    prompt_tokens: int
    completion_tokens: int
    queue_s: float  # submitted -> its prefill started
    ttft_s: float  # submitted -> first token
    decode_s: float  # first token -> last token
    ms_per_token: float  # decode_s per token after the first (0 for a single token)
    total_s: float
    stop_reason: str  # stop_token, max_new_tokens, max_length, cancelled, deadline, error

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Stream:
    """One request: its settings, the tokens as they come, its metrics when it is done."""

    def __init__(
        self,
        scheduler: Scheduler,
        ident: int,
        prompt: list[int],
        max_new_tokens: int,
        sampling: SamplingConfig,
        stop_tokens: frozenset[int],
        on_token: TokenCallback | None,
        deadline: float | None = None,
    ) -> None:
        self.id = ident
        self.deadline = deadline  # a time.monotonic() instant: still queued then, it is not run
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.stop_tokens = stop_tokens
        self.tokens: list[int] = []
        self.stop_reason: str | None = None
        self.error: BaseException | None = None
        self.slot: int | None = None
        self.prefilled = 0
        self.submitted_at = time.perf_counter()
        self.admitted_at: float | None = None
        self.token_times: list[float] = []
        self.finished_at: float | None = None
        self._scheduler = scheduler
        self._sampler = Sampler(sampling)
        self._on_token = on_token
        self._events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done = threading.Event()
        self._cancelled = False
        self.cancelled_at_token: int | None = None  # tokens it had when cancel() was called
        self.match: PrefixMatch | None = None  # the cached prefix it loads (pinned until its prefill is done)
        self.speculation = StreamSpeculation()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancel_requested(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Stop this request; its slot is free before the next step (safe from any thread)."""
        if not self._cancelled:
            self.cancelled_at_token = len(self.tokens)
        self._cancelled = True
        self._scheduler.wake()

    @property
    def tokens_after_cancel(self) -> int | None:
        """Tokens made after ``cancel``: at most the one of the step already running when it came."""
        return None if self.cancelled_at_token is None else len(self.tokens) - self.cancelled_at_token

    def __iter__(self) -> Iterator[int]:
        """The new token ids as the engine makes them (blocks; raises the engine's error, if any)."""
        while True:
            item = self._events.get()
            if item is _END:
                if self.error is not None:
                    raise self.error
                return
            yield item

    def wait(self, timeout: float | None = None) -> StreamMetrics:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} is still running after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.metrics()

    def metrics(self) -> StreamMetrics:
        end = self.finished_at or time.perf_counter()
        times = self.token_times
        first = times[0] if times else end
        decode = times[-1] - first if len(times) > 1 else 0.0
        return StreamMetrics(
            prompt_tokens=len(self.prompt),
            completion_tokens=len(self.tokens),
            queue_s=(self.admitted_at or end) - self.submitted_at,
            ttft_s=first - self.submitted_at if times else 0.0,
            decode_s=decode,
            ms_per_token=decode * 1e3 / (len(times) - 1) if len(times) > 1 else 0.0,
            total_s=end - self.submitted_at,
            stop_reason=self.stop_reason or "running",
        )

    # The engine thread's side.
    def _sample(self, logits: np.ndarray) -> int:
        return int(self._sampler(logits[None, :])[0])

    def _emit(self, token: int, now: float) -> None:
        self.tokens.append(token)
        self.token_times.append(now)
        self._events.put(token)
        if self._on_token is not None:
            self._on_token(self, token)

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        self.stop_reason = reason
        self.error = error
        self.finished_at = time.perf_counter()
        self._events.put(_END)
        self._done.set()
        if self._on_token is not None:
            self._on_token(self, None)


class Scheduler:
    """FIFO admission into the slots of one batched loop; one decode step for all of them at a time."""

    def __init__(
        self,
        model: str | os.PathLike | onnx.ModelProto | VerifiedSession | Generator,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
        max_queue: int = DEFAULT_MAX_QUEUE,
        max_length: int | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        providers: Any = None,
        policy: str = "warn",
        settings: SessionSettings | None = None,
        mapping: Mapping[str, str] | None = None,
        options: EngineOptions | None = None,
        format_plan: FormatPlan | None = None,
        gate_prompts: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """``options``: weight formats, prefix cache and speculation (:class:`EngineOptions`);
        ``format_plan``: a plan measured before (``FormatPlan.from_dict``) instead of measuring at
        load; ``gate_prompts``: token ids the formats' generation gate runs on (default: random)."""
        if max_streams < 1:
            raise UsageError(f"max_streams must be at least 1, got {max_streams}.")
        if max_queue < 0:
            raise UsageError(f"max_queue must be 0 or more, got {max_queue}.")
        if prefill_chunk < 0:
            raise UsageError(f"prefill_chunk must be 0 (whole prompts) or more, got {prefill_chunk}.")
        self.generator = (
            model
            if isinstance(model, Generator)
            else Generator(model, providers=providers, policy=policy, settings=settings, mapping=mapping)
        )
        sig = self.generator.signature
        max_length = resolve_max_length(sig, max_length)
        self.options = options = options or EngineOptions()
        options.check_context(max_length)
        self.formats = FormatSet(
            self.generator,
            options.formats,
            max_streams,
            max_length,
            min_top1=options.format_min_top1,
            rounds=options.measure_rounds,
            plan=format_plan,
            gate_prompts=gate_prompts,
        )
        self.loop = self.formats.primary  # every format's loop shares its buffer and lengths
        self.cache = (
            PrefixCache(options.prefix_cache_bytes, options.prefix_block, self.loop.token_bytes)
            if options.prefix_cache_bytes
            else None
        )
        self.speculator = Speculator(options.speculation, options.draft_tokens)
        if self.speculator.enabled:  # how far a verify run rounds from one-token steps, per format (the worst)
            distance = max(calibrate(lp.session, lp.sig, options.draft_tokens) for lp in self.formats.loops.values())
            self.speculator.measured(distance)
        self.engine = EngineStats()
        self.max_streams = max_streams
        self.max_queue = max_queue
        self.max_length = max_length
        self.prefill_chunk = prefill_chunk
        self.steps = 0
        self.rows_decoded = 0
        self._waiting: deque[Stream] = deque()
        self._prefilling: list[Stream] = []
        self._active: dict[int, Stream] = {}
        self._cond = threading.Condition()
        self._ids = 0
        self._recent_s: deque[float] = deque(maxlen=32)
        self._thread: threading.Thread | None = None
        self._closed = False

    # Requests.
    def submit(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        *,
        sampling: SamplingConfig | None = None,
        stop_tokens: Sequence[int] = (),
        on_token: TokenCallback | None = None,
        deadline: float | None = None,
    ) -> Stream:
        """Queue a request; raises UsageError for one that cannot fit, QueueFullError when full. A request
        still queued at ``deadline`` (a ``time.monotonic()`` instant) is never admitted: it ends, with no
        tokens, as ``deadline``."""
        ids, _ = self.generator._prompt(prompt_ids, None)
        if ids.shape[0] != 1:
            raise UsageError(f"A request is one prompt; got a batch of {ids.shape[0]}.")
        prompt = ids[0].tolist()
        self.check_lengths(len(prompt), max_new_tokens)
        with self._cond:
            if self._closed:
                raise UsageError("The scheduler is closed.")
            free = self.max_streams - len(self._active) - len(self._prefilling)
            if len(self._waiting) >= self.max_queue + max(free, 0):
                self.engine.rejected += 1
                raise QueueFullError(
                    f"All {self.max_streams} streams are busy and {len(self._waiting)} request(s) are queued "
                    f"(the limit is {self.max_queue}); retry later.",
                    retry_after_s=self.retry_after_s(),
                )
            self._ids += 1
            stream = Stream(
                self,
                self._ids,
                prompt,
                max_new_tokens,
                sampling or SamplingConfig(),
                frozenset(int(t) for t in stop_tokens),
                on_token,
                deadline,
            )
            self._waiting.append(stream)
            self.engine.requests += 1
            self.engine.prompt_tokens += len(prompt)
            self._cond.notify_all()
        return stream

    def check_lengths(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Refuse a prompt the slot cannot hold, and more new tokens than fit after it."""
        limit = self.generator.signature.max_positions
        if prompt_tokens >= self.max_length:
            model = f" (the model handles {limit} positions)" if limit is not None else ""
            raise UsageError(
                f"The prompt has {prompt_tokens} tokens, but a stream holds {self.max_length} "
                f"(max_length){model}; shorten the prompt or raise max_length."
            )
        room = self.max_length - prompt_tokens
        if not 1 <= max_new_tokens <= room:
            raise UsageError(
                f"max_new_tokens must be between 1 and {room} (a stream holds {self.max_length} "
                f"tokens and the prompt has {prompt_tokens}); got {max_new_tokens}."
            )

    def retry_after_s(self) -> int:
        """Seconds until a queued request is likely to get a slot: the queue in rounds of recent requests."""
        mean = sum(self._recent_s) / len(self._recent_s) if self._recent_s else 1.0
        rounds = (len(self._waiting) + 1) / self.max_streams
        return int(min(60, max(1, math.ceil(mean * rounds))))

    @property
    def pending(self) -> int:
        """Requests not finished: queued, prefilling or decoding."""
        with self._cond:
            return len(self._waiting) + len(self._prefilling) + len(self._active)

    # The engine.
    def step(self) -> bool:
        """Drop cancelled requests and queued ones past their deadline, admit and prefill, then one decode
        step; True while work remains."""
        with self._cond:
            self._drop_cancelled()
            self._drop_expired()
            self._admit()
            prefilling = list(self._prefilling)
        self._prefill(prefilling)
        with self._cond:
            self._drop_cancelled()
            active = dict(self._active)
        if active:
            self._decode(active)
        with self._cond:
            return bool(self._waiting or self._prefilling or self._active)

    def run_until_idle(self) -> None:
        while self.step():
            pass

    def _admit(self) -> None:
        busy = set(self._active) | {s.slot for s in self._prefilling}
        free = [slot for slot in range(self.max_streams) if slot not in busy]
        while self._waiting and free:
            stream = self._waiting.popleft()
            stream.slot = free.pop(0)
            stream.admitted_at = time.perf_counter()
            if self.cache is not None:
                stream.match = self.cache.lookup(stream.prompt)
            self._prefilling.append(stream)

    def _prefill(self, streams: list[Stream]) -> None:
        budget = self.prefill_chunk or math.inf
        for stream in streams:
            if budget <= 0:
                break
            budget -= self._isolated(stream, self._prefill_one, stream, budget)

    def _prefill_one(self, stream: Stream, budget: float) -> int:
        """One prefill chunk of ``stream`` (the last one samples its first token); returns the tokens taken."""
        if stream.prefilled == 0 and stream.match is not None and stream.match.tokens:
            self.cache.load(self.loop, stream.slot, stream.match)  # type: ignore[union-attr, arg-type]
            stream.prefilled = stream.match.tokens
        remaining = len(stream.prompt) - stream.prefilled
        take = chunk_length(remaining, 0 if math.isinf(budget) else int(budget))
        start = stream.prefilled
        loop = self.formats.for_prefill(take)
        logits = loop.prefill(stream.slot, stream.prompt[start : start + take], start)  # type: ignore[arg-type]
        stream.prefilled += take
        self.engine.prefill_tokens += take
        if stream.prefilled < len(stream.prompt):
            return take
        if self.cache is not None:
            self.cache.store(self.loop, stream.slot, stream.prompt)  # type: ignore[arg-type]
            with self._cond:
                self._unpin(stream)
        token = stream._sample(logits)
        with self._cond:
            self._prefilling.remove(stream)
            self._active[stream.slot] = stream  # type: ignore[index]
        self._deliver(stream, token)
        return take

    def _isolated(self, stream: Stream, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` for one stream: if it raises (its sampling, its stop handling, its token callback,
        its own prefill), that stream ends with the error and the others go on. Returns 0 then."""
        try:
            return work(*args)
        except Exception as exc:
            log.debug("request %s failed and ends alone: %s", stream.id, exc)  # its caller reports stream.error
            error = exc if isinstance(exc, OrtpilotError) else RuntimeError(f"the request failed: {exc}")
            with self._cond:
                if not stream.done:
                    self._retire(stream, "error", error)
            return 0

    def _decode(self, active: dict[int, Stream]) -> None:
        if len(active) == 1:
            slot, stream = next(iter(active.items()))
            if self._isolated(stream, self._speculate, slot, stream):
                return
            if stream.done:
                return
        rows = max(active) + 1
        start = time.perf_counter()
        logits = self.formats.for_step(rows).step({slot: s.tokens[-1] for slot, s in active.items()})
        if len(active) == 1:
            self.speculator.record_step(rows, time.perf_counter() - start)
        self.steps += 1
        self.rows_decoded += len(active)
        self.engine.step(rows)
        for slot, stream in active.items():
            self._isolated(stream, self._sample_and_deliver, stream, logits[slot])

    def _sample_and_deliver(self, stream: Stream, logits: np.ndarray) -> None:
        self._deliver(stream, stream._sample(logits))

    def _speculate(self, slot: int, stream: Stream) -> bool:
        """A stream decoding alone: verify its prompt-lookup draft in one run; False if it takes a plain step."""
        if not self.speculator.enabled or not stream.sampling.greedy:
            return False
        held = len(stream.prompt) + len(stream.tokens) - 1  # its last token is not in the cache yet
        limit = min(stream.max_new_tokens - len(stream.tokens) - 1, self.max_length - held - 2)
        sequence = [*stream.prompt, *stream.tokens]
        draft = self.speculator.draft(stream.speculation, sequence, len(stream.tokens), limit, slot + 1)
        if not draft:
            return False
        start = time.perf_counter()
        logits = self.formats.for_verify(len(draft) + 1).run(slot, [stream.tokens[-1], *draft], held)
        emitted = accept(logits, draft, self.speculator.margin or 0.0)
        self.loop.truncate(slot, held + len(emitted))  # the rows after the accepted ones are stale
        seconds = time.perf_counter() - start
        self.speculator.record_verify(
            stream.speculation, len(draft) + 1, len(draft), emitted, draft, seconds, len(stream.tokens), slot + 1
        )
        for token in emitted:
            if stream.done or stream.cancel_requested:
                break
            self._deliver(stream, token)
        return bool(emitted)

    def _deliver(self, stream: Stream, token: int) -> None:
        """Hand a token over, then free the slot if the request is done (the rules of generate)."""
        now = time.perf_counter()
        first = not stream.tokens
        self.engine.token(first, now - (stream.submitted_at if first else stream.token_times[-1]))
        stream._emit(token, now)
        reason = None
        if token in stream.stop_tokens:
            reason = "stop_token"
        elif len(stream.tokens) >= stream.max_new_tokens:
            reason = "max_new_tokens"
        elif len(stream.prompt) + len(stream.tokens) >= self.max_length:
            reason = "max_length"
        if reason:
            with self._cond:
                self._retire(stream, reason)

    def _retire(self, stream: Stream, reason: str, error: BaseException | None = None) -> None:
        if stream.slot is not None and self._active.get(stream.slot) is stream:
            del self._active[stream.slot]
            self.loop.release(stream.slot)
        elif stream in self._prefilling:
            self._prefilling.remove(stream)
            self.loop.release(stream.slot)  # type: ignore[arg-type]
        elif stream in self._waiting:
            self._waiting.remove(stream)
        self._unpin(stream)
        self.engine.finished[reason] += 1
        if reason != "cancelled":
            self._recent_s.append(time.perf_counter() - stream.submitted_at)
        stream._finish(reason, error)

    def _unpin(self, stream: Stream) -> None:
        if stream.match is not None and self.cache is not None:
            self.cache.release(stream.match)
        stream.match = None

    def _drop_cancelled(self) -> None:
        for stream in [*self._waiting, *self._prefilling, *self._active.values()]:
            if stream.cancel_requested:
                self._retire(stream, "cancelled")

    def _drop_expired(self) -> None:
        """Queued requests whose deadline passed end before admission: they are never run."""
        now = time.monotonic()
        for stream in [s for s in self._waiting if s.deadline is not None and now >= s.deadline]:
            self._retire(stream, "deadline")

    # The engine thread.
    def start(self) -> Scheduler:
        """Run the engine on a background thread until ``close``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="ortpilot-scheduler", daemon=True)
            self._thread.start()
        return self

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the engine; requests still queued or running end as cancelled."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cond:
            for stream in [*self._waiting, *self._prefilling, *self._active.values()]:
                self._retire(stream, "cancelled")

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (self._waiting or self._prefilling or self._active):
                    self._cond.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as exc:  # an ORT failure ends the requests in flight, not the server
                log.error("decode step failed: %s", exc)
                error = exc if isinstance(exc, OrtpilotError) else RuntimeError(f"decode step failed: {exc}")
                with self._cond:
                    for stream in [*self._prefilling, *self._active.values()]:
                        self._retire(stream, "error", error)

    def counters(self) -> dict[str, Any]:
        """Cumulative plain data for a server's ``/metrics``: requests, tokens, latency histograms,
        gauges, rows per step, steps per weight format, the prefix cache and speculation
        (docs/concepts/decode-engine.md lists every field)."""
        with self._cond:
            gauges = {
                "queue_depth": len(self._waiting),
                "prefilling": len(self._prefilling),
                "active": len(self._active),
            }
        return {
            **self.engine.to_dict(),
            **gauges,
            "decode_steps": self.steps,
            "rows_decoded": self.rows_decoded,
            "formats": {"plan": self.formats.plan.to_dict(), "per_format": self.formats.counters()},
            "prefix_cache": self.cache.stats() if self.cache is not None else None,
            "speculation": self.speculator.to_dict(),
        }

    def stats(self) -> dict[str, Any]:
        """Engine counters: decode steps, rows they decoded, the KV buffer."""
        return {
            "max_streams": self.max_streams,
            "max_queue": self.max_queue,
            "max_length": self.max_length,
            "prefill_chunk": self.prefill_chunk,
            "decode_steps": self.steps,
            "rows_decoded": self.rows_decoded,
            "mean_rows_per_step": self.rows_decoded / self.steps if self.steps else 0.0,
            "kv_cache_bytes": self.loop.kv_cache_bytes,
            "pending": self.pending,
            "formats": self.formats.names,
            "prefix_cache_bytes": self.cache.bytes_held if self.cache is not None else 0,
            "speculation": self.speculator.mode,
        }
