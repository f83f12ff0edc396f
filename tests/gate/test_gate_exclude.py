"""The one auto-exclude loop and its schedules (``gate.exclude``).

The loop's own logic (which variants it tries, in which order, which one it keeps) is checked
here on a step whose "model" is the set of nodes it left in higher precision, judged by a gate
that passes once chosen nodes are among them; the real rankings and gates run in
tests/passes (INT8), tests/decode (weight-only) and tests/tuning (follow-ups).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortpilot.gate.core import ModelGate
from ortpilot.gate.exclude import Bisect, Layer, NoiseShare, Rounds, Try, auto_exclude, propose
from ortpilot.gate.result import Check, GateResult


@dataclass
class _Built:
    model: frozenset[str]


@dataclass
class _Step:
    excluded: list[str] = field(default_factory=list)

    def excluding(self, nodes):
        return _Step([*self.excluded, *(n for n in nodes if n not in self.excluded)])

    def build(self):
        return _Built(frozenset(self.excluded))


class _NeedsNodes:
    """Passes when every node of ``needed`` is in higher precision; the error is how many are missing."""

    def __init__(self, needed):
        self.needed = set(needed)

    def check(self, reference, candidate):
        missing = len(self.needed - candidate)
        return GateResult([Check("y", "missing", float(missing), 0.0, missing == 0)], 0.0)


class _Identity:
    def run(self, model, reference=None):
        return model


class _Fixed:
    def __init__(self, names, scores=None):
        self.layers = [
            Layer(n, (n,), float(len(names) - i) if scores is None else scores[i]) for i, n in enumerate(names)
        ]
        self.calls = 0

    def rank(self, attempt):
        self.calls += 1
        return self.layers


def _loop(needed, schedule, names="abcdefgh", max_tries=None):
    ranking = _Fixed(list(names))
    gate = ModelGate(_NeedsNodes(needed), _Identity(), None)
    return auto_exclude(_Step(), gate, ranking, schedule, max_tries=max_tries), ranking


def test_bisect_doubles_then_bisects_to_the_fewest_layers_that_pass():
    found, _ = _loop("abcde", Bisect())  # the five worst layers are needed
    assert [len(t.layers) for t in found.tries] == [0, 1, 2, 4, 8, 6, 5]
    assert found.passed and [layer.name for layer in found.best.layers] == list("abcde")


def test_bisect_keeps_a_layer_quantized_and_gives_up_past_its_cap():
    found, _ = _loop("abcdefgh", Bisect(keep=1))  # would need all 8: the float fallback may take 7
    assert [len(t.layers) for t in found.tries] == [0, 1, 2, 4, 7] and not found.passed
    assert found.best is found.tries[-1]
    capped, _ = _loop("abc", Bisect(max_layers=2))
    assert [len(t.layers) for t in capped.tries] == [0, 1, 2] and not capped.passed


def test_rounds_add_the_next_worst_each_try_and_stop_at_the_first_pass():
    found, ranking = _loop("abc", Rounds(per_round=2))
    assert [t.excluded for t in found.tries] == [[], ["a", "b"], ["a", "b", "c", "d"]]
    assert found.passed and found.best is found.tries[-1]
    assert found.worst_layers(2) == list(ranking.layers[4:6])


def test_max_tries_counts_the_first_try_and_one_try_ranks_nothing():
    found, ranking = _loop("abc", Rounds(per_round=1), max_tries=1)
    assert len(found.tries) == 1 and not found.passed and ranking.calls == 0
    limited, _ = _loop("abcdef", Rounds(per_round=1), max_tries=3)
    assert [t.excluded for t in limited.tries] == [[], ["a"], ["a", "b"]]


def test_a_passing_first_try_is_kept_without_ranking():
    found, ranking = _loop("", Bisect())
    assert len(found.tries) == 1 and found.passed and ranking.calls == 0


def _tune_try(error, limit=0.01, excluded=()):
    return Try(
        [Layer(n, (n,)) for n in excluded],
        list(excluded),
        GateResult.from_dict(
            {
                "passed": error <= limit,
                "max_error": limit,
                "worst_error": error,
                "outputs": [{"name": "y", "metric": "cosine", "error": error}],
            }
        ),
    )


def test_noise_share_takes_the_fewest_layers_that_close_the_gap_and_gives_up_when_hopeless():
    ranking = _Fixed([f"n{i}" for i in range(10)], [1.0] * 10)  # equal noise: 1 / (1 - k/10) >= 1.5 at k = 4
    chosen = propose(ranking, [_tune_try(0.015)], NoiseShare(within=4.0, margin=1.0))
    assert [layer.name for layer in chosen] == ["n0", "n1", "n2", "n3"]
    assert propose(ranking, [_tune_try(0.05)], NoiseShare(within=4.0)) is None  # 5x over the limit
    assert propose(ranking, [_tune_try(0.005)], NoiseShare()) is None  # at its aim (0.01 / 1.3)
    # within the limit but over the aim (half of it): the loop goes on, cutting the noise by 0.008 / 0.005
    chosen = propose(ranking, [_tune_try(0.008)], NoiseShare(within=4.0, margin=2.0))
    assert [layer.name for layer in chosen] == ["n0", "n1", "n2", "n3"]
    assert propose(ranking, [_tune_try(0.015), _tune_try(0.012, excluded=["n0"])], NoiseShare(), max_tries=2) is None
