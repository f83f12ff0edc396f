"""``ortpilot doctor`` through click: its JSON document and its tables."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ortpilot.cli.main import cli


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_doctor_json_is_valid_and_exit_0():
    result = _invoke("doctor", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) >= {
        "onnxruntime",
        "distributions",
        "plugins",
        "ep_devices",
        "probes",
        "cpu",
        "gpu",
        "findings",
        "exit_code",
    }


def test_doctor_human_output_has_tables():
    result = _invoke("doctor", "--no-probe")
    assert result.exit_code == 0
    assert "Findings" in result.stdout and "Providers" in result.stdout
