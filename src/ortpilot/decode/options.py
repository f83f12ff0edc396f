"""How a decoder generates, as frozen records: one request (``GenerateOptions``) and the engine (``EngineOptions``).

``GenerateOptions`` is what ``generate`` and ``Generator.generate`` take for one request: how many
tokens, which loop, sampling, stop tokens, the length cap, speculation; ``ortpilot generate``'s
argument group builds it. ``EngineOptions`` are the continuous-batching engine's own settings: weight
formats, prefix cache, speculation. Frozen records, so that a server passes them through unchanged and
a benchmark names exactly what it ran. The defaults are what pays where it pays: one weight format (the model as given;
more formats cost memory and a gate at load, docs/concepts/decode-engine.md), a prefix cache
(a miss costs a copy of the prompt's rows, ~0.5 % of its prefill), and prompt-lookup speculation
that turns itself off per stream when its drafts are not accepted often enough to pay.
Bad values are UsageErrors (exit 2) that name the setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ortpilot.artifacts.fields import record_of
from ortpilot.decode.sampling import SamplingConfig
from ortpilot.errors import UsageError
from ortpilot.gate.generation import DEFAULT_MIN_TOP1

LOOP_CHOICES = ("auto", "plain", "bound", "shared")
DEFAULT_LOOP = "auto"  # the fastest loop the model supports
DEFAULT_MAX_NEW_TOKENS = 32
BASE = "base"  # the weight format of the model as given
SPECULATION_MODES = ("auto", "on", "off")
DEFAULT_SPECULATION = "auto"
DEFAULT_PREFIX_CACHE_BYTES = 256 * 2**20
DEFAULT_PREFIX_BLOCK = 16
DEFAULT_DRAFT_TOKENS = 4
DEFAULT_FORMAT_MIN_TOP1 = DEFAULT_MIN_TOP1  # a format passes the generation gate with its own default
# The scheduler's limits (decode.scheduler.Scheduler), here so that a server's options read them without it.
DEFAULT_MAX_STREAMS = 8
DEFAULT_MAX_QUEUE = 64
DEFAULT_PREFILL_CHUNK = 0  # 0: whole prompts


@dataclass(frozen=True)
class EngineOptions:
    """How a :class:`~ortpilot.decode.scheduler.Scheduler` runs its steps.

    ``formats``: the weight formats held at once, all bound to the one KV buffer; each step runs
    on the one measured fastest for its row count. ``base`` is the model as given; ``int4``
    (4-bit ``MatMulNBits``) and ``int8-weights`` (8-bit) are built from it at load; ``NAME=PATH``
    loads a format built elsewhere. Every format but ``base`` must pass the generation gate against
    ``base`` with top-1 agreement ``format_min_top1``.
    ``prefix_cache_bytes``: memory cap of the prefix cache (0: off); ``prefix_block``: tokens per
    cached block. ``speculation``: prompt-lookup drafts of ``draft_tokens`` tokens, verified in one
    run: ``auto`` (per stream, off while its drafts do not pay), ``on`` or ``off``.
    """

    formats: tuple[str, ...] = (BASE,)
    format_min_top1: float = DEFAULT_FORMAT_MIN_TOP1
    measure_rounds: int = 3
    prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES
    prefix_block: int = DEFAULT_PREFIX_BLOCK
    speculation: str = DEFAULT_SPECULATION
    draft_tokens: int = DEFAULT_DRAFT_TOKENS

    def __post_init__(self) -> None:
        formats = tuple(self.formats)
        object.__setattr__(self, "formats", formats)
        if not formats:
            raise UsageError("formats is empty; give at least one weight format (base: the model as given).")
        names = [format_name(f) for f in formats]
        if len(set(names)) != len(names):
            raise UsageError(f"formats names a weight format twice ({', '.join(formats)}); give each once.")
        if not 0.0 <= self.format_min_top1 <= 1.0:
            raise UsageError(f"format_min_top1 must be between 0 and 1, got {self.format_min_top1}.")
        if self.measure_rounds < 1:
            raise UsageError(f"measure_rounds must be at least 1, got {self.measure_rounds}.")
        if self.prefix_cache_bytes < 0:
            raise UsageError(f"prefix_cache_bytes must be 0 (off) or more, got {self.prefix_cache_bytes}.")
        if self.prefix_block < 2:
            raise UsageError(f"prefix_block must be at least 2 tokens, got {self.prefix_block}.")
        if self.speculation not in SPECULATION_MODES:
            raise UsageError(f"speculation must be one of {', '.join(SPECULATION_MODES)}; got '{self.speculation}'.")
        if self.draft_tokens < 1:
            raise UsageError(
                f"draft_tokens (the speculation length) must be at least 1, got {self.draft_tokens}; "
                "turn speculation off with speculation='off'."
            )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(format_name(f) for f in self.formats)

    def check_context(self, max_length: int, what: str = "a stream's max_length") -> None:
        """Refuse a speculation length the context cannot hold (a verify run is draft + 1 tokens after one)."""
        if self.speculation != "off" and self.draft_tokens >= max_length - 1:
            raise UsageError(
                f"draft_tokens {self.draft_tokens} (the speculation length) does not fit {what} of {max_length} "
                f"tokens: a verify run takes the draft and one token more after a prompt of at least one; give at "
                f"most {max(1, max_length - 2)}, or speculation='off'."
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GenerateOptions:
    """One generation request's settings (the prompt and where tokens stream to are the call's own).

    ``max_new_tokens`` at most; ``loop``: auto (the fastest the model supports), plain, bound or shared;
    ``sampling`` (None: greedy); generation stops at any of ``stop_tokens``; ``max_length`` caps prompt +
    new tokens (and sizes the shared buffer; None: the model's positions); ``speculation``: prompt-lookup
    drafts of ``draft_tokens`` for a greedy batch-1 request on the shared loop (``auto``: where they pay;
    ``on``; ``off``).
    """

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    loop: str = DEFAULT_LOOP
    sampling: SamplingConfig | None = None
    stop_tokens: tuple[int, ...] = ()
    max_length: int | None = None
    speculation: str = DEFAULT_SPECULATION
    draft_tokens: int = DEFAULT_DRAFT_TOKENS

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise UsageError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}.")
        check_loop(self.loop)
        if isinstance(self.sampling, Mapping):
            object.__setattr__(self, "sampling", SamplingConfig(**self.sampling))
        object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))
        EngineOptions(speculation=self.speculation, draft_tokens=self.draft_tokens)  # their checks, once

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "stop_tokens": list(self.stop_tokens)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> GenerateOptions:
        """``sampling`` as ``SamplingConfig``'s fields (``to_dict`` writes them so)."""
        return record_of(cls, doc, "A GenerateOptions record")


def check_loop(loop: str) -> None:
    if loop not in LOOP_CHOICES:
        raise UsageError(f"Unknown loop '{loop}'; choose one of {', '.join(LOOP_CHOICES)}.")


def format_name(spec: str) -> str:
    """The name a format goes by: ``NAME`` of ``NAME=PATH``, else the spec itself."""
    return spec.split("=", 1)[0] if "=" in spec else spec


__all__ = [
    "BASE",
    "DEFAULT_DRAFT_TOKENS",
    "DEFAULT_FORMAT_MIN_TOP1",
    "DEFAULT_LOOP",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_MAX_QUEUE",
    "DEFAULT_MAX_STREAMS",
    "DEFAULT_PREFILL_CHUNK",
    "DEFAULT_PREFIX_BLOCK",
    "DEFAULT_PREFIX_CACHE_BYTES",
    "DEFAULT_SPECULATION",
    "LOOP_CHOICES",
    "SPECULATION_MODES",
    "EngineOptions",
    "GenerateOptions",
    "check_loop",
    "format_name",
]
