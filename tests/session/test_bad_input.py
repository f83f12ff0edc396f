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
        "profile": tmp_path / "profile.json",
    }
    cases["profile"].write_text('{\n  "format": "ortpilot-profile", "model": {"file": "model.onnx"}\n}\n')
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
    "profile": "is a JSON file, not an ONNX model. A tune's profile.json is loaded with ortpilot.load_profile",
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


def test_feeds_that_are_no_mapping_and_output_names_ort_cannot_take_are_explained(demo_paths):
    sess = ortpilot.load(demo_paths["mlp"])
    x = np.ones((1, 64), np.float32)
    with pytest.raises(ortpilot.InputError, match=r"must be a mapping of input name to array, got list: \{'x'"):
        sess.run(None, [x])  # was TypeError: unhashable type: 'numpy.ndarray'
    with pytest.raises(ortpilot.InputError, match=r"output names must be a list of names or None .* run\(\['y'\]"):
        sess.run("y", {"x": x})  # was pybind11's "incompatible function arguments"
    with pytest.raises(ortpilot.InputError, match="Unknown output name.*'zz'.*outputs are: y"):
        sess.run(["zz"], {"x": x})  # was "ORT rejected the inputs: ... Invalid output name:zz"
    assert sess.run(["y"], {"x": x})[0].shape == (1, 10)


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


def _static_model(path):
    """A static-shape model with two inputs, as detectors ship: image [1, 3, 32, 32] and scale [1, 2]."""
    from onnx import TensorProto, helper

    from ortpilot.modelio import DEFAULT_OPSET, SAFE_IR_VERSION

    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["image"], ["m"], keepdims=0),
            helper.make_node("Mul", ["scale", "m"], ["y"]),
        ],
        "static",
        [
            helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1, 2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
    model.ir_version = SAFE_IR_VERSION
    onnx.save(model, str(path))
    return path


def test_a_shape_error_names_every_bad_dim_of_every_input(tmp_path):
    """A batch of 96 at 64x64 was refused naming dim 0 only; fixed one dim, the next run named the next."""
    sess = ortpilot.load(_static_model(tmp_path / "static.onnx"))
    feeds = {"image": np.ones((96, 3, 64, 64), np.float32), "scale": np.ones((4, 2), np.float32)}
    with pytest.raises(ortpilot.InputError) as err:
        sess.check_feeds(feeds)
    message = str(err.value)
    assert "Input 'image' dim 0 must be 1 and dim 2 must be 32 and dim 3 must be 32 [1, 3, 32, 32]" in message
    assert "got shape [96, 3, 64, 64]" in message
    assert "Input 'scale' dim 0 must be 1 [1, 2], got shape [4, 2]." in message
    ok = {"image": np.ones((1, 3, 32, 32), np.float32), "scale": np.ones((1, 2), np.float32)}
    assert sess.run(None, ok)[0].shape == (1, 2)


def test_a_shape_option_that_contradicts_the_model_names_every_dim(tmp_path):
    path = _static_model(tmp_path / "static.onnx")
    result = CliRunner().invoke(cli, ["inspect", str(path), "--shape", "image=2x3x64x64", "--no-check"])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert (
        "--shape image sets dim 0 to 2 and dim 2 to 64 and dim 3 to 64, but the model fixes them at 1 and 32 and 32"
        in said
    )
