"""Is this build slower than the saved one? A performance regression gate for CI.

``ortpilot bench MODEL --baseline OLD.json --max-slowdown PCT`` compares a fresh measurement
with a saved ``bench --json`` result. A comparison across two runs is only fair when it
measured the same thing, so the saved run must match on what decides its latency (the model
that plays "old", its shapes, providers, settings, IOBinding, concurrency): otherwise exit 2,
naming what differs. Two ways to say "slower beyond the noise":

- with the old model running in this same process (``--vs "--model OLD.onnx"``), the paired
  interleaved ratio new / old and its CI (``measure.interleave``): the fair comparison, since
  both saw the same machine state;
- without it, the new median's CI against the saved median's CI, each from its own run: it can
  only flag a slowdown that the two runs' CIs both exclude, so it catches less.

The verdict is "slower" when the lower end of new / old exceeds 1 + PCT/100: slower by more
than PCT even where the noise is kindest to the new build.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ortpilot.errors import UsageError
from ortpilot.modelio import file_sha256

# Fields of a bench result that decide its latency (besides the model): a baseline must match them.
MATCHED = ("shapes", "providers", "settings", "iobinding", "concurrency", "batch_size")


def check_max_slowdown(value: Any, option: str = "--max-slowdown") -> float:
    """A slowdown limit in percent: a positive, finite number."""
    try:
        pct = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{option} must be a number of percent, e.g. 10, got {value!r}.") from None
    if not pct > 0 or pct == float("inf"):
        raise UsageError(
            f"{option} must be a positive percentage (10 means: fail when more than 10% slower), got {value!r}."
        )
    return pct


def read_baseline(path: str | os.PathLike) -> dict[str, Any]:
    """The saved run's result as one ``bench`` document (for a saved comparison: its baseline configuration)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"--baseline '{p}' does not exist. Save one with 'ortpilot bench MODEL --json > {p.name}'."
        ) from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"--baseline '{p}' is not a JSON file ({exc}). Save one with 'ortpilot bench MODEL --json > FILE'."
        ) from None
    if (
        isinstance(doc, dict)
        and doc.get("kind") == "comparison"
        and isinstance(doc.get("configs"), list)
        and doc["configs"]
    ):
        doc = doc["configs"][0]
    if not isinstance(doc, dict) or doc.get("kind") != "bench" or not isinstance(doc.get("latency"), dict):
        raise UsageError(
            f"--baseline '{p}' is not an 'ortpilot bench --json' result (no kind \"bench\" with latency "
            "figures). Save one with 'ortpilot bench MODEL --json > FILE'."
        )
    for key in ("p50_ms", "median_ci95_ms"):
        if key not in doc["latency"]:
            raise UsageError(f"--baseline '{p}' has no latency.{key}; it was edited or is from another tool.")
    return doc


def check_same_measurement(baseline: dict[str, Any], old: dict[str, Any], path: str | os.PathLike) -> None:
    """Refuse a baseline that measured something else than ``old`` (this run's result for the old model)."""
    differs = []
    if baseline.get("model_sha256") != old.get("model_sha256"):
        differs.append(
            f"model sha256 {str(baseline.get('model_sha256'))[:12]}… there, {str(old.get('model_sha256'))[:12]}… here"
        )
    for key in MATCHED:
        if key in baseline and baseline.get(key) != old.get(key):
            differs.append(
                f"{key} {json.dumps(baseline.get(key), sort_keys=True)} there, "
                f"{json.dumps(old.get(key), sort_keys=True)} here"
            )
    if differs:
        raise UsageError(
            f"--baseline '{path}' measured something else: {'; '.join(differs)}. Compare like with like: "
            'the same model (or give the old one with --vs "--model OLD.onnx") and the same flags.'
        )


@dataclass(frozen=True)
class RegressionVerdict:
    """new / old latency with its CI, the limit, how it was measured, and the verdict."""

    ratio: float
    ci_low: float
    ci_high: float
    limit: float
    method: str  # "interleaved" | "saved CI"
    new_ms: float
    old_ms: float

    @property
    def slower(self) -> bool:
        return self.ci_low > self.limit

    def line(self) -> str:
        how = (
            "interleaved with the old model in this process"
            if self.method == "interleaved"
            else "this run's median CI against the saved run's"
        )
        pct = (self.limit - 1) * 100
        if self.slower:
            return (
                f"slower: p50 {self.new_ms:.3f} ms vs {self.old_ms:.3f} ms, {self.ratio:.2f}x the baseline "
                f"(95% CI {self.ci_low:.2f}-{self.ci_high:.2f}, {how}), more than the {pct:g}% allowed."
            )
        return (
            f"ok: p50 {self.new_ms:.3f} ms vs {self.old_ms:.3f} ms, {self.ratio:.2f}x the baseline "
            f"(95% CI {self.ci_low:.2f}-{self.ci_high:.2f}, {how}); the limit is {pct:g}% slower."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "ci95": [self.ci_low, self.ci_high],
            "limit": self.limit,
            "method": self.method,
            "new_p50_ms": self.new_ms,
            "old_p50_ms": self.old_ms,
            "slower": self.slower,
            "line": self.line(),
        }


def from_saved_ci(new: dict[str, Any], baseline: dict[str, Any], max_slowdown_pct: float) -> RegressionVerdict:
    """new / old from two runs' medians; the CI spans both runs' median CIs (conservative)."""
    lat_new, lat_old = new["latency"], baseline["latency"]
    (new_lo, new_hi), (old_lo, old_hi) = lat_new["median_ci95_ms"], lat_old["median_ci95_ms"]
    return RegressionVerdict(
        lat_new["p50_ms"] / lat_old["p50_ms"],
        new_lo / old_hi,
        new_hi / old_lo,
        1 + max_slowdown_pct / 100,
        "saved CI",
        lat_new["p50_ms"],
        lat_old["p50_ms"],
    )


def from_interleaved(
    new: dict[str, Any], old: dict[str, Any], ratio: dict[str, Any], max_slowdown_pct: float
) -> RegressionVerdict:
    """new / old from the paired ratio ``old / new`` the interleaved run measured (``Ratio.to_dict``)."""
    low, high = ratio["ci95"]
    return RegressionVerdict(
        1 / ratio["ratio"],
        1 / high,
        1 / low,
        1 + max_slowdown_pct / 100,
        "interleaved",
        new["latency"]["p50_ms"],
        old["latency"]["p50_ms"],
    )


@dataclass(frozen=True)
class Baseline:
    """A saved run to compare with, read and checked before measuring, and the slowdown it allows."""

    path: str
    saved: dict[str, Any]
    max_slowdown_pct: float


def prepare_baseline(path: str | None, max_slowdown: Any, models: Sequence[Any]) -> Baseline | None:
    """``--baseline``/``--max-slowdown`` checked before measuring, so a wrong one exits 2 at once.

    ``models``: each configuration's model, the one that plays "old" last (MODEL alone, or MODEL
    and the old model given with one ``--vs``). A saved run of another model file is refused
    here, before minutes of measuring. None without a baseline.
    """
    if path is None:
        if max_slowdown is not None:
            raise UsageError("--max-slowdown needs --baseline: the saved 'bench --json' result to compare with.")
        return None
    if max_slowdown is None:
        raise UsageError("--baseline needs --max-slowdown PCT: how much slower than the saved run still passes.")
    pct = check_max_slowdown(max_slowdown)
    if len(models) > 2:
        raise UsageError("--baseline compares two configurations at most: MODEL, and the old model with one --vs.")
    saved = read_baseline(path)
    old_model = models[-1]
    if (
        isinstance(old_model, (str, Path))
        and Path(old_model).is_file()
        and file_sha256(old_model) != saved.get("model_sha256")
    ):
        raise UsageError(
            f"--baseline '{path}' measured another model (sha256 {str(saved.get('model_sha256'))[:12]}…) "
            f"than '{old_model}' ({file_sha256(old_model)[:12]}…). Give the model it measured, or its "
            'new build as MODEL and the old one with --vs "--model OLD.onnx".'
        )
    return Baseline(path, saved, pct)


class Measured(Protocol):
    """A bench result (``BenchResult``, or ``ComparisonResult`` of an interleaved run)."""

    def to_dict(self, *, samples: bool = True) -> dict[str, Any]: ...


def judge(baseline: Baseline, result: Measured) -> RegressionVerdict:
    """This run against the saved one: interleaved with the old model when it ran here, else CI against CI."""
    doc = result.to_dict(samples=False)
    if doc.get("kind") == "comparison":
        new, old = doc["configs"][0], doc["configs"][1]
        check_same_measurement(baseline.saved, old, baseline.path)
        return from_interleaved(new, old, doc["ratios"][0], baseline.max_slowdown_pct)
    check_same_measurement(baseline.saved, doc, baseline.path)
    return from_saved_ci(doc, baseline.saved, baseline.max_slowdown_pct)


__all__ = [
    "MATCHED",
    "Baseline",
    "Measured",
    "RegressionVerdict",
    "check_max_slowdown",
    "check_same_measurement",
    "from_interleaved",
    "from_saved_ci",
    "judge",
    "prepare_baseline",
    "read_baseline",
]
