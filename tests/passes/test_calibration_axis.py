"""Calibration files read the way users hold them: a leading sample axis of the input's own rank."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortpilot.artifacts.atomic import save_model
from ortpilot.data import samples_phrase
from ortpilot.errors import InputError
from ortpilot.passes.calibration import load_calibration
from ortpilot.tuning.report import data_line
from ortpilot.tuning.request import TuneRequest
from ortpilot.tuning.tune import check_request

FEATURES = 2048


def byte_classifier(batch: int | str) -> onnx.ModelProto:
    """A byte-feature classifier: ``bytes`` [batch, 2048] -> ``scores`` [batch, 8]."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((FEATURES, 8)).astype(np.float32) * 0.02, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["bytes", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["scores"])],
        "bytes",
        [helper.make_tensor_value_info("bytes", TensorProto.FLOAT, [batch, FEATURES])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, 8])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def _rows(n: int) -> np.ndarray:
    return np.random.default_rng(1).random((n, FEATURES), dtype=np.float32)


def test_a_static_batch_of_one_reads_the_leading_axis_as_samples_not_a_refusal(tmp_path, caplog):
    calib = _npz(tmp_path / "calib.npz", bytes=_rows(96))
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        found = load_calibration(str(calib), byte_classifier(1))
    assert len(found) == 96 and found.samples[5]["bytes"].shape == (1, FEATURES)
    np.testing.assert_array_equal(found.samples[5]["bytes"][0], _rows(96)[5])
    assert "read as 96 samples of batch 1 (the model's batch)" in found.reading
    assert not [r for r in caplog.records if "Calibration data" in r.getMessage()]  # nothing ambiguous to say
    found.split()
    assert found.gate_data()["reading"] == found.reading and found.gate_data()["samples"] == 24


def test_a_dynamic_batch_without_shape_reads_samples_and_says_how_to_read_one_batch(tmp_path, caplog):
    calib = _npz(tmp_path / "calib.npz", bytes=_rows(96))
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        found = load_calibration(str(calib), byte_classifier("batch"))
    assert len(found) == 96 and found.samples[0]["bytes"].shape == (1, FEATURES)
    said = [r.getMessage() for r in caplog.records if "Calibration data" in r.getMessage()]
    assert len(said) == 1, said
    assert "read as 96 samples of batch 1" in said[0] and "--shape batch=96" in said[0]
    assert "(N, batch, ...)" in said[0] and "--shape batch=1 keeps this reading" in said[0]
    assert "could be one batch of 96 (--shape batch=96 reads it so)" in found.calibration_data()["reading"]


@pytest.mark.parametrize(
    ("shape", "count", "batch"),
    [("batch=96", 1, 96), ("batch=1", 96, 1), ("batch=8", 12, 8), ("bytes=1x2048", 96, 1), ("bytes=96x2048", 1, 96)],
)
def test_the_batch_asked_for_decides_the_reading_without_a_warning(tmp_path, caplog, shape, count, batch):
    name, _, dims = shape.partition("=")
    calib = _npz(tmp_path / "calib.npz", bytes=_rows(96))
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        found = load_calibration(
            str(calib), byte_classifier("batch"), shapes={name: tuple(int(d) for d in dims.split("x"))}
        )
    assert len(found) == count and {s["bytes"].shape for s in found.samples} == {(batch, FEATURES)}
    assert not [r for r in caplog.records if "Calibration data" in r.getMessage()]
    assert ("--shape's batch" in found.reading) == (count > 1)


def test_a_first_dim_that_fits_no_batch_asked_for_is_refused_naming_both(tmp_path):
    calib = _npz(tmp_path / "calib.npz", bytes=_rows(96))
    with pytest.raises(InputError) as err:
        load_calibration(str(calib), byte_classifier("batch"), shapes={"batch": (5,)})
    text = str(err.value)
    assert "first dim, 96" in text and "(5)" in text and "(N, 5, ...)" in text


def test_stacked_samples_one_sample_and_a_length_first_dim_read_as_before(tmp_path, caplog):
    stacked = _npz(tmp_path / "stacked.npz", bytes=_rows(96).reshape(96, 1, FEATURES))
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        found = load_calibration(str(stacked), byte_classifier("batch"))
        one = load_calibration(str(_npz(tmp_path / "one.npz", bytes=_rows(1))), byte_classifier("batch"))
    assert len(found) == 96 and found.reading == "" and "reading" not in found.gate_data()
    assert len(one) == 1 and one.reading == ""
    assert not [r for r in caplog.records if "Calibration data" in r.getMessage()]
    # a dynamic first dim named as a length is the sample's own dim: 500 frames are one sample
    frames = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["audio"], ["y"])],
            "frames",
            [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["frames", 80])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["frames", 80])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    audio = _npz(tmp_path / "audio.npz", audio=np.zeros((500, 80), np.float32))
    assert [s["audio"].shape for s in load_calibration(str(audio), frames).samples] == [(500, 80)]


def test_a_folder_of_such_files_warns_once_and_tune_reads_a_static_model_s_file(tmp_path, caplog):
    folder = tmp_path / "calib"
    folder.mkdir()
    for i in range(3):
        _npz(folder / f"part{i}.npz", bytes=_rows(4))
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        found = load_calibration(str(folder), byte_classifier("batch"))
    assert len(found) == 12
    assert len([r for r in caplog.records if "Calibration data" in r.getMessage()]) == 1
    # tune checks its request with the same loader: a static [1, 2048] model and a (96, 2048) file
    model = save_model(byte_classifier(1), tmp_path / "static.onnx")
    request = TuneRequest(model=str(model), calibration=str(_npz(tmp_path / "calib.npz", bytes=_rows(96))))
    _, _, given = check_request(request)
    assert len(given) == 96


def test_the_data_line_names_samples_in_words_with_the_reading():
    files = {"source": "files", "samples": 1, "total": 1, "path": "calib.npz", "sha256": "ab" * 32}
    assert samples_phrase(files) == "1 sample"
    assert samples_phrase({**files, "samples": 24, "total": 96}) == "24 of 96 samples"
    assert samples_phrase({"source": "text", "samples": 5, "total": 20}) == "5 of 20 text samples"
    assert samples_phrase({"source": "synthetic", "samples": 4}) == "4 synthetic samples"
    line = data_line(
        {
            "gate_data": {**files, "samples": 24, "total": 96, "reading": "calib.npz: the first dim (96) read as x"},
            "calibration_data": {**files, "samples": 72, "total": 96},
        }
    )
    assert line.startswith("Gate data: 24 of 96 samples from calib.npz (sha256 abababababab); calibration data: 72")
    assert "Read as: calib.npz: the first dim (96) read as x. The gate judges each output by its worst of 24" in line
    assert line.endswith(
        "is among them 21% of the time (299 show it 95 % of the time: give 1,196 or more real "
        "samples, a quarter is held out)."
    )
    assert "files samples" not in line


def test_magika_reads_a_file_of_byte_rows_as_samples(tmp_path, caplog, magika_path):
    # Magika's input is bytes [unk__214, 2048]: tf2onnx names the batch dim it could not name unk__N
    model = onnx.load(magika_path)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    calib = _npz(tmp_path / "calib.npz", bytes=np.random.default_rng(0).integers(0, 257, (96, FEATURES)).astype(dtype))
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        found = load_calibration(str(calib), model)
    assert len(found) == 96 and found.samples[0]["bytes"].shape == (1, FEATURES)
    said = [r.getMessage() for r in caplog.records if "Calibration data" in r.getMessage()]
    assert len(said) == 1 and "--shape unk__214=96" in said[0]
