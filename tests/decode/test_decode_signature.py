"""Signature detection: the usual names, stacked caches, explicit mappings, clear refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ortpilot.decode import Generator, detect_signature
from ortpilot.errors import UsageError


def test_demo_decoder_roles(demo_decoder: onnx.ModelProto) -> None:
    sig = detect_signature(demo_decoder)
    assert (sig.input_ids, sig.attention_mask, sig.position_ids, sig.logits) == (
        "input_ids",
        "attention_mask",
        "position_ids",
        "logits",
    )
    assert [(c.past, c.present) for c in sig.cache[:2]] == [
        ("past_key_values.0.key", "present.0.key"),
        ("past_key_values.0.value", "present.0.value"),
    ]
    assert len(sig.cache) == 4 and sig.cache[0].seq_axis == 2 and sig.kv_dtype == np.float32
    assert sig.vocab_size == 256 and sig.max_positions == 2048
    assert not sig.supports_shared_buffer and sig.gqa_nodes == 0


def test_fused_decoder_supports_shared_buffer(fused_decoder: onnx.ModelProto) -> None:
    sig = detect_signature(fused_decoder)
    assert sig.gqa_nodes == 2 and sig.supports_shared_buffer and not sig.gqa_reads_mask


def _stacked_model() -> onnx.ModelProto:
    """GPT-2 style: past_0 [2, batch, heads, past, dim] -> present_0, concatenated on axis 3."""
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["h"]),
        helper.make_node("MatMul", ["h", "head"], ["logits"]),
        helper.make_node("Unsqueeze", ["h", "axes"], ["h5"]),
        helper.make_node("Reshape", ["h5", "kvshape"], ["kv"]),
        helper.make_node("Expand", ["kv", "two"], ["kv2"]),
        helper.make_node("Concat", ["past_0", "kv2"], ["present_0"], axis=3),
    ]
    rng = np.random.default_rng(0)
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "emb"),
        onnx.numpy_helper.from_array(rng.standard_normal((4, 16)).astype(np.float32), "head"),
        onnx.numpy_helper.from_array(np.array([0], dtype=np.int64), "axes"),
        onnx.numpy_helper.from_array(np.array([1, 0, 1, -1, 4], dtype=np.int64), "kvshape"),
        onnx.numpy_helper.from_array(np.array([2, 1, 1, 1, 1], dtype=np.int64), "two"),
    ]
    graph = helper.make_graph(
        nodes,
        "stacked",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("past_0", TensorProto.FLOAT, [2, "batch", 1, "past_seq", 4]),
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 16]),
            helper.make_tensor_value_info("present_0", TensorProto.FLOAT, [2, "batch", 1, "total", 4]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_stacked_past_is_detected_and_runs() -> None:
    model = _stacked_model()
    sig = detect_signature(model)
    (entry,) = sig.cache
    assert (entry.past, entry.present, entry.seq_axis, entry.batch_axis) == ("past_0", "present_0", 3, 1)
    gen = Generator(model)
    plain = gen.generate([1, 2, 3], 5, "plain")
    assert gen.generate([1, 2, 3], 5, "bound").tokens == plain.tokens
    assert plain.kv_cache_bytes == 2 * 1 * 1 * (3 + 4) * 4 * 4


def test_explicit_mapping(demo_decoder: onnx.ModelProto) -> None:
    model = onnx.ModelProto()
    model.CopyFrom(demo_decoder)
    for node in model.graph.node:
        node.input[:] = ["tok" if i == "input_ids" else i for i in node.input]
        node.output[:] = ["out" if o == "logits" else o for o in node.output]
    model.graph.input[0].name = "tok"
    model.graph.output[0].name = "out"
    with pytest.raises(
        UsageError, match=r"no input_ids found \(found: .*logits=out; 4 past/present pair\(s\)\). Inputs: tok"
    ):
        detect_signature(model)
    sig = detect_signature(model, {"input_ids": "tok", "logits": "out"})
    assert sig.input_ids == "tok" and sig.logits == "out" and len(sig.cache) == 4
    with pytest.raises(UsageError, match="no such input"):
        detect_signature(model, {"input_ids": "nope"})


def test_non_decoder_names_what_is_missing() -> None:
    from ortpilot.models import make_mlp

    with pytest.raises(UsageError, match="does not look like a decoder: no input_ids.*Inputs: x"):
        detect_signature(make_mlp())


def test_past_without_present_is_refused(demo_decoder: onnx.ModelProto) -> None:
    model = onnx.ModelProto()
    model.CopyFrom(demo_decoder)
    model.graph.output[1].name = "renamed"
    with pytest.raises(UsageError, match="past_key_values.0.key have no matching present"):
        detect_signature(model)


def test_symbolic_head_dim_needs_a_number(demo_decoder: onnx.ModelProto) -> None:
    model = onnx.ModelProto()
    model.CopyFrom(demo_decoder)
    for vi in list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if "past" in vi.name or "present" in vi.name:
            dims[3].dim_param = "kv_dim"
    with pytest.raises(UsageError, match="--map DIM=VALUE"):
        detect_signature(model)
    sig = detect_signature(model, {"kv_dim": "16"})
    assert sig.cache[0].dims == ("batch", 2, "past_sequence", 16)
    assert (
        Generator(model, mapping={"kv_dim": "16"}).generate([1, 2], 3, "bound").tokens
        == Generator(demo_decoder).generate([1, 2], 3, "plain").tokens
    )
