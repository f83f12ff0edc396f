"""The INT8 step for OpenVINO (NNCF's QDQ model): what it refuses before NNCF runs. Its output on a real
OpenVINO session is checked in the plugin lane (tests/openvino_plugin)."""

from __future__ import annotations

import importlib.util

import pytest

from ortpilot.errors import UsageError
from ortpilot.graph.feeds import make_feeds
from ortpilot.models import make_encoder
from ortpilot.passes.openvino_int8 import OpenVINOInt8Pass, is_transformer
from ortpilot.passes.registry import Step


def test_the_step_builds_the_pass_with_its_label_and_options():
    step = Step("openvino_int8", {"exclude": ["a", "b"]})
    assert step.label() == "int8-openvino-x2"
    built = step.build(calibration=[{"x": 1}])
    assert isinstance(built, OpenVINOInt8Pass) and built.options()["nodes_to_exclude"] == ["a", "b"]
    assert is_transformer(make_encoder())


def test_it_needs_calibration_samples_and_names_the_extra_without_nncf():
    with pytest.raises(UsageError, match="calibrated"):
        OpenVINOInt8Pass().run(make_encoder())
    with pytest.raises(UsageError, match="Unknown model type"):
        OpenVINOInt8Pass(model_type="rnn")
    if importlib.util.find_spec("nncf") is not None:
        pytest.skip("NNCF is installed here: its absence is checked where it is not (the main run)")
    model = make_encoder()
    with pytest.raises(UsageError, match=r"ortpilot\[openvino-plugin\]"):
        OpenVINOInt8Pass(calibration=[make_feeds(model)]).run(model)


def test_quantize_mode_openvino_refuses_settings_nncf_does_not_take(tmp_path):
    from click.testing import CliRunner

    from ortpilot.cli.main import cli

    out = tmp_path / "q.onnx"
    result = CliRunner().invoke(
        cli, ["quantize", "demo:encoder", "-o", str(out), "--mode", "openvino", "--per-channel"]
    )
    assert result.exit_code == 2 and "--per-channel" in result.output and not out.exists()
    if importlib.util.find_spec("nncf") is None:
        result = CliRunner().invoke(cli, ["quantize", "demo:encoder", "-o", str(out), "--mode", "openvino"])
        assert result.exit_code == 2 and "openvino-plugin" in result.output and not out.exists()


def test_quantize_takes_the_openvino_recipe_flags_for_mode_openvino_only(tmp_path):
    from click.testing import CliRunner

    from ortpilot.cli.main import cli

    out = tmp_path / "q.onnx"
    for args, said in (
        (["--mode", "dynamic", "--smooth-quant", "0.8"], "--smooth-quant do(es) not apply"),
        (["--mode", "qdq", "--activation-ranges", "minmax"], "--activation-ranges do(es) not apply"),
        (["--mode", "openvino", "--smooth-quant", "1.5"], "0<=x<=1"),
        (["--mode", "openvino", "--activation-ranges", "mean"], "mean"),
    ):
        result = CliRunner().invoke(cli, ["quantize", "demo:encoder", "-o", str(out), *args])
        assert result.exit_code == 2 and said in result.output, (args, result.output)
        assert not out.exists()
