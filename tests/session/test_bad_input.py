"""Bad models and bad feeds give one clear error with exit code 2, through the API and the CLI."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import ortpilot
from ortpilot.cli.main import cli
from ortpilot.graph.feeds import NaNInputWarning


def _run_cli(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def bad_models(tmp_path, demo_paths):
    good = demo_paths["mlp"].read_bytes()
    cases = {
        "missing": tmp_path / "nope.onnx",
        "empty": tmp_path / "empty.onnx",
        "text": tmp_path / "text.onnx",
        "truncated": tmp_path / "truncated.onnx",
        "external": tmp_path / "ext" / "model.onnx",
    }
    cases["empty"].write_bytes(b"")
    cases["text"].write_text("this is not a model\n" * 10)
    cases["truncated"].write_bytes(good[: len(good) // 2])
    model = onnx.load(str(demo_paths["mlp"]))
    cases["external"].parent.mkdir()
    onnx.save_model(model, str(cases["external"]), save_as_external_data=True, location="weights.bin", size_threshold=0)
    (cases["external"].parent / "weights.bin").unlink()
    return cases


EXPECT = {
    "missing": "does not exist",
    "empty": "empty",
    "text": "not a readable ONNX model",
    "truncated": "ONNX model",
    "external": "external data",
}


@pytest.mark.parametrize("case", sorted(EXPECT))
def test_bad_model_api(bad_models, case):
    with pytest.raises(ortpilot.ModelLoadError, match=EXPECT[case]):
        ortpilot.load(bad_models[case])


@pytest.mark.parametrize("case", sorted(EXPECT))
def test_bad_model_cli_exit_2_without_traceback(bad_models, case):
    result = _run_cli("run", str(bad_models[case]))
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert EXPECT[case] in result.output.replace("\n", " ")


def test_unknown_input_name(demo_paths):
    sess = ortpilot.load(demo_paths["mlp"])
    with pytest.raises(ortpilot.InputError, match="Unknown input name.*'z'.*x float32"):
        sess.run(None, {"z": np.ones((1, 64), np.float32)})


def test_wrong_dtype_after_first_run_is_still_explained(demo_paths):
    sess = ortpilot.load(demo_paths["mlp"])
    sess.run(None, {"x": np.ones((1, 64), np.float32)})
    with pytest.raises(ortpilot.InputError, match="must be float32, got float64"):
        sess.run(None, {"x": np.ones((1, 64), np.float64)})


def test_wrong_rank_and_fixed_dim(demo_paths):
    sess = ortpilot.load(demo_paths["mlp"])
    with pytest.raises(ortpilot.InputError, match="rank 2"):
        sess.run(None, {"x": np.ones((64,), np.float32)})
    with pytest.raises(ortpilot.InputError, match="dim 1 must be 64"):
        sess.check_feeds({"x": np.ones((1, 63), np.float32)})


def test_nan_input_warns_but_runs(demo_paths):
    sess = ortpilot.load(demo_paths["mlp"])
    x = np.ones((1, 64), np.float32)
    x[0, 3] = np.nan
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = sess.run(None, {"x": x})
    assert any(issubclass(w.category, NaNInputWarning) for w in caught)
    assert out[0].shape == (1, 10)


def test_cli_input_files_checked(tmp_path, demo_paths):
    good = tmp_path / "x.npy"
    np.save(good, np.ones((1, 64), np.float32))
    bad = tmp_path / "xi.npy"
    np.save(bad, np.ones((1, 64), np.int32))
    ok = _run_cli("run", str(demo_paths["mlp"]), "--input", f"x={good}", "--json")
    assert ok.exit_code == 0
    assert json.loads(ok.stdout)["outputs"][0]["shape"] == [1, 10]
    wrong = _run_cli("run", str(demo_paths["mlp"]), "--input", f"x={bad}")
    assert wrong.exit_code == 2 and "must be float32" in wrong.output
    unknown = _run_cli("run", str(demo_paths["mlp"]), "--input", f"q={good}")
    assert unknown.exit_code == 2 and "Unknown input" in unknown.output
    missing = _run_cli("run", str(demo_paths["mlp"]), "--input", f"x={tmp_path / 'none.npy'}")
    assert missing.exit_code == 2 and "does not exist" in missing.output
