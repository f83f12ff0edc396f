"""What a benchmark measures and how, as records: ``BenchConfig`` (one configuration) and ``BenchOptions``.

``BenchConfig`` is a model and everything about how it is run (providers, session settings, shapes or
feeds, IOBinding, concurrency); ``BenchOptions`` is how long and how it is measured (runs or a
duration, warm-up, turns when interleaving, the fallback policy, roofline, seed). ``measure.bench.bench``
takes one of each, ``measure.interleave.bench_interleaved`` several configurations and one
``BenchOptions``, and ``ortpilot bench``'s argument groups build them. Every default and every check
of the budget is here once: a bad run count, duration, warm-up or block is a ``UsageError`` (exit 2)
as the record is made, before any session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ortpilot.artifacts.fields import record_of, record_or_fields
from ortpilot.errors import UsageError
from ortpilot.session import SessionSettings
from ortpilot.session.fallback import check_policy

MAX_CONCURRENCY = 256
MAX_DURATION_S = 86_400.0  # a day: a longer timing (or inf) is a typo, and would never end
DEFAULT_DURATION_S = 5.0
DEFAULT_WARMUP = "auto"  # until the rolling median settles (``measure.bench.Runner.warm_up``)
DEFAULT_POLICY = "warn"


@dataclass
class BenchConfig:
    """One configuration to measure: a model (a path, bytes, a ModelProto or a loaded ``VerifiedSession``)
    and everything about how it is run. ``name`` labels it (empty: a letter by its place)."""

    name: str = ""
    model: Any = None
    providers: Any = None
    settings: SessionSettings | None = None
    shapes: Mapping[str, Sequence[int]] | None = None
    feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None = None  # one request or a replay set
    iobinding: bool = False
    concurrency: int = 1


@dataclass(frozen=True)
class BenchOptions:
    """How long and how a benchmark measures.

    ``runs`` timed runs (per configuration) or ``duration_s`` seconds of them (all configurations
    together; neither: ``DEFAULT_DURATION_S``); ``warmup`` runs first, or ``"auto"``: until the rolling
    median settles. Interleaving: ``block`` runs per turn (None: about 20 ms), ``settle_s`` untimed runs at
    the start of each turn. ``policy``: what a provider fallback does (strict, warn, allow); ``roofline``:
    achieved vs peak GFLOP/s; ``seed``: the generated inputs'.
    """

    runs: int | None = None
    duration_s: float | None = None
    warmup: int | str = DEFAULT_WARMUP
    block: int | None = None
    policy: str = DEFAULT_POLICY
    roofline: bool = False
    seed: int = 0
    settle_s: float = 0.0

    def __post_init__(self) -> None:
        runs, _ = check_budget(self.runs, self.duration_s, self.warmup)
        object.__setattr__(self, "runs", runs)
        block = self.block
        if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
            raise UsageError(f"The block (runs per turn) must be a positive integer, got {block}.")
        check_policy(self.policy)
        if not self.settle_s >= 0:
            raise UsageError(f"settle_s must be >= 0 seconds, got {self.settle_s}.")

    @property
    def budget(self) -> tuple[int | None, float | None]:
        """(runs, duration_s) as measured: the default duration where neither was given."""
        return check_budget(self.runs, self.duration_s, self.warmup)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> BenchOptions:
        return record_of(cls, doc, "A BenchOptions record")


def bench_records(
    config: BenchConfig | Any, options: BenchOptions | None, keywords: Mapping[str, Any]
) -> tuple[BenchConfig, BenchOptions]:
    """The records a benchmark takes, from themselves or from their fields as keywords (``runs=100``,
    ``iobinding=True``): ``config`` a ``BenchConfig`` or the model. A keyword that is no field of either,
    or a record given with its fields too, is a ``UsageError``."""
    options, rest = record_or_fields(BenchOptions, options, keywords, others=True)
    if isinstance(config, BenchConfig):
        config, rest = record_or_fields(BenchConfig, config, rest)
    else:
        config, rest = record_or_fields(BenchConfig, None, {**rest, "model": config})
    return config, options


def check_concurrency(concurrency: int) -> None:
    if not isinstance(concurrency, int) or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise UsageError(f"Concurrency must be between 1 and {MAX_CONCURRENCY} threads, got {concurrency}.")


def check_budget(runs: int | None, duration_s: float | None, warmup: int | str) -> tuple[int | None, float | None]:
    """Validate run count / duration / warm-up; default to DEFAULT_DURATION_S when neither is given."""
    if runs is not None and duration_s is not None:
        raise UsageError("Give a run count or a duration, not both (--runs N or --duration S).")
    if runs is not None and (isinstance(runs, bool) or int(runs) != runs or runs <= 0):
        raise UsageError(f"The run count must be a positive integer, got {runs}.")
    if duration_s is not None and not 0 < duration_s <= MAX_DURATION_S:
        raise UsageError(
            f"The duration must be a positive number of seconds, at most {MAX_DURATION_S:,.0f} (a day), "
            f"got {duration_s}."
        )
    if warmup != "auto" and (isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0):
        raise UsageError(f"Warm-up must be 'auto' or a run count >= 0, got {warmup!r}.")
    if runs is None and duration_s is None:
        duration_s = DEFAULT_DURATION_S
    return (int(runs) if runs is not None else None), duration_s


__all__ = [
    "DEFAULT_DURATION_S",
    "DEFAULT_POLICY",
    "DEFAULT_WARMUP",
    "MAX_CONCURRENCY",
    "BenchConfig",
    "BenchOptions",
    "bench_records",
    "check_budget",
    "check_concurrency",
]
