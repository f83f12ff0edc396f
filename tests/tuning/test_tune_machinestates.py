"""A tune that saw the machine in two speed states picks by the worse state's speedup and records both.

The figures are the ones measured on this project's 2-core VM (BENCHMARKS.md, "Two machine states"): ORT's
default on the demo encoder at 0.444 ms (fast) or 0.757 ms (slow); the fused INT8 winner 1.18x fast and
1.38x slow, plain INT8 1.24x in both.
"""

from __future__ import annotations

import pytest

from ortpilot.tuning.candidate import baseline_candidate
from ortpilot.tuning.machinestates import FAST, SLOW, TuneStates, cut, state_of
from ortpilot.tuning.search import Entry, speedup
from ortpilot.tuning.tune import _pick, _relative_cost

ROUNDS = 8
RUNS = 6  # per candidate per final round


def _final(p50_ms: float) -> tuple[list[float], list[int]]:
    samples = [p50_ms / 1e3] * (ROUNDS * RUNS)
    return samples, [i // RUNS for i in range(ROUNDS * RUNS)]


def _entry(threads: int, search_speedup: float, default_ms: float, final_ms: float | None) -> Entry:
    """A candidate benched once beside ORT's default at ``default_ms`` (gaining ``search_speedup`` there) and,
    with ``final_ms``, timed in the final."""
    cand = baseline_candidate().with_settings(intra_op_threads=threads)
    ms = default_ms / search_speedup
    e = Entry(
        cand, "halving", status="ok", samples=[ms / 1e3] * 10, paired=[(1 / search_speedup, 10, default_ms / 1e3)]
    )
    if final_ms is not None:
        e.final, e.final_blocks = _final(final_ms)
    return e


def _default(final_ms: float) -> Entry:
    e = Entry(baseline_candidate(), "baseline", status="ok", samples=[final_ms / 1e3] * 10, anchor=True)
    e.final, e.final_blocks = _final(final_ms)
    return e


def _tune(search_default_ms: float) -> tuple[Entry, Entry, Entry]:
    """Searched with ORT's default at ``search_default_ms``, the final in the slow state (0.757 ms)."""
    default = _default(0.757)
    fast = search_default_ms < 0.6
    fused = _entry(1, 1.18 if fast else 1.38, search_default_ms, 0.757 / 1.38)
    plain = _entry(2, 1.24, search_default_ms, 0.757 / 1.24)
    fused.paired *= 2  # benched twice in the search (screen, halving): three benches there in all
    return default, fused, plain


def test_a_tune_that_saw_two_states_picks_the_winner_whose_worse_state_is_better():
    default, fused, plain = _tune(search_default_ms=0.444)
    states = TuneStates.read([default, fused, plain], default)
    assert states.between_s == pytest.approx((0.444 + 0.757) / 2e3, rel=0.05)
    assert states.worst(fused) == pytest.approx(1.18, rel=1e-6) and states.worst(plain) == pytest.approx(1.24)
    assert set(states.figures[fused.candidate.id]) == {FAST, SLOW}
    assert states.figures[fused.candidate.id][SLOW].speedup == pytest.approx(1.38)
    # the final alone (all in the slow state) would ship the fused model at 1.38x, 1.18x in the fast state
    assert speedup(default, fused, "p50")["ratio"] > speedup(default, plain, "p50")["ratio"]
    winner, default_best, _ = _pick([fused, plain, default], default, "p50", states)
    assert winner is plain and not default_best
    assert _relative_cost(fused, default, "p50", states) == pytest.approx(1 / 1.18)


def test_a_tune_in_one_state_picks_by_the_final_as_before():
    default, fused, plain = _tune(search_default_ms=0.757)
    states = TuneStates.read([default, fused, plain], default)
    assert states.between_s is None and states.figures == {} and states.worst(fused) is None
    winner, _, _ = _pick([fused, plain, default], default, "p50", states)
    assert winner is fused


def test_the_cut_needs_enough_benches_and_a_gap_over_the_state_change():
    assert cut([]) is None
    assert cut([0.444e-3] * 2 + [0.757e-3] * 8) is None  # too few benches in the fast state to call it one
    assert cut([0.444e-3] * 5 + [0.50e-3] * 5) is None  # within 1.2x: one state
    assert cut([0.444e-3] * 5 + [0.757e-3] * 5) == pytest.approx((0.444e-3 + 0.757e-3) / 2)
    # a noisy machine's spread in one state: 10th/90th percentile 1.3x apart, the halves' medians less than 1.2x
    noisy = [x * 1e-3 for x in (0.40, 0.42, 0.44, 0.45, 0.46, 0.47, 0.48, 0.50, 0.52, 0.56)]
    assert cut(noisy) is None


def test_verify_reads_the_state_nearest_its_own_default():
    figures = {FAST: {"default_p50_ms": 0.444}, SLOW: {"default_p50_ms": 0.757}}
    assert state_of(0.47, figures) == FAST and state_of(0.70, figures) == SLOW
