"""``generate``: prompt in, tokens out, through the fastest loop the model supports, measured.

The loop is chosen from the model's signature (shared buffer if GroupQueryAttention reads
every cache pair, else IOBinding, else full recompute for a model without a cache) unless the
caller forces one. The result carries what a performance engineer asks first: prefill and
decode tokens/s, per-token p50/p99, bytes crossing between numpy and ORT per token (the KV part
separately), and the process's peak memory.

A greedy batch-1 request on the shared-buffer loop also verifies prompt-lookup drafts where they
pay (``speculation="auto"``, decode/speculative.py): it runs on a one-slot batched loop, the
same buffer layout and arithmetic as the shared loop, so with speculation off or idle its tokens
are the shared loop's.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from ortpilot.artifacts.fields import record_or_fields
from ortpilot.decode.batched import BatchedLoop, check_batchable
from ortpilot.decode.loops import DecodeLoop, make_loop
from ortpilot.decode.options import DEFAULT_LOOP, EngineOptions, GenerateOptions, check_loop
from ortpilot.decode.sampling import Sampler
from ortpilot.decode.signature import DecoderSignature, detect_signature
from ortpilot.decode.speculative import Speculator, calibrate, run_single
from ortpilot.eps import CPU_EP
from ortpilot.errors import UsageError
from ortpilot.session import SessionSettings, VerifiedSession, load

log = logging.getLogger("ortpilot")
StreamCallback = Callable[[np.ndarray], None]


@dataclass
class GenerationResult:
    """New tokens per row plus the measurements of the run that made them."""

    tokens: list[list[int]]
    prompt_length: int
    loop: str
    loop_reason: str
    stop_reason: str
    prefill_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    step_ms: list[float]
    p50_ms: float
    p99_ms: float
    host_bytes_per_token: float
    kv_host_bytes_per_token: float
    prefill_host_bytes: int
    kv_cache_bytes: int
    peak_rss_bytes: int
    sampling: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    speculation: dict[str, Any] = field(default_factory=dict)  # prompt lookup: runs, drafted, accepted (empty: none)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Generator:
    """A decoder session plus its signature, reused across ``generate`` calls (benchmarks)."""

    def __init__(
        self,
        model: str | os.PathLike | onnx.ModelProto | VerifiedSession,
        *,
        providers: Any = None,
        policy: str = "warn",
        settings: SessionSettings | None = None,
        mapping: Mapping[str, str] | None = None,
    ) -> None:
        self.vsession = (
            model
            if isinstance(model, VerifiedSession)
            else load(model, providers, policy, settings=settings or SessionSettings(), placement=False)
        )
        self.signature: DecoderSignature = detect_signature(self.vsession.model, mapping)
        self._verify_distance: float | None = None  # speculation's verify/step distance, measured once per session

    def choose_loop(self, loop: str = DEFAULT_LOOP, *, padded: bool = False) -> tuple[str, str]:
        """(loop name, why) for a request; refuses what the model cannot do."""
        sig = self.signature
        check_loop(loop)
        if padded and sig.gqa_nodes and not sig.gqa_reads_mask:
            raise UsageError(
                "The prompt batch is left-padded, but this model's GroupQueryAttention takes sequence "
                "lengths from position_ids and ignores attention_mask, so padded rows would attend to "
                "padding. Run the rows one at a time (batch 1), or use the unfused model."
            )
        if not sig.has_cache:
            return "recompute", (
                "the model has no KV cache (no past/present pair), so every step recomputes the full sequence"
            )
        if loop == "shared" and not sig.supports_shared_buffer:
            raise UsageError(
                f"The shared-buffer loop needs GroupQueryAttention on every past/present "
                f"pair, and {sig.no_shared_buffer_reason}. Fuse it first (ortpilot.passes.decoder_fusion, or "
                "`ortpilot generate --fuse`), or use --loop bound."
            )
        if loop == "auto":
            if sig.supports_shared_buffer:
                return "shared", "GroupQueryAttention reads every cache pair: one buffer per pair"
            if self.vsession.providers[0] == CPU_EP:
                # Measured: on a CPU session IOBinding saves no copy worth its per-step binding calls
                # (1.00x on SmolLM2, 0.6x on the tiny demo decoder); on a GPU EP it removes the
                # host round trip of the cache (1.27x on WebGPU, BENCHMARKS.md, GPU check).
                return "plain", (
                    "no GroupQueryAttention and a CPU session: IOBinding would add binding calls "
                    "without saving a device copy (--fuse enables the faster shared-buffer loop)"
                )
            return "bound", (
                "no GroupQueryAttention: IOBinding keeps the cache on the device (fusing the model "
                "into GroupQueryAttention, --fuse, enables the faster shared-buffer loop)"
            )
        return loop, "requested"

    def generate(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        max_new_tokens: int | None = None,
        loop: str | None = None,
        *,
        options: GenerateOptions | None = None,
        stream: StreamCallback | None = None,
        attention_mask: np.ndarray | None = None,
        **keywords: Any,
    ) -> GenerationResult:
        """Generate after ``prompt_ids`` as ``options`` say (``decode.options.GenerateOptions``), or its fields
        as arguments: ``max_new_tokens`` and ``loop`` (positional too), ``sampling``, ``stop_tokens``,
        ``max_length``, ``speculation`` (prompt-lookup drafts of ``draft_tokens`` for a greedy batch-1
        request on the shared-buffer loop: ``auto``, where they pay, ``on`` or ``off``). ``stream`` gets the
        new token ids ([batch]) as each step produces them."""
        given = {k: v for k, v in (("max_new_tokens", max_new_tokens), ("loop", loop)) if v is not None}
        options, _ = record_or_fields(GenerateOptions, options, {**given, **keywords})
        EngineOptions(speculation=options.speculation, draft_tokens=options.draft_tokens).check_context(
            self.signature.max_positions or 2**31, "the model's positions"
        )
        ids, mask = self._prompt(prompt_ids, attention_mask)
        self._check_stops(options.stop_tokens)
        max_length = self._max_length(ids.shape[1], options.max_new_tokens, options.max_length)
        name, reason = self.choose_loop(options.loop, padded=bool((mask == 0).any()))
        notes = (
            []
            if name != "recompute"
            else [f"The model has no KV cache: the loop recomputes the full sequence every step ({reason})."]
        )
        for note in notes:
            log.warning(note)
        sampler = Sampler(options.sampling)
        if (
            name == "shared"
            and ids.shape[0] == 1
            and options.speculation != "off"
            and sampler.config.greedy
            and self._batchable()
        ):
            return self._speculative(ids[0].tolist(), options, max_length, sampler, stream, reason, notes)
        runner = make_loop(name, self.vsession.session, self.signature, max_length)
        stop = set(options.stop_tokens)
        return _run(runner, ids, mask, options.max_new_tokens, max_length, sampler, stop, stream, reason, notes)

    def _batchable(self) -> bool:
        try:
            check_batchable(self.signature)
        except UsageError:
            return False
        return True

    def _speculative(
        self,
        prompt: list[int],
        options: GenerateOptions,
        max_length: int,
        sampler: Sampler,
        stream: StreamCallback | None,
        reason: str,
        notes: list[str],
    ) -> GenerationResult:
        """Greedy batch-1 decoding on a one-slot batched loop, verifying prompt-lookup drafts."""
        mode, draft_tokens = options.speculation, options.draft_tokens
        session = self.vsession.session
        loop = BatchedLoop(session, self.signature, 1, max_length)
        if self._verify_distance is None:
            self._verify_distance = calibrate(session, self.signature, draft_tokens)
        speculator = Speculator(mode, draft_tokens)
        speculator.measured(self._verify_distance)
        on_token = None if stream is None else (lambda t: stream(np.array([t], dtype=np.int64)))
        run = run_single(loop, prompt, options.max_new_tokens, set(options.stop_tokens), speculator, on_token)
        ms = [t * 1e3 for t in run.token_s]
        decode_bytes = loop.traffic.host_bytes - run.prefill_host_bytes
        return GenerationResult(
            tokens=[run.tokens],
            prompt_length=len(prompt),
            loop="shared",
            loop_reason=f"{reason}; prompt-lookup speculation {mode} (up to {draft_tokens} drafted tokens per run"
            + (f"; withheld: {speculator.withheld})" if speculator.withheld else ")"),
            stop_reason=run.stop_reason,
            prefill_s=run.prefill_s,
            prefill_tokens_per_s=len(prompt) / run.prefill_s if run.prefill_s else 0.0,
            decode_tokens_per_s=len(ms) / sum(run.token_s) if ms else 0.0,
            step_ms=ms,
            p50_ms=float(np.percentile(ms, 50)) if ms else 0.0,
            p99_ms=float(np.percentile(ms, 99)) if ms else 0.0,
            host_bytes_per_token=decode_bytes / max(len(ms), 1),
            kv_host_bytes_per_token=0.0,
            prefill_host_bytes=run.prefill_host_bytes,
            kv_cache_bytes=loop.kv_cache_bytes,
            peak_rss_bytes=_peak_rss(),
            sampling=sampler.config.to_dict(),
            notes=notes,
            speculation=run.speculation,
        )

    def _check_stops(self, stop_tokens: Sequence[int]) -> None:
        """A stop id outside the vocabulary is never produced: generation would run on past what it was to stop at."""
        vocab = self.signature.vocab_size
        bad = self.signature.outside_vocabulary(stop_tokens)
        if bad:
            raise UsageError(
                f"Stop token id(s) {bad[:10]} are outside the vocabulary (0 .. {vocab - 1 if vocab else 'n'}): the "
                "model never produces them, so generation would not stop there."
            )

    def _prompt(
        self, prompt_ids: Sequence[int] | np.ndarray, attention_mask: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        try:
            ids = np.asarray(prompt_ids, dtype=np.int64)
        except OverflowError:  # ids beyond int64: no vocabulary is that large
            raise UsageError(
                "Token ids must fit in int64 and lie inside the vocabulary; the prompt holds a larger number."
            ) from None
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.shape[0] == 0:
            raise UsageError(
                f"The prompt must be a non-empty list of token ids (or [batch, length]); got shape {list(ids.shape)}."
            )
        vocab = self.signature.vocab_size
        bad = ids[(ids < 0) | (ids >= vocab)] if vocab else ids[ids < 0]
        if bad.size:
            raise UsageError(
                f"Token id(s) {sorted(set(bad.tolist()))[:10]} are outside the vocabulary "
                f"(0 .. {vocab - 1 if vocab else 'n'})."
            )
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
        if mask.shape != ids.shape:
            raise UsageError(f"attention_mask shape {list(mask.shape)} differs from the prompt's {list(ids.shape)}.")
        if (mask[:, -1] == 0).any():
            raise UsageError("attention_mask has padding at the end of a row; pad prompts on the left.")
        return ids, mask

    def _max_length(self, prompt_length: int, max_new_tokens: int, max_length: int | None) -> int:
        limit = self.signature.max_positions
        if limit is not None and prompt_length >= limit:
            raise UsageError(
                f"The prompt has {prompt_length} tokens, but the model handles at most "
                f"{limit} positions (its max_positions metadata or rotary tables); shorten the "
                "prompt, or, for a model fused by ortpilot, fuse again with a larger "
                "--max-positions."
            )
        if max_length is not None and prompt_length >= max_length:
            raise UsageError(
                f"The prompt has {prompt_length} tokens, but the KV buffer holds "
                f"{max_length} (max_length); raise max_length or shorten the prompt."
            )
        wanted = prompt_length + max_new_tokens
        caps = [c for c in (limit, max_length) if c is not None]
        return min([wanted, *caps])


def generate(
    model: str | os.PathLike | onnx.ModelProto | VerifiedSession,
    prompt_ids: Sequence[int] | np.ndarray,
    max_new_tokens: int | None = None,
    loop: str | None = None,
    *,
    options: GenerateOptions | None = None,
    stream: StreamCallback | None = None,
    attention_mask: np.ndarray | None = None,
    providers: Any = None,
    policy: str = "warn",
    settings: SessionSettings | None = None,
    mapping: Mapping[str, str] | None = None,
    **keywords: Any,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` (see :class:`GenerationResult`) with a
    ``Generator`` of ``model`` (``providers``, ``policy``, ``settings``, ``mapping``: its session and
    signature) and one request's ``options`` (``decode.options.GenerateOptions``) or their fields as
    arguments: ``loop`` auto (the fastest the model supports), plain, bound or shared; ``sampling``,
    ``stop_tokens``, ``max_length`` (caps prompt + new tokens, and sizes the shared buffer),
    ``speculation``: prompt-lookup drafts for a greedy batch-1 request on the shared loop (``auto``: where
    they pay; ``on``; ``off``). ``stream`` gets the new token ids ([batch]) as each step produces them.
    """
    generator = Generator(model, providers=providers, policy=policy, settings=settings, mapping=mapping)
    return generator.generate(
        prompt_ids, max_new_tokens, loop, options=options, stream=stream, attention_mask=attention_mask, **keywords
    )


def _run(
    runner: DecodeLoop,
    ids: np.ndarray,
    mask: np.ndarray,
    max_new_tokens: int,
    max_length: int,
    sampler: Sampler,
    stop: set[int],
    stream: StreamCallback | None,
    reason: str,
    notes: list[str],
) -> GenerationResult:
    batch, prompt_length = ids.shape
    start = time.perf_counter()
    logits = runner.prefill(ids, mask)
    token = sampler(logits)
    prefill_s = time.perf_counter() - start
    prefill_traffic = runner.traffic.snapshot()
    finished = np.zeros(batch, dtype=bool)
    out: list[list[int]] = [[] for _ in range(batch)]
    steps: list[float] = []
    stop_reason = "max_new_tokens"
    pad = next(iter(stop), 0)
    while True:
        for row in range(batch):
            if not finished[row]:
                out[row].append(int(token[row]))
        if stream is not None:
            stream(token)
        finished |= np.isin(token, list(stop)) if stop else False
        if finished.all():
            stop_reason = "stop_token"
            break
        if len(steps) + 1 >= max_new_tokens:
            break
        if prompt_length + len(steps) + 1 >= max_length:
            stop_reason = "max_length"
            break
        t0 = time.perf_counter()
        logits = runner.step(np.where(finished, pad, token)[:, None])
        token = sampler(logits)
        steps.append(time.perf_counter() - t0)
    decode = runner.traffic.since(prefill_traffic)
    n = max(len(steps), 1)
    ms = [s * 1e3 for s in steps]
    return GenerationResult(
        tokens=out,
        prompt_length=prompt_length,
        loop=runner.name,
        loop_reason=reason,
        stop_reason=stop_reason,
        prefill_s=prefill_s,
        prefill_tokens_per_s=batch * prompt_length / prefill_s if prefill_s else 0.0,
        decode_tokens_per_s=batch * len(steps) / sum(steps) if steps else 0.0,
        step_ms=ms,
        p50_ms=float(np.percentile(ms, 50)) if ms else 0.0,
        p99_ms=float(np.percentile(ms, 99)) if ms else 0.0,
        host_bytes_per_token=decode.host_bytes / n,
        kv_host_bytes_per_token=decode.kv_host_bytes / n,
        prefill_host_bytes=prefill_traffic.host_bytes,
        kv_cache_bytes=_kv_bytes(runner.sig, batch, runner.length if runner.name != "shared" else max_length),
        peak_rss_bytes=_peak_rss(),
        sampling=sampler.config.to_dict(),
        notes=notes,
    )


def _kv_bytes(sig: DecoderSignature, batch: int, length: int) -> int:
    return int(sum(np.prod(c.shape(batch, length)) * c.dtype.itemsize for c in sig.cache))


def _peak_rss() -> int:
    """Peak resident memory of this process so far (bytes; ru_maxrss is KiB on Linux)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
