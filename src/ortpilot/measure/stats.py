"""Latency statistics a performance engineer trusts: percentiles, bootstrap CIs, a noise flag.

Medians, not means, carry every comparison: one context switch on a busy machine moves a mean
but hardly a median. The confidence intervals come from a seeded bootstrap, so the same samples
always give the same interval. Samples are seconds; ``to_dict`` reports milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

N_BOOTSTRAP = 2000
# Noise flag: the spread (p90 - p10) / p50 above this, or a median CI wider than
# CI_THRESHOLD of the median, means single numbers from this run should not be trusted alone.
SPREAD_THRESHOLD = 0.25
CI_THRESHOLD = 0.05
_CHUNK_CELLS = 4_000_000  # bootstrap matrices are built in chunks of at most this many cells


@dataclass(frozen=True)
class Stats:
    """Summary of one set of per-run latencies (seconds) and the throughput they came with."""

    count: int
    min: float
    mean: float
    p10: float
    p50: float
    p90: float
    p95: float
    p99: float
    p999: float
    max: float
    std: float
    median_ci: tuple[float, float]
    inferences_per_s: float
    items_per_s: float
    items_per_run: int
    spread: float
    ci_rel_width: float
    noise_reasons: list[str] = field(default_factory=list)

    @property
    def noisy(self) -> bool:
        return bool(self.noise_reasons)

    def to_dict(self) -> dict[str, Any]:
        ms = 1e3
        return {
            "count": self.count,
            "min_ms": self.min * ms,
            "mean_ms": self.mean * ms,
            "p10_ms": self.p10 * ms,
            "p50_ms": self.p50 * ms,
            "p90_ms": self.p90 * ms,
            "p95_ms": self.p95 * ms,
            "p99_ms": self.p99 * ms,
            "p999_ms": self.p999 * ms,
            "max_ms": self.max * ms,
            "std_ms": self.std * ms,
            "median_ci95_ms": [self.median_ci[0] * ms, self.median_ci[1] * ms],
            "inferences_per_s": self.inferences_per_s,
            "items_per_s": self.items_per_s,
            "items_per_run": self.items_per_run,
            "spread": self.spread,
            "ci_rel_width": self.ci_rel_width,
            "noisy": self.noisy,
            "noise_reasons": list(self.noise_reasons),
        }


def summarize(
    samples_s: Sequence[float],
    *,
    wall_s: float | None = None,
    items_per_run: int = 1,
    seed: int = 0,
    n_boot: int = N_BOOTSTRAP,
    spread_threshold: float = SPREAD_THRESHOLD,
    ci_threshold: float = CI_THRESHOLD,
) -> Stats:
    """Statistics of per-run latencies.

    ``wall_s`` is the wall time the runs took together: with concurrency, throughput is
    runs / wall time, not 1 / mean latency. Without it, runs are taken as back to back.
    """
    x = np.asarray(samples_s, dtype=np.float64)
    if x.size == 0:
        raise ValueError("summarize() needs at least one sample")
    p10, p50, p90, p95, p99, p999 = np.percentile(x, [10, 50, 90, 95, 99, 99.9])
    lo, hi = bootstrap_median_ci(x, seed=seed, n_boot=n_boot)
    wall = float(wall_s) if wall_s and wall_s > 0 else float(x.sum())
    ips = x.size / wall if wall > 0 else math.inf
    spread = float((p90 - p10) / p50) if p50 > 0 else 0.0
    ci_rel = float((hi - lo) / p50) if p50 > 0 else 0.0
    reasons = []
    if spread > spread_threshold:
        reasons.append(f"spread (p90-p10)/p50 = {spread:.0%} > {spread_threshold:.0%}")
    if ci_rel > ci_threshold:
        reasons.append(f"median CI width {ci_rel:.1%} of the median > {ci_threshold:.0%}")
    if x.size < 10:
        reasons.append(f"only {x.size} runs")
    return Stats(
        count=int(x.size),
        min=float(x.min()),
        mean=float(x.mean()),
        p10=float(p10),
        p50=float(p50),
        p90=float(p90),
        p95=float(p95),
        p99=float(p99),
        p999=float(p999),
        max=float(x.max()),
        std=float(x.std(ddof=1)) if x.size > 1 else 0.0,
        median_ci=(lo, hi),
        inferences_per_s=ips,
        items_per_s=ips * items_per_run,
        items_per_run=items_per_run,
        spread=spread,
        ci_rel_width=ci_rel,
        noise_reasons=reasons,
    )


def bootstrap_median_ci(
    samples: Sequence[float], *, seed: int = 0, n_boot: int = N_BOOTSTRAP, level: float = 0.95
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median (seeded: reproducible)."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size < 2:
        v = float(x[0]) if x.size else math.nan
        return v, v
    meds = _resampled_medians(x, np.random.default_rng(seed), n_boot)
    return _interval(meds, level)


def bootstrap_ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    a_blocks: Sequence[int] | None = None,
    b_blocks: Sequence[int] | None = None,
    seed: int = 0,
    n_boot: int = N_BOOTSTRAP,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """Ratio median(b) / median(a) with a bootstrap CI: (ratio, low, high).

    With block ids (the interleaving round each sample came from, shared by ``a`` and ``b``),
    whole rounds are resampled for both sides at once: a paired block bootstrap, so that a
    slow stretch of the machine lands in both medians and does not widen or bias the ratio.
    Without them the two sides are resampled independently.
    """
    xa = np.asarray(a, dtype=np.float64)
    xb = np.asarray(b, dtype=np.float64)
    if xa.size == 0 or xb.size == 0:
        raise ValueError("bootstrap_ratio_ci() needs samples on both sides")
    ratio = float(np.median(xb) / np.median(xa))
    rng = np.random.default_rng(seed)
    if a_blocks is None or b_blocks is None:
        ma = _resampled_medians(xa, rng, n_boot)
        mb = _resampled_medians(xb, rng, n_boot)
    else:
        ba = np.asarray(a_blocks, dtype=np.int64)
        bb = np.asarray(b_blocks, dtype=np.int64)
        blocks = np.union1d(ba, bb)
        ia = np.searchsorted(blocks, ba)
        ib = np.searchsorted(blocks, bb)
        # How often each round is drawn, per bootstrap replicate (offset bincount: one pass).
        draws = rng.integers(0, blocks.size, size=(n_boot, blocks.size))
        draws += np.arange(n_boot)[:, None] * blocks.size
        counts = np.bincount(draws.ravel(), minlength=n_boot * blocks.size).reshape(n_boot, blocks.size)
        ma = _weighted_medians(xa, counts, ia)
        mb = _weighted_medians(xb, counts, ib)
    ok = ma > 0
    lo, hi = _interval(mb[ok] / ma[ok], level) if ok.any() else (math.nan, math.nan)
    return ratio, lo, hi


def paired_ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    a_blocks: Sequence[int],
    b_blocks: Sequence[int],
    *,
    seed: int = 0,
    n_boot: int = N_BOOTSTRAP,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """Median over blocks of median(b in block) / median(a in block), with a CI: (ratio, low, high).

    Each block's ratio compares the two on the same machine state, so drift between blocks
    cancels; blocks missing either side are left out. Block ids are in time order, and a busy
    machine's slow spells span several blocks, so the CI comes from a moving-block bootstrap
    (runs of about n^(1/3) consecutive blocks) rather than from resampling blocks one by one,
    which would take correlated ratios for independent ones and be too narrow.
    """
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ba, bb = np.asarray(a_blocks), np.asarray(b_blocks)
    common = np.intersect1d(ba, bb)
    if common.size == 0:
        raise ValueError("paired_ratio_ci() needs blocks with samples on both sides")
    ratios = np.array([np.median(xb[bb == r]) / np.median(xa[ba == r]) for r in common])
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return math.nan, math.nan, math.nan
    if ratios.size < 2:
        return float(ratios[0]), float(ratios[0]), float(ratios[0])
    length = max(1, round(ratios.size ** (1 / 3)))
    starts_per_rep = math.ceil(ratios.size / length)
    rng = np.random.default_rng(seed)
    offsets = np.arange(length)
    meds = np.empty(n_boot)
    rows = max(1, _CHUNK_CELLS // (starts_per_rep * length))
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        starts = rng.integers(0, ratios.size - length + 1, size=(stop - start, starts_per_rep))
        idx = (starts[:, :, None] + offsets).reshape(stop - start, -1)[:, : ratios.size]
        meds[start:stop] = np.median(ratios[idx], axis=1)
    lo, hi = _interval(meds, level)
    return float(np.median(ratios)), lo, hi


def _resampled_medians(x: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    meds = np.empty(n_boot)
    rows = max(1, _CHUNK_CELLS // x.size)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        meds[start:stop] = np.median(x[rng.integers(0, x.size, size=(stop - start, x.size))], axis=1)
    return meds


def _weighted_medians(x: np.ndarray, block_counts: np.ndarray, block_of: np.ndarray) -> np.ndarray:
    """Per replicate r, the median of ``x`` where sample i counts ``block_counts[r, block_of[i]]``
    times (NaN when no sample counts)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    sorted_blocks = block_of[order]
    out = np.empty(block_counts.shape[0])
    rows = max(1, _CHUNK_CELLS // max(1, x.size))
    for start in range(0, block_counts.shape[0], rows):
        w = block_counts[start : start + rows][:, sorted_blocks]
        cum = np.cumsum(w, axis=1)
        total = cum[:, -1]
        lower = np.minimum((cum < ((total + 1) // 2)[:, None]).sum(axis=1), x.size - 1)
        upper = np.minimum((cum < (total // 2 + 1)[:, None]).sum(axis=1), x.size - 1)
        meds = (xs[lower] + xs[upper]) / 2
        meds[total == 0] = np.nan
        out[start : start + rows] = meds
    return out


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return math.nan, math.nan
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)
