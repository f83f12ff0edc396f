"""Speculative decoding without a draft model: prompt-lookup drafts, verified in one run.

Answers that copy from their prompt (a summary, a code edit, a quote) repeat n-grams of the text
so far. :func:`find_draft` looks the last few tokens up earlier in the prompt and the answer and
proposes the ``k`` tokens that followed them there. One batch-1 run of the pending token and the
draft (GroupQueryAttention takes ``sequence_length > 1`` after a past for batch 1) gives the
greedy token after every one of them, so the run yields the draft's longest prefix the model
agrees with plus the model's own next token; the slot's length is rolled back past the rest
(its rows are stale and never read again, decode/batched.py).

Greedy identity, measured rather than assumed. A verify run has k + 1 rows where a decode step
has one, and some kernels round a one-row run differently: MLAS's one-row SGEMM in attention
(logits 2e-6 to 4e-5 apart on the demo decoder and SmolLM2-135M in fp32), and on AVX2 the
4-bit ``MatMulNBits`` int8-compute kernel (up to 1.1 on SmolLM2 int4). So :func:`calibrate`
measures, once per session, how far a verify run's logits are from the same tokens' one-token
steps (and the steps after it, which read the rows it wrote), and :func:`accept` takes a
verified token only where its margin over the runner-up exceeds ``TIE_FACTOR`` times that
distance: where the argmax could not flip. At a near tie the stream stops accepting and takes
its next token from an ordinary one-token step. What this cannot cover: the rows a verify run
wrote stay that far from the rows one-token steps would have written, so a later step that
meets a near tie of its own may still choose differently than plain decoding would have; the
tests and the benchmark count such answers (docs/concepts/decode-engine.md).

On by default only where it pays (``auto``): each stream's emitted tokens per verify run are
compared with the measured cost of a verify run against a one-token step; a stream whose drafts
do not pay stops speculating for a while (doubling) and tries again. Only greedy streams
speculate. Where the measured distance is above ``MAX_DISTANCE`` (SmolLM2-135M int4 on an AVX2
CPU: 1.1), the rows a verify run writes change later tokens (measured: 6 of 8 answers), so
``auto`` does not speculate at all there; ``on`` still does, at that price.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from ortpilot.decode.batched import BatchedLoop
from ortpilot.decode.signature import DecoderSignature

MAX_NGRAM = 3  # the longest suffix looked up
MIN_NGRAM = 2  # a lone repeated token is too weak a clue (it drafts noise on open-ended text)
TIE_FACTOR = 4.0  # accept a verified token only if its margin is this many times the measured verify/step distance
# Above this verify/step distance a verify run rounds like another weight format, not like a one-row kernel
# (fp32: 2e-6 to 4e-5, measured; AVX2 int4: ~1), and the rows it writes move later tokens: auto stays off.
MAX_DISTANCE = 1e-2
PROBE_RUNS = 3  # verify runs before auto judges a stream's drafts
BACKOFF_TOKENS = 16  # tokens a stream decodes plainly after its drafts did not pay (doubling, up to MAX_BACKOFF)
MAX_BACKOFF = 256
_EWMA = 0.3


def find_draft(
    sequence: Sequence[int] | np.ndarray, k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM
) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the sequence's last n-gram.

    The longest n-gram (``max_ngram`` down to ``min_ngram``) that occurred before wins; [] if none.
    """
    seq = np.asarray(sequence, dtype=np.int64)
    length = len(seq)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = seq[length - n :]
        windows = np.lib.stride_tricks.sliding_window_view(seq[: length - 1], n)
        hits = np.flatnonzero((windows == tail).all(axis=1))
        hits = hits[hits + n < length]
        if hits.size:
            start = int(hits[-1]) + n
            return seq[start : start + k].tolist()
    return []


def accept(logits: np.ndarray, draft: Sequence[int], margin: float) -> list[int]:
    """The greedy tokens a verify run gives: row j follows draft token j (row 0 the pending token).

    Stops after the first token that differs from the draft (the model's own choice there), after
    the bonus token past a fully accepted draft, and before any row whose top-1 leads its runner-up
    by ``margin`` or less (a near tie a one-token step might resolve the other way).
    """
    rows = logits[: len(draft) + 1]
    top = rows.argmax(axis=-1)
    second = np.partition(rows, -2, axis=-1)[:, -2]
    lead = rows[np.arange(len(rows)), top] - second
    out: list[int] = []
    for j, token in enumerate(top.tolist()):
        if lead[j] <= margin:
            break
        out.append(int(token))
        if j == len(draft) or token != draft[j]:
            break
    return out


def calibrate(session: ort.InferenceSession, signature: DecoderSignature, k: int = 4, seed: int = 0) -> float:
    """Largest logit distance between a verify run and one-token steps over the same tokens, and after it.

    Runs on a small loop of its own (a random 8-token prompt, ``k`` + 1 verified tokens and as many
    steps after them), so no request's slot is touched.
    """
    limit = min(signature.max_positions or 64, 64)
    k = min(k, (limit - 1) // 2 - 1)
    if k < 1:
        return 0.0  # no room for a verify run of two tokens after a prompt and as many steps after it
    size = min(8, limit - 2 * (k + 1)) + 2 * (k + 1)
    loop = BatchedLoop(session, signature, 1, size)
    ids = np.random.default_rng(seed).integers(0, signature.vocab_size or 2, size=size).tolist()
    head = size - 2 * (k + 1)
    prompt, run, after = ids[:head], ids[head : head + k + 1], ids[head + k + 1 :]
    loop.prefill(0, prompt)
    steps = [np.array(loop.step({0: t})[0]) for t in run + after]
    loop.truncate(0, len(prompt))
    verify = np.array(loop.run(0, run, len(prompt)))
    later = [np.array(loop.step({0: t})[0]) for t in after]
    return float(np.abs(np.concatenate([verify, np.stack(later)]) - np.stack(steps)).max())


@dataclass
class StreamSpeculation:
    """One stream's record: its runs, drafted and accepted tokens, and whether auto has paused it."""

    runs: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    gain: float = 0.0  # EWMA of tokens emitted per verify run
    judged_runs: int = 0
    paused_until: int = 0  # the stream's token count until which it decodes plainly
    backoff: int = BACKOFF_TOKENS


@dataclass
class SpeculationCounters:
    verify_runs: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    tie_stops: int = 0
    paused: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Speculator:
    """Drafts, the cost model and the per-stream switch of ``auto`` / ``on`` (``off`` never drafts)."""

    mode: str = "auto"
    draft_tokens: int = 4
    margin: float | None = None  # TIE_FACTOR x the distance :func:`calibrate` measured; None until measured
    distance: float | None = None
    withheld: str | None = None  # why auto does not speculate on this session at all
    counters: SpeculationCounters = field(default_factory=SpeculationCounters)
    _step_s: dict[int, float] = field(default_factory=dict)  # EWMA of a plain decode step, by rows
    _verify_s: dict[int, float] = field(default_factory=dict)  # EWMA of a verify run, by tokens

    @property
    def enabled(self) -> bool:
        return self.mode != "off" and self.withheld is None

    def measured(self, distance: float) -> None:
        """Take the verify/step distance :func:`calibrate` measured: the near-tie margin, and in
        ``auto`` no speculation at all where verify runs round like another weight format."""
        self.distance = distance
        self.margin = TIE_FACTOR * distance
        if self.mode == "auto" and distance > MAX_DISTANCE:
            self.withheld = (
                f"a verify run's logits are {distance:.3g} from one-token steps (more than {MAX_DISTANCE}): "
                "the rows it writes would change later tokens"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "draft_tokens": self.draft_tokens,
            "distance": self.distance,
            "tie_margin": self.margin,
            "withheld": self.withheld,
            **self.counters.to_dict(),
        }

    def draft(
        self, state: StreamSpeculation, sequence: Sequence[int], produced: int, limit: int, rows: int
    ) -> list[int]:
        """The draft to verify now ([] for a plain step): ``limit`` caps its length (room, tokens left)."""
        if not self.enabled or limit < 1:
            return []
        if self.mode == "auto" and (produced < state.paused_until or rows not in self._step_s):
            return []  # paused, or no plain step of this size measured yet to judge a verify run by
        return find_draft(sequence, min(self.draft_tokens, limit))

    def record_step(self, rows: int, seconds: float) -> None:
        self._step_s[rows] = _ewma(self._step_s.get(rows), seconds)

    def record_verify(
        self,
        state: StreamSpeculation,
        tokens: int,
        drafted: int,
        emitted: list[int],
        draft: Sequence[int],
        seconds: float,
        produced: int,
        rows: int,
    ) -> None:
        """Count a verify run; in ``auto``, pause the stream when its runs cost more per token than steps."""
        accepted = sum(1 for _ in _prefix(emitted, draft))
        c = self.counters
        c.verify_runs += 1
        c.drafted += drafted
        c.accepted += accepted
        c.emitted += len(emitted)
        c.tie_stops += int(len(emitted) == accepted)  # stopped before a near tie, not at a differing token
        state.runs += 1
        state.drafted += drafted
        state.accepted += accepted
        state.emitted += len(emitted)
        state.gain = _ewma(state.gain if state.judged_runs else None, float(len(emitted)))
        state.judged_runs += 1
        self._verify_s[tokens] = _ewma(self._verify_s.get(tokens), seconds)
        if self.mode != "auto" or state.judged_runs < PROBE_RUNS:
            return
        step = self._step_s.get(rows)
        if step and state.gain * step < self._verify_s[tokens]:
            state.paused_until = produced + state.backoff
            state.backoff = min(2 * state.backoff, MAX_BACKOFF)
            state.judged_runs = 0
            c.paused += 1

    def cost_ratio(self, tokens: int, rows: int = 1) -> float | None:
        """Measured verify run / plain step time (what a run must emit, in tokens, to pay)."""
        if tokens in self._verify_s and rows in self._step_s:
            return self._verify_s[tokens] / self._step_s[rows]
        return None


def _prefix(emitted: Sequence[int], draft: Sequence[int]):
    for a, b in zip(emitted, draft):
        if a != b:
            return
        yield a


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EWMA) * old + _EWMA * new


@dataclass
class SingleRun:
    """One sequence decoded on a 1-slot loop, with speculation: tokens, timings, counters."""

    tokens: list[int]
    prefill_s: float
    prefill_host_bytes: int
    token_s: list[float]  # per emitted token after the first: its run's time shared by the tokens it made
    stop_reason: str
    speculation: dict[str, Any]


KEPT = ("mode", "draft_tokens", "distance", "tie_margin", "withheld")


def run_single(
    loop: BatchedLoop,
    prompt: Sequence[int],
    max_new_tokens: int,
    stop: set[int],
    speculator: Speculator,
    on_token: Callable[[int], None] | None = None,
) -> SingleRun:
    """Greedy decoding of one prompt on slot 0 of ``loop``, verifying prompt-lookup drafts where they pay
    (``speculator`` has :meth:`Speculator.measured` the session's distance)."""
    state = StreamSpeculation()
    start = time.perf_counter()
    logits = loop.prefill(0, prompt)
    prefill_s = time.perf_counter() - start
    prefill_bytes = loop.traffic.host_bytes
    out: list[int] = []
    token_s: list[float] = []
    pending = [int(logits.argmax())]
    reason = "max_new_tokens"
    while True:
        for token in pending:
            out.append(token)
            if on_token is not None:
                on_token(token)
            if token in stop:
                reason = "stop_token"
                break
            if len(out) >= max_new_tokens:
                break
            if len(prompt) + len(out) >= loop.max_length:
                reason = "max_length"
                break
        else:
            pending = []
        if pending:
            break
        held = len(prompt) + len(out) - 1  # the last token is not in the cache yet
        limit = min(max_new_tokens - len(out) - 1, loop.max_length - held - 2)
        draft = speculator.draft(state, [*prompt, *out], len(out), limit, 1)
        t0 = time.perf_counter()
        if draft:
            verified = np.asarray(loop.run(0, [out[-1], *draft], held))
            pending = accept(verified, draft, speculator.margin or 0.0)
            loop.truncate(0, held + len(pending))
            seconds = time.perf_counter() - t0
            speculator.record_verify(state, len(draft) + 1, len(draft), pending, draft, seconds, len(out), 1)
            if pending:
                token_s.extend([seconds / len(pending)] * len(pending))
                continue
            t0 = time.perf_counter()
        pending = [int(loop.step({0: out[-1]})[0].argmax())]
        seconds = time.perf_counter() - t0
        speculator.record_step(1, seconds)
        token_s.append(seconds)
    loop.release(0)
    doc = {**{k: v for k, v in speculator.to_dict().items() if k in KEPT}, **asdict(state)}
    return SingleRun(out, prefill_s, prefill_bytes, token_s, reason, doc)


__all__ = [
    "MAX_NGRAM",
    "MIN_NGRAM",
    "TIE_FACTOR",
    "SingleRun",
    "Speculator",
    "StreamSpeculation",
    "accept",
    "calibrate",
    "find_draft",
    "run_single",
]
