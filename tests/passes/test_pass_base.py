"""The pass interface: change detection, sizes and hashes from one serialization, saving those bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ortpilot.artifacts.stamp import read_stamp, write_stamp
from ortpilot.modelio import load_model, model_sha256
from ortpilot.passes.base import Outcome, Pass, Pipeline, SourceModel
from ortpilot.session import load


class _Copy(Pass):
    name = "copy"

    def options(self) -> dict[str, Any]:
        return {}

    def transform(self, source: SourceModel) -> Outcome:
        out = onnx.ModelProto()
        out.CopyFrom(source.proto)
        return Outcome(out)


class _Scale(_Copy):
    """Doubles the first float initializer: same ops, a different graph."""

    name = "scale"

    def transform(self, source: SourceModel) -> Outcome:
        out = super().transform(source).model
        tensor = next(t for t in out.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * 2, tensor.name))
        return Outcome(out)


def test_changed_is_decided_by_the_graph_not_by_the_op_mix(demo_paths):
    assert not _Copy().run(demo_paths["mlp"]).changed
    scaled = _Scale().run(demo_paths["mlp"])
    assert scaled.changed and scaled.record.op_diff == {}


def test_sizes_hashes_and_saved_file_come_from_the_bytes_of_the_stamped_model(demo_paths, tmp_path):
    proto = load_model(demo_paths["mlp"])
    source = SourceModel.of(proto)
    assert (source.sha256, source.byte_size()) == (model_sha256(proto), proto.ByteSize())
    result = _Scale().run(source)
    assert result.record.size_before == proto.ByteSize()
    assert result.record.size_after == result.model.ByteSize() == len(result.serialized())
    assert result.serialized() == result.model.SerializeToString()  # the stamp is in the bytes
    out = result.save(tmp_path / "scaled.onnx")
    assert out.read_bytes() == result.model.SerializeToString()
    feeds = {"x": np.ones((1, 64), np.float32)}
    assert np.allclose(load(str(out)).run(None, feeds)[0], load(result.model.SerializeToString()).run(None, feeds)[0])


def test_a_result_restamped_after_run_saves_the_new_stamp(demo_paths, tmp_path):
    result = _Scale().run(demo_paths["mlp"])
    stale = result.serialized()
    write_stamp(result.model, dict(result.record.stamp, source_path="/elsewhere/model.onnx"))
    saved = load_model(result.save(tmp_path / "restamped.onnx"))
    assert read_stamp(saved)["source_path"] == "/elsewhere/model.onnx"
    assert result.serialized() != stale


def test_a_pipeline_hands_each_pass_the_hash_of_the_previous_output(demo_paths):
    proto = load_model(demo_paths["mlp"])
    first = _Scale().run(proto)
    piped = Pipeline([_Scale(), _Copy()]).run(proto)
    assert piped.records[1].stamp["source_sha256"] == model_sha256(first.model)
    assert piped.records[1].size_before == first.record.size_after
