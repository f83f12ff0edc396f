"""``ortpilot.api``: the functions behind commands take records, or the records' fields as keywords."""

from __future__ import annotations

import pytest

from ortpilot import api
from ortpilot.errors import UsageError
from ortpilot.gate.options import GateOptions
from ortpilot.passes.options import DecoderFusionOptions, QuantizeOptions
from ortpilot.session import SessionSettings


def test_quantize_gated_takes_the_records_or_their_fields(demo_paths):
    model = str(demo_paths["mlp"])
    by_records = api.quantize_gated(model, None, QuantizeOptions(per_channel=True), GateOptions(max_error=1.0))
    by_keywords = api.quantize_gated(model, None, "dynamic", per_channel=True, max_error=1.0)
    assert by_records.gate.error == by_keywords.gate.error and by_records.gate.passed
    assert by_records.record.options == by_keywords.record.options
    with pytest.raises(UsageError, match="not both"):
        api.quantize_gated(model, None, QuantizeOptions(), per_channel=True)
    with pytest.raises(UsageError, match="GateOptions or its fields"):
        api.quantize_gated(model, None, "dynamic", GateOptions(), max_error=1.0)
    with pytest.raises(UsageError, match="--block-size do"):
        api.quantize_gated(model, None, "dynamic", block_size=64)
    with pytest.raises(UsageError, match="does not take it"):
        api.quantize_gated(model, None, "dynamic", fusion=DecoderFusionOptions())


def test_compare_takes_its_gate_and_refuses_what_only_quantize_and_tune_read(demo_paths):
    model = str(demo_paths["mlp"])
    result = api.compare(model, model, gate=GateOptions(metric="cosine"), n_samples=2)
    assert result.samples == 2 and {o.metric for o in result.outputs} == {"cosine"}
    with pytest.raises(UsageError, match="max_error, outputs of its gate options"):
        api.compare(model, model, max_error=0.1, outputs=["y"])


def test_bench_config_sizes_generated_inputs_by_the_free_dimension_overrides(demo_paths):
    settings = SessionSettings(free_dimension_overrides=api.free_dims({"batch": "4"}))
    config = api.bench_config(str(demo_paths["mlp"]), settings, shapes=["x=2x64"])
    assert config.shapes == {"x": (2, 64), "batch": (4,)} and config.settings is settings
    with pytest.raises(UsageError, match="--free-dim batch=x: the value must be an integer"):
        api.free_dims({"batch": "x"})
    with pytest.raises(UsageError, match="Concurrency must be between"):
        api.bench_config(str(demo_paths["mlp"]), concurrency=0)
