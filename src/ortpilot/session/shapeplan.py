"""A shape plan: static buckets for one dynamic dim, a session per bucket, a request padded up to its bucket.

An EP that compiles for static shapes (OpenVINO above all; the CPU EP plans memory and fuses more with
them) runs faster at a fixed size than with the dim left free. A plan picks a few sizes of the dim from
the workload (``choose_sizes``: its quantiles, rounded up), creates one session per size with ORT's
``free_dimension_overrides``, and runs each request on the smallest bucket that holds it, padded with
``pad_values`` (a mask 0, token ids the tokenizer's pad id) and its outputs cut back to the request's size.
A request beyond the largest bucket runs on the dynamic session (``beyond="dynamic"``) or is refused.

Padding is an accuracy claim: a model whose mask does not make padding invisible gives other outputs
padded, and the tune's gate compares every padded request with the model at the request's own size.
TensorRT takes the same buckets as optimization profiles (``tensorrt_profiles``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ortpilot.errors import UsageError

BEYOND = ("dynamic", "refuse")
MAX_BUCKETS = 8
BUCKET_QUANTILES = (0.5, 0.8, 0.95, 1.0)  # where a workload's buckets end: its median ... its longest
ROUND_TO = 8  # bucket sizes are multiples of this (kernels like aligned lengths; fewer distinct sizes)


@dataclass(frozen=True)
class ShapePlan:
    """Buckets of the graph dim ``dim`` (a symbol every padded axis shares), what pads each input, and what
    a longer request does."""

    dim: str
    sizes: tuple[int, ...]
    axes: tuple[tuple[str, int], ...]  # (input, axis) the dim sizes
    pad_values: tuple[tuple[str, float], ...] = ()  # input -> pad value; others pad with 0
    beyond: str = "dynamic"

    def __post_init__(self) -> None:
        sizes = tuple(sorted({int(s) for s in self.sizes}))
        if not sizes or sizes[0] < 1 or len(sizes) > MAX_BUCKETS:
            raise UsageError(f"A shape plan needs 1 to {MAX_BUCKETS} positive bucket sizes, got {list(self.sizes)}.")
        if self.beyond not in BEYOND:
            raise UsageError(f"A shape plan's 'beyond' is one of {', '.join(BEYOND)}, got {self.beyond!r}.")
        if not self.axes:
            raise UsageError(f"A shape plan for '{self.dim}' names no input axis to pad.")
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "axes", tuple((str(i), int(a)) for i, a in self.axes))
        object.__setattr__(
            self, "pad_values", tuple(sorted((str(k), float(v)) for k, v in dict(self.pad_values).items()))
        )

    @property
    def label(self) -> str:
        return f"buckets({','.join(map(str, self.sizes))})"

    def bucket_for(self, size: int) -> int | None:
        """The smallest bucket that holds ``size``; None beyond the largest."""
        for bucket in self.sizes:
            if bucket >= size:
                return bucket
        return None

    def size_of(self, feeds: Mapping[str, Any]) -> int:
        """The request's size along the plan's dim (its first padded axis)."""
        name, axis = self.axes[0]
        return int(feeds[name].shape[axis])

    def pad_value(self, name: str) -> float:
        return dict(self.pad_values).get(name, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "sizes": list(self.sizes),
            "axes": [[i, a] for i, a in self.axes],
            "pad_values": dict(self.pad_values),
            "beyond": self.beyond,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ShapePlan:
        try:
            return cls(
                dim=str(doc["dim"]),
                sizes=tuple(int(s) for s in doc["sizes"]),
                axes=tuple((str(i), int(a)) for i, a in doc["axes"]),
                pad_values=tuple(dict(doc.get("pad_values") or {}).items()),
                beyond=str(doc.get("beyond") or "dynamic"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"A shape plan is malformed ({type(exc).__name__}: {exc}).") from None


def choose_sizes(sizes: Sequence[int], quantiles: Sequence[float] = BUCKET_QUANTILES) -> tuple[int, ...]:
    """Bucket sizes for a workload whose requests have these sizes of the dim: each quantile rounded up to a
    multiple of ``ROUND_TO``, but never past the longest request (a bucket bigger than anything seen pads for
    nothing), without repeats."""
    ordered = sorted(int(s) for s in sizes)
    if not ordered:
        return ()
    out = set()
    for q in quantiles:
        value = ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
        out.add(min(-(-value // ROUND_TO) * ROUND_TO, ordered[-1]))
    return tuple(sorted(out))[-MAX_BUCKETS:]


def bucket_settings(settings: Mapping[str, Any], plan: ShapePlan, size: int) -> dict[str, Any]:
    """Session settings (``SessionSettings.to_dict``) with the plan's dim fixed to ``size``."""
    overrides = {**dict(settings.get("free_dimension_overrides") or {}), plan.dim: int(size)}
    return {**dict(settings), "free_dimension_overrides": overrides}


def tensorrt_profiles(plan: ShapePlan, shapes: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """TensorRT's explicit optimization profiles for the plan's buckets (one profile per bucket, its input
    named once per profile, as ORT's TensorRT EP takes several): bucket k covers sizes above the bucket below
    it up to k, optimised at k. ``shapes``: each padded input's shape at any size (the plan's axes are set)."""
    names = sorted({name for name, _ in plan.axes})
    axes = dict(plan.axes)
    lows = [1, *[s + 1 for s in plan.sizes[:-1]]]
    mins, opts, maxs = [], [], []
    for low, high in zip(lows, plan.sizes):
        for name in names:
            base = [int(d) for d in shapes[name]]

            def at(size: int, base: list[int] = base, axis: int = axes[name]) -> str:
                dims = list(base)
                dims[axis] = size
                return "x".join(map(str, dims))

            mins.append(f"{name}:{at(low)}")
            opts.append(f"{name}:{at(high)}")
            maxs.append(f"{name}:{at(high)}")
    return {
        "trt_profile_min_shapes": ",".join(mins),
        "trt_profile_opt_shapes": ",".join(opts),
        "trt_profile_max_shapes": ",".join(maxs),
    }


__all__ = [
    "BEYOND",
    "BUCKET_QUANTILES",
    "MAX_BUCKETS",
    "ShapePlan",
    "bucket_settings",
    "choose_sizes",
    "tensorrt_profiles",
]
