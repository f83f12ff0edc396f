"""Token vectors to one vector per sentence, as sentence-transformers' ``Pooling`` and ``Normalize`` do.

Every mode reads the attention mask, so padded positions never reach the result: ``mean_tokens``
and ``mean_sqrt_len_tokens`` sum real tokens only, ``max_tokens`` takes the maximum over real
tokens only, ``weightedmean_tokens`` weighs position ``i`` by ``i + 1`` over real tokens,
``cls_token`` is the first token and ``lasttoken`` the last real one (padding is on the right).
Several modes are concatenated in sentence-transformers' order. A cross-encoder's and a
classifier's logits become scores with ``activate``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# The order sentence-transformers' Pooling concatenates several modes in (its forward()).
POOLING_ORDER = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
POOLING_MODES = POOLING_ORDER
ACTIVATIONS = ("sigmoid", "softmax", "none")
# The short names sentence-transformers' Pooling(pooling_mode=...) takes, and the ones its config files spell.
POOLING_NAMES = {
    "cls": "cls_token",
    "max": "max_tokens",
    "mean": "mean_tokens",
    "mean_sqrt_len": "mean_sqrt_len_tokens",
    "weightedmean": "weightedmean_tokens",
    "lasttoken": "lasttoken",
    **{mode: mode for mode in POOLING_ORDER},
}
_MIN_COUNT = 1e-9  # sentence-transformers' clamp on the token count (a row of no tokens gives zeros, not NaN)


def _masked(tokens: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(tokens, dtype=np.float32)
    if values.ndim != 3 or mask.shape != values.shape[:2]:
        raise ValueError(f"token vectors {values.shape} and mask {mask.shape} do not match as [batch, sequence, dim]")
    return values, (np.asarray(mask) > 0)


def pool_mode(tokens: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """``[batch, dim]`` from ``[batch, sequence, dim]`` token vectors under a ``[batch, sequence]`` mask."""
    values, real = _masked(tokens, mask)
    weights = real[..., None].astype(np.float32)
    if mode == "cls_token":
        return values[:, 0].copy()
    if mode == "lasttoken":
        last = np.maximum(real.sum(axis=1) - 1, 0)
        return values[np.arange(values.shape[0]), last].copy()
    if mode == "max_tokens":
        return np.where(real[..., None], values, np.float32(-1e9)).max(axis=1)
    if mode == "weightedmean_tokens":
        weights = weights * np.arange(1, values.shape[1] + 1, dtype=np.float32)[None, :, None]
    total = (values * weights).sum(axis=1)
    count = np.maximum(weights.sum(axis=1), _MIN_COUNT)
    if mode in ("mean_tokens", "weightedmean_tokens"):
        return total / count
    if mode == "mean_sqrt_len_tokens":
        return total / np.sqrt(count)
    raise ValueError(f"unknown pooling mode {mode!r}; the modes are {', '.join(POOLING_MODES)}")


def pool(tokens: np.ndarray, mask: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """The modes' vectors side by side (sentence-transformers concatenates several in ``POOLING_MODES`` order)."""
    if not modes:
        raise ValueError("no pooling mode given")
    parts = [pool_mode(tokens, mask, m) for m in sorted(modes, key=POOLING_MODES.index)]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def pooling_modes(spec: str | Sequence[str]) -> tuple[str, ...]:
    """``"mean"``, ``"cls,mean"`` or ``["cls", "mean_tokens"]`` as mode names in concatenation order; an unknown
    name is a ValueError listing the known ones."""
    names = [p.strip() for p in spec.split(",")] if isinstance(spec, str) else [str(p).strip() for p in spec]
    unknown = [n for n in names if n.lower() not in POOLING_NAMES]
    if unknown or not names:
        raise ValueError(
            f"unknown pooling {', '.join(repr(n) for n in unknown) or '(none given)'}; give one or more of "
            f"{', '.join(k for k in POOLING_NAMES if k not in POOLING_ORDER)} (or {', '.join(POOLING_ORDER)})"
        )
    chosen = {POOLING_NAMES[n.lower()] for n in names}
    return tuple(m for m in POOLING_ORDER if m in chosen)


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero), as sentence-transformers' ``Normalize``."""
    values = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(values, axis=-1, keepdims=True)
    return values / np.maximum(norms, np.float32(1e-12))


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    """Scores from logits: ``sigmoid`` (a cross-encoder's relevance, multi-label), ``softmax`` over the last
    axis (one label of several), ``none`` (the logits)."""
    values = np.asarray(logits, dtype=np.float32)
    if activation == "sigmoid":
        return (0.5 * (1.0 + np.tanh(0.5 * values))).astype(np.float32)  # 1 / (1 + e^-x), without overflow
    if activation == "softmax":
        shifted = np.exp(values - values.max(axis=-1, keepdims=True))
        return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)
    if activation == "none":
        return values
    raise ValueError(f"unknown activation {activation!r}; the activations are {', '.join(ACTIVATIONS)}")


__all__ = [
    "ACTIVATIONS",
    "POOLING_MODES",
    "POOLING_NAMES",
    "activate",
    "normalize",
    "pool",
    "pool_mode",
    "pooling_modes",
]
