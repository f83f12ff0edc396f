"""``graph.outputs``: the op behind each output (through pass-through ops), its type and layout, the mask input."""

from __future__ import annotations

import numpy as np
import pytest
from metric_models import byte_classifier, three_outputs, token_model
from onnx import TensorProto, helper

from ortpilot.graph.outputs import OutputFacts, mask_input, output_facts, same_leading_dims
from ortpilot.modelio import SAFE_IR_VERSION
from ortpilot.models import make_decoder, make_encoder


def test_producers_are_found_behind_pass_through_ops():
    facts = {f.name: f for f in output_facts(three_outputs())}
    assert facts["embedding"].producer == "MatMul" and facts["embedding"].via == ()
    assert facts["p"].producer == "Softmax" and facts["p"].via == ("Identity",) and facts["p"].last_axis is True
    assert facts["ids_out"].producer == "" and facts["ids_out"].dtype == np.int64  # an input handed on
    assert facts["embedding"].dims == ("batch", 384) and facts["embedding"].floating


def test_a_softmax_over_another_axis_is_not_normalizing_the_last_one():
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4, 10])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = SAFE_IR_VERSION
    (facts,) = output_facts(model)
    assert facts.producer == "Softmax" and facts.last_axis is False


def test_mask_input_and_token_layout():
    enc, dec = make_encoder(), make_decoder()
    assert mask_input(enc).name == "attention_mask" and mask_input(token_model()).dims == ("batch", "sequence")
    assert mask_input(three_outputs()) is None
    hidden = output_facts(enc)[0]
    assert same_leading_dims(hidden.dims, mask_input(enc).dims)
    # the decoder's mask spans past + new tokens, its logits only the new ones: not laid out alike
    logits = next(f for f in output_facts(dec) if f.name == "logits")
    assert not same_leading_dims(logits.dims, mask_input(dec).dims)
    assert not same_leading_dims((None, None, 8), ("batch", "sequence"))  # unknown dims never match


def test_facts_of_an_array_alone():
    facts = OutputFacts.of_array("y", np.zeros((2, 3), np.int32))
    assert facts.dims == (2, 3) and not facts.floating and facts.describe_dims() == "[2, 3]"


@pytest.mark.parametrize(
    "kwargs,built",
    [
        ({}, ("ReduceMax", "Sub", "Exp", "ReduceSum", "Div")),
        ({"stable": False}, ("Exp", "ReduceSum", "Div")),
        ({"opset": 11}, ("ReduceMax", "Sub", "Exp", "ReduceSum", "Div")),  # axes as attributes
        ({"opset": 13}, ("ReduceMax", "Sub", "Exp", "ReduceSum", "Div")),  # ReduceSum's axes an input, ReduceMax's not
        ({"axis": 1}, ("ReduceMax", "Sub", "Exp", "ReduceSum", "Div")),  # the last axis of a rank-2 output, by number
    ],
)
def test_a_softmax_built_from_separate_ops_is_found_as_a_softmax_over_the_last_axis(kwargs, built):
    (facts,) = output_facts(byte_classifier(**kwargs))
    assert facts.producer == "Softmax" and facts.built_from == built and facts.last_axis is True


def test_an_exp_over_a_sum_along_another_axis_is_no_softmax_over_classes():
    (facts,) = output_facts(byte_classifier(axis=0))  # normalizes over the batch, not the classes
    assert facts.producer == "Div" and facts.built_from == () and facts.last_axis is None
