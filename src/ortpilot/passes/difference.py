"""How far a rewriting pass moved a model's outputs: the check the fusion passes run on what they return.

A fusion rewrites math, it does not approximate it, so its outputs must stay within
``atol + rtol * scale`` of the source's on the same feeds; a wrong head count or an unmatched
pattern gives wrong numbers, never an error, and this is where that shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx


@dataclass(frozen=True)
class OutputDifference:
    """The largest ``|transformed - source|`` over every float output and feed set (not finite when an
    output became NaN/Inf), the output it was on, and the largest ``|source|`` (what rtol scales)."""

    max_abs: float
    worst: str
    scale: float

    def bound(self, atol: float, rtol: float) -> float:
        return atol + rtol * self.scale

    def within(self, atol: float, rtol: float) -> bool:
        return self.max_abs <= self.bound(atol, rtol)  # False for NaN


def output_difference(
    source: onnx.ModelProto, transformed: onnx.ModelProto, feeds: Iterable[Mapping[str, np.ndarray]]
) -> OutputDifference:
    """Run both models on each feed set (CPU sessions) and compare every float output."""
    from ortpilot.session import load

    a = load(source, placement=False).session
    b = load(transformed, placement=False).session
    names = [o.name for o in a.get_outputs()]
    max_abs, worst, scale = 0.0, names[0], 0.0
    for feed in feeds:
        for name, x, y in zip(names, a.run(names, dict(feed)), b.run(names, dict(feed))):
            if not np.issubdtype(x.dtype, np.floating) or not x.size:
                continue
            diff = float(np.max(np.abs(x.astype(np.float64) - y)))
            scale = max(scale, float(np.max(np.abs(x))))
            if diff > max_abs or not np.isfinite(diff):
                max_abs, worst = diff, name
    return OutputDifference(max_abs, worst, scale)


__all__ = ["OutputDifference", "output_difference"]
