"""``gate.options.GateOptions``: what a command tells its accuracy gate (defaults, normalisation, checks, data)."""

from __future__ import annotations

import json

import pytest

from ortpilot.errors import UsageError
from ortpilot.gate.generation import DEFAULT_MIN_TOP1
from ortpilot.gate.options import DEFAULT_MAX_ROUNDS, DEFAULT_NEW_TOKENS, GateOptions, gate_keywords
from ortpilot.models import make_mlp


def test_defaults_and_normalisation():
    gate = GateOptions()
    assert gate.max_error is None and gate.metric == () and gate.outputs == () and not gate.auto_exclude
    assert gate.max_rounds == DEFAULT_MAX_ROUNDS and gate.new_tokens == DEFAULT_NEW_TOKENS
    assert gate.min_top1 == DEFAULT_MIN_TOP1 and gate.generation_gate().min_top1 == DEFAULT_MIN_TOP1
    assert GateOptions(metric="cosine", outputs=["y"]) == GateOptions(metric=["cosine"], outputs=("y",))
    assert GateOptions(max_error=1).max_error == 1.0
    # the loop rescues only with a limit to work towards
    assert not GateOptions(auto_exclude=True).rescue and GateOptions(auto_exclude=True, max_error=0.1).rescue


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"max_error": -0.1}, "--max-error must be >= 0"),
        ({"max_rounds": 0}, "--max-rounds must be"),
        ({"new_tokens": 0}, "--new-tokens must be"),
        ({"min_top1": 1.5}, "--min-top1 must be between"),
    ],
)
def test_bad_values_are_usage_errors(fields, said):
    with pytest.raises(UsageError, match=said):
        GateOptions(**fields)


def test_to_dict_round_trips_and_keeps_only_a_calibration_path(tmp_path):
    gate = GateOptions(max_error=0.05, metric=["y=cosine"], calibration=tmp_path, auto_exclude=True, tokenizer="t.json")
    doc = json.loads(json.dumps(gate.to_dict()))
    assert doc["calibration"] == str(tmp_path) and GateOptions.from_dict(doc) == gate
    assert GateOptions(calibration=[{"x": 0}]).to_dict()["calibration"] is None  # arrays do not travel
    with pytest.raises(UsageError, match="unknown fields: colour"):
        GateOptions.from_dict({"colour": "red"})


def test_gate_keywords_takes_the_record_or_its_fields():
    gate, rest = gate_keywords(None, {"max_error": 0.1, "per_channel": True})
    assert gate == GateOptions(max_error=0.1) and rest == {"per_channel": True}
    given = GateOptions(auto_exclude=True)
    assert gate_keywords(given, {"per_channel": True}) == (given, {"per_channel": True})
    with pytest.raises(UsageError, match="not both"):
        gate_keywords(given, {"max_error": 0.1})


def test_the_output_gate_takes_the_metric_and_a_default_limit():
    model = make_mlp()
    gate = GateOptions(metric="cosine").output_gate(model, default=0.01)
    assert gate.max_error == 0.01 and {c.metric for c in gate.choices.values()} == {"cosine"}
    assert GateOptions(max_error=0.2).output_gate(model, default=0.01).max_error == 0.2
    with pytest.raises(UsageError):
        GateOptions(metric="nope").output_gate(model)
