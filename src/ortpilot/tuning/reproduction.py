"""The verdict on a speedup measured outside the tune (``verify --bench`` / ``--max-slowdown``): one rule,
decided on the figures exactly as they are printed, so that a verdict can never contradict the numbers
beside it.

- The speedup is ORT's default p50 / the profile's p50, both as printed (four significant digits): not
  another estimator (a median of paired ratios once read 1.04x beside p50s whose ratio was 0.89x).
- It is held to the profile's headline (``latency.speedup_vs_default.ratio``), the figure the tune
  reported, never to a figure from one machine state or another run.
- ``reproduced``: the share printed (speedup / headline, two decimals) is at least ``REPRODUCED_SHARE``,
  and where the headline is 1x or more, the speedup's 95 % CI is not entirely below 1 (a profile that ran
  slower than ORT's default here beyond the noise reproduces no claim of being at least as fast).
- ``--max-slowdown PCT`` passes when the CI's upper end reaches headline / (1 + PCT/100), both as printed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

REPRODUCED_SHARE = 0.9  # the least share of the headline a check outside the tune must reach


def ms_text(ms: float) -> str:
    """A p50 in milliseconds to four significant digits (at least none after the point): 33.49, 0.04440."""
    if not ms > 0 or not math.isfinite(ms):
        return f"{ms:.3f}"
    decimals = max(0, 3 - math.floor(math.log10(ms)))
    return f"{ms:.{decimals}f}"


def _printed(value: float) -> float:
    """A ratio as printed with two decimals, read back."""
    return float(f"{value:.2f}")


def _hundredths(value: float) -> int:
    return round(_printed(value) * 100)


@dataclass(frozen=True)
class SpeedupVerdict:
    """A speedup measured here beside the headline it is held to; every field as printed."""

    default_p50_ms: float
    profile_p50_ms: float
    speedup: float  # default_p50_ms / profile_p50_ms, two decimals
    ci_low: float  # its 95 % CI, two decimals, widened to contain the speedup
    ci_high: float
    headline: float  # the profile's headline, two decimals
    share: float  # speedup / headline, two decimals
    share_needed: float = REPRODUCED_SHARE
    max_slowdown_pct: float | None = None
    default_ships: bool = False  # the profile is ORT's default session: it claims no speed over itself

    @classmethod
    def of(
        cls,
        default_p50_ms: float,
        profile_p50_ms: float,
        ci_low: float,
        ci_high: float,
        headline: float,
        *,
        share_needed: float = REPRODUCED_SHARE,
        max_slowdown_pct: float | None = None,
        default_ships: bool = False,
    ) -> SpeedupVerdict:
        """The verdict from measured figures: each rounded to what is printed first, then judged.

        ``ci_low``/``ci_high`` bound the speedup (default / profile); a percentile bootstrap of a median can
        miss its own point estimate with few rounds, so the interval is widened to contain it."""
        default = float(ms_text(default_p50_ms))
        profile = float(ms_text(profile_p50_ms))
        speedup = _printed(default / profile) if profile > 0 else math.inf
        head = _printed(headline)
        return cls(
            default,
            profile,
            speedup,
            min(_printed(ci_low), speedup),
            max(_printed(ci_high), speedup),
            head,
            _printed(speedup / head) if head > 0 else math.inf,
            share_needed,
            max_slowdown_pct,
            default_ships,
        )

    @property
    def below_default(self) -> bool:
        """The whole CI is below 1 while the headline claims at least ORT's default's speed (a profile that is ORT's
        default claims nothing over it: two sessions of one configuration read 0.99x, CI 0.99-0.99, once)."""
        return not self.default_ships and _hundredths(self.headline) >= 100 and _hundredths(self.ci_high) < 100

    @property
    def reproduced(self) -> bool:
        return _hundredths(self.share) >= _hundredths(self.share_needed) and not self.below_default

    @property
    def floor(self) -> float | None:
        """The least CI upper end ``--max-slowdown`` allows (two decimals), None without it."""
        if self.max_slowdown_pct is None:
            return None
        return _printed(self.headline / (1 + self.max_slowdown_pct / 100))

    @property
    def passed(self) -> bool:
        """The ``--max-slowdown`` gate (True without one: ``--bench`` alone is a figure, not a gate)."""
        floor = self.floor
        return floor is None or _hundredths(self.ci_high) >= _hundredths(floor)

    @property
    def verdict(self) -> str:
        """``reproduced`` / ``not reproduced``; with ``--max-slowdown`` the gate's ``passes`` / ``fails``."""
        if self.max_slowdown_pct is not None:
            return "passes" if self.passed else "fails"
        return "reproduced" if self.reproduced else "not reproduced"

    @property
    def rule(self) -> str:
        """The rule the verdict follows, in one sentence, with this check's numbers."""
        reproduced = (
            f"reproduced when the speedup (ORT default p50 / profile p50) is at least {self.share_needed:.2f} of "
            + (
                "the profile's headline (the profile is ORT's default session: it claims no speed over it)"
                if self.default_ships
                else "the profile's headline and, for a headline of 1x or more, its 95% CI is not entirely below 1"
            )
        )
        if self.max_slowdown_pct is None:
            return reproduced
        return (
            f"--max-slowdown {self.max_slowdown_pct:g} passes when the CI's upper end is at least the headline / "
            f"{1 + self.max_slowdown_pct / 100:g} = {self.floor:.2f}x ({reproduced})"
        )

    @property
    def why(self) -> str:
        """Why this verdict, in the printed numbers."""
        if self.max_slowdown_pct is not None:
            return (
                f"{'passes' if self.passed else 'fails'}: CI upper end {self.ci_high:.2f}x "
                f"{'>=' if self.passed else '<'} {self.floor:.2f}x allowed ({self.max_slowdown_pct:g}% slowdown)"
            )
        if self.reproduced:
            return f"reproduced: {self.share:.2f} of the headline >= {self.share_needed:.2f}"
        reasons = []
        if _hundredths(self.share) < _hundredths(self.share_needed):
            reasons.append(f"{self.share:.2f} of the headline < {self.share_needed:.2f}")
        if self.below_default:
            reasons.append(
                f"the 95% CI {self.ci_low:.2f}-{self.ci_high:.2f} is entirely below 1 (slower than ORT's default "
                f"here) against a headline of {self.headline:.2f}x"
            )
        return "not reproduced: " + " and ".join(reasons)

    @property
    def figures(self) -> str:
        """The measurement in one clause: speedup, CI, both p50s, the headline and the share."""
        return (
            f"{self.speedup:.2f}x ORT's default here (p50 {ms_text(self.default_p50_ms)} ms / "
            f"{ms_text(self.profile_p50_ms)} ms; 95% CI {self.ci_low:.2f}-{self.ci_high:.2f}) against the "
            f"profile's headline {self.headline:.2f}x ({self.share:.2f} of it)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "speedup": self.speedup,
            "ci95": [self.ci_low, self.ci_high],
            "default_p50_ms": self.default_p50_ms,
            "profile_p50_ms": self.profile_p50_ms,
            "recorded_speedup": self.headline,
            "share_of_recorded": self.share,
            "share_needed": self.share_needed,
            "reproduced": self.reproduced,
            "verdict": self.verdict,
            "rule": self.rule,
        }


__all__ = ["REPRODUCED_SHARE", "SpeedupVerdict", "ms_text"]
