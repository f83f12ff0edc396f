"""serve.oip.codec and the gRPC codec of serve.oip.grpc_service: KServe v2 messages <-> numpy with the
REST codec's checks, and the metadata messages, without a server."""

from __future__ import annotations

import numpy as np
import pytest

from ortpilot.errors import InputError
from ortpilot.serve.oip.config import TensorSpec
from ortpilot.serve.oip.grpc_codec import decode_infer, encode_infer, messages, model_metadata

pytest.importorskip("tritonclient.grpc")


def _request(*tensors, raw: list[bytes] | None = None, outputs: tuple[str, ...] = ()):
    pb = messages()
    req = pb.ModelInferRequest(model_name="m")
    for name, datatype, shape, values in tensors:
        tensor = req.inputs.add(name=name, datatype=datatype, shape=shape)
        if values is not None:
            getattr(tensor.contents, values[0]).extend(values[1])
    for data in raw or ():
        req.raw_input_contents.append(data)
    for name in outputs:
        req.outputs.add(name=name)
    return req


def test_raw_and_typed_contents_decode_to_the_same_arrays():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw, wanted = decode_infer(_request(("x", "FP32", [2, 3], None), raw=[x.tobytes()], outputs=("y",)), 1 << 20)
    typed, none = decode_infer(_request(("x", "FP32", [2, 3], ("fp32_contents", x.ravel().tolist()))), 1 << 20)
    np.testing.assert_array_equal(raw["x"], x)
    np.testing.assert_array_equal(typed["x"], x)
    assert wanted == ["y"] and none is None


@pytest.mark.parametrize(
    "req, words",
    [
        (_request(("x", "FP32", [2], None), raw=[b"\0" * 4]), "needs 8"),
        (_request(("x", "FP32", [2], None), ("y", "FP32", [1], None), raw=[b"\0" * 8]), "raw_input_contents"),
        (_request(("x", "FP99", [1], None)), "FP99"),
        (_request(("x", "FP32", [-1], None)), "non-negative"),
        (_request(("x", "FP32", [1 << 20], None)), "over the limit"),
        (_request(("x", "INT32", [3], ("int_contents", [1, 2]))), "needs 3"),
        (_request(("x", "FP16", [1], None)), "raw_input_contents"),
    ],
)
def test_bad_messages_are_input_errors_naming_the_problem(req, words):
    with pytest.raises(InputError, match=words):
        decode_infer(req, 1 << 20)


def test_outputs_go_back_raw_in_order_and_metadata_from_the_tensor_records():
    y, z = np.ones((1, 2), np.float32), np.array([[3]], np.int64)
    answer = encode_infer("m", {"y": y, "z": z}, "id-1")
    assert [o.name for o in answer.outputs] == ["y", "z"] and answer.id == "id-1"
    assert [o.datatype for o in answer.outputs] == ["FP32", "INT64"]
    assert np.frombuffer(answer.raw_output_contents[1], np.int64).tolist() == [3]
    meta = model_metadata("m", (TensorSpec("x", "FP32", (-1, 64)),), (TensorSpec("y", "FP32", (-1, 10)),))
    assert meta.inputs[0].name == "x" and list(meta.inputs[0].shape) == [-1, 64] and meta.versions == ["1"]
