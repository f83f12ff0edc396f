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


def _strings(*texts: bytes) -> bytes:
    """BYTES elements as tritonclient's serialize_byte_tensor writes them: a 4-byte length, then the bytes."""
    return b"".join(len(t).to_bytes(4, "little") + t for t in texts)


def test_bytes_tensors_decode_from_json_binary_raw_and_typed_contents():
    import json

    from tritonclient.utils import serialize_byte_tensor

    from ortpilot.serve.oip.codec import decode_request

    texts = np.array([b"the cat", "é".encode(), b""], dtype=object)
    assert serialize_byte_tensor(texts).item() == _strings(*texts)  # the client's own serialization
    doc = {"inputs": [{"name": "text", "shape": [3, 1], "datatype": "BYTES", "data": [["the cat"], ["é"], [""]]}]}
    feeds = decode_request(json.dumps(doc).encode()).feeds
    assert feeds["text"].shape == (3, 1) and feeds["text"].ravel().tolist() == ["the cat", "é", ""]
    blob = _strings(*texts)
    head = json.dumps(
        {"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}]}
    ).encode()
    assert decode_request(head + blob, len(head)).feeds["text"].tolist() == list(texts)
    raw, _ = decode_infer(_request(("text", "BYTES", [3], None), raw=[blob]), 2**20)
    typed, _ = decode_infer(_request(("text", "BYTES", [3], ("bytes_contents", list(texts)))), 2**20)
    assert raw["text"].tolist() == typed["text"].tolist() == list(texts)


@pytest.mark.parametrize(
    ("blob", "shape", "words"),
    [
        (_strings(b"a"), [2**40], "needs 1099511627776 BYTES elements, more than its 5 bytes can hold"),
        (_strings(b"a", b"b") + b"x", [2], "has 1 bytes after its 2 BYTES element(s)"),
        ((9).to_bytes(4, "little") + b"abc", [1], "element 0 says it has 9 bytes, but 3 remain"),
    ],
)
def test_bytes_that_do_not_fit_their_shape_are_refused_before_anything_is_made(blob, shape, words):
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
        decode_infer(_request(("text", "BYTES", shape, None), raw=[blob]), 2**20)
