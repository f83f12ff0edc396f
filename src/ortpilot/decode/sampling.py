"""Choosing the next token from logits: greedy, or temperature / top-k / top-p with a seed.

Greedy is the default because it is what the loops are compared on: every loop must produce
the same greedy tokens. Sampling draws from one seeded generator, so a seed reproduces a run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ortpilot.errors import SamplingError, UsageError

MAX_SEED = 2**64
DEFAULT_TEMPERATURE = 0.0  # greedy
DEFAULT_TOP_K = 0  # no cut
DEFAULT_TOP_P = 1.0  # no cut


@dataclass(frozen=True)
class SamplingConfig:
    """``temperature`` 0 means greedy; ``top_k`` 0 and ``top_p`` 1.0 mean no cut."""

    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    seed: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature < math.inf:  # inf flattens every distribution to uniform noise
            raise UsageError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}.")
        if self.top_k < 0:
            raise UsageError(f"top_k must be >= 0 (0 = no cut), got {self.top_k}.")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not 0 <= self.seed < MAX_SEED):
            raise UsageError(f"seed must be an integer from 0 to 2**64 - 1, got {self.seed!r}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sampler:
    """Picks one token per row of a [batch, vocab] logits array."""

    def __init__(self, config: SamplingConfig | None = None) -> None:
        self.config = config or SamplingConfig()
        self._rng = np.random.default_rng(self.config.seed)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if self.config.greedy:
            tokens = np.argmax(logits, axis=-1)
            picked = np.take_along_axis(logits, tokens[..., None], axis=-1)
            if not np.isfinite(picked).all():  # argmax returns the first NaN: a broken row, not a token
                raise SamplingError("the model's logits hold NaN or infinity: no token can be chosen from them.")
            return tokens.astype(np.int64)
        return np.array([self._sample(row) for row in logits], dtype=np.int64)

    def _sample(self, row: np.ndarray) -> int:
        cfg = self.config
        # Shift before dividing: a tiny temperature then sends the others to -inf, never the top to inf
        # (inf - inf is the NaN that would end the draw).
        scores = row.astype(np.float64)
        top = scores.max()
        if not np.isfinite(top):
            raise SamplingError(f"the model's logits hold {top} (NaN or infinity): no token can be drawn from them.")
        scores = (scores - top) / cfg.temperature
        order = np.argsort(-scores, kind="stable")
        if cfg.top_k:
            order = order[: cfg.top_k]
        kept = scores[order]
        probs = np.exp(kept - kept.max())
        probs /= probs.sum()
        if cfg.top_p < 1.0:
            # Keep the smallest prefix whose mass reaches top_p (always at least one token).
            cut = int(np.searchsorted(np.cumsum(probs), cfg.top_p) + 1)
            order, probs = order[:cut], probs[:cut] / probs[:cut].sum()
        return int(order[self._rng.choice(len(order), p=probs)])
