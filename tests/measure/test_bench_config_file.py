"""The ``bench --configs`` file and the ``--baseline`` checks made before measuring, read as the library reads them."""

from __future__ import annotations

import json

import pytest

from ortpilot.errors import UsageError
from ortpilot.measure.config_file import ConfigEntry, read_config_file
from ortpilot.measure.regression import prepare_baseline


def test_entries_are_flag_strings_or_named_flags_in_order(tmp_path) -> None:
    path = tmp_path / "configs.json"
    path.write_text(json.dumps({"configs": ["--threads 1", {"name": "two", "flags": "--threads 2"}, {"name": "n"}]}))
    assert read_config_file(str(path)) == [
        ConfigEntry(None, "--threads 1"),
        ConfigEntry("two", "--threads 2"),
        ConfigEntry("n", ""),
    ]


@pytest.mark.parametrize(
    "text,message",
    [
        ("[1]", "--configs entry 0 must be a flag string"),
        ('[{"flags": "--threads 1", "runs": 3}]', "--configs entry 0 must be a flag string"),
        ('{"other": []}', "must hold a list of configurations"),
        ("not json", "is not valid JSON"),
    ],
)
def test_anything_else_is_refused_naming_it(tmp_path, text, message) -> None:
    path = tmp_path / "configs.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        read_config_file(str(path))
    with pytest.raises(UsageError, match="does not exist"):
        read_config_file(str(tmp_path / "missing.json"))


def test_baseline_checks_come_before_measuring(tmp_path) -> None:
    assert prepare_baseline(None, None, ["a.onnx"]) is None
    with pytest.raises(UsageError, match="--max-slowdown needs --baseline"):
        prepare_baseline(None, "10", ["a.onnx"])
    with pytest.raises(UsageError, match="--baseline needs --max-slowdown"):
        prepare_baseline("old.json", None, ["a.onnx"])
    with pytest.raises(UsageError, match="two configurations at most"):
        prepare_baseline("old.json", "10", ["a.onnx", "b.onnx", "c.onnx"])
    saved = tmp_path / "old.json"
    saved.write_text(json.dumps({"kind": "bench", "latency": {"p50_ms": 1.0, "median_ci95_ms": [0.9, 1.1]}}))
    baseline = prepare_baseline(str(saved), "10", ["not-a-file.onnx"])
    assert baseline is not None and baseline.max_slowdown_pct == 10.0 and baseline.saved["latency"]["p50_ms"] == 1.0
