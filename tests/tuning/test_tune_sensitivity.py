"""The tuner's dynamic-INT8 follow-ups (layers ranked by ``passes.sensitivity``) and attention shapes from a graph.

The ranking itself is tested in tests/passes/test_passes_sensitivity.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortpilot.modelio import load_model
from ortpilot.tuning import tune
from ortpilot.tuning.search import int8_margin
from ortpilot.tuning.transform import attention_dims


def test_attention_dims_reads_heads_from_a_minus_one_reshape():
    hidden, head = 64, 16
    w = numpy_helper.from_array(np.zeros((hidden, hidden), np.float32), "wq")
    b = numpy_helper.from_array(np.zeros((hidden,), np.float32), "bq")
    tail = numpy_helper.from_array(np.array([-1, head], np.int64), "tail")
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q0"]),
        helper.make_node("Add", ["q0", "bq"], ["q"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["bs"]),
        helper.make_node("Concat", ["bs", "tail"], ["new_shape"], axis=0),
        helper.make_node("Reshape", ["q", "new_shape"], ["q4"]),
        helper.make_node("Transpose", ["q4"], ["y"], perm=[0, 2, 1, 3]),
    ]
    inits = [
        w,
        b,
        tail,
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([2], np.int64), "two"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    assert attention_dims(model) == (hidden // head, hidden)
    del model.graph.node[-1]  # no attention-style transpose: nothing to read
    assert attention_dims(model) == (0, 0)


def _first_dynamic_error(result):
    """The gate error of the first dynamic INT8 variant the search measured (the space orders them by CPU)."""
    return next(
        e.accuracy["worst_error"]
        for e in result.entries
        if e.accuracy
        and e.candidate.passes
        and e.candidate.passes[-1].get("mode") == "dynamic"
        and not e.candidate.passes[-1].get("exclude")
    )


@pytest.fixture(scope="module")
def first_dynamic_error(tmp_path_factory, demo_paths) -> float:
    """What this CPU's first dynamic variant of the demo encoder reaches (its INT8 kernels, and so its error,
    depend on the ISA: exact with VNNI, 7-bit weights without it). A budget with room for the first variants on
    a slow 2-core CPU (10 s measured only the default there)."""
    probe = tune(
        str(demo_paths["encoder"]),
        tmp_path_factory.mktemp("probe") / "out",
        budget_s=16,
        max_error=1.0,
        session_knobs=False,
    )
    return _first_dynamic_error(probe)


def test_int8s_aim_loosens_from_half_the_limit_to_1_over_1_6_as_more_samples_are_held_out():
    assert int8_margin(0) == int8_margin(50) == 2.0
    assert int8_margin(299) == int8_margin(5000) == 1.6
    assert 1.6 < int8_margin(100) < 2.0 and int8_margin(100) > int8_margin(200)


def test_an_int8_variant_within_the_limit_but_over_half_of_it_is_rejected_and_followed_up(
    tmp_path, demo_paths, first_dynamic_error
):
    limit = first_dynamic_error * 1.5  # the variant passes the gate, at 2/3 of the limit
    result = tune(str(demo_paths["encoder"]), tmp_path / "out", budget_s=24, max_error=limit, session_knobs=False)
    first = next(
        e
        for e in result.entries
        if e.accuracy
        and e.candidate.passes
        and e.candidate.passes[-1].get("mode") == "dynamic"
        and not e.candidate.passes[-1].get("exclude")
    )
    assert first.accuracy["passed"] and first.status == "rejected", (first.status, first.reason)
    assert f"is within {limit:g} but over {limit / 2:.3g}, where an INT8 variant must be" in first.reason
    shipped = [e for e in result.entries if e.status == "ok" and e.candidate.passes and e.accuracy]
    int8 = [e for e in shipped if e.candidate.passes[-1].name == "quantize"]
    assert all(e.accuracy["worst_error"] <= limit / 2 for e in int8), [(e.candidate.label, e.accuracy) for e in int8]
    assert any(e.candidate.passes[-1].get("exclude") for e in result.entries if e.candidate.passes), [
        (e.candidate.label, e.status) for e in result.entries
    ]


def test_a_dynamic_variant_just_over_the_gate_is_retried_with_its_worst_layers_in_float(
    tmp_path, demo_paths, first_dynamic_error
):
    # The limit sits just under what this CPU's first dynamic variant reaches.
    limit = first_dynamic_error / 2
    result = tune(str(demo_paths["encoder"]), tmp_path / "out", budget_s=24, max_error=limit, session_knobs=False)
    # The follow-ups (the fusion knob around a follow-up carries its exclusions too, under another prefix)
    follow = [
        e
        for e in result.entries
        if e.phase == "model variants" and e.candidate.passes and e.candidate.passes[-1].get("exclude")
    ]
    assert follow, [(e.candidate.label, e.status, e.reason) for e in result.entries]

    def parent(entry):
        step = entry.candidate.passes[-1]
        return next(
            e
            for e in result.entries
            if e.candidate.passes
            and e.candidate.passes[:-1] == entry.candidate.passes[:-1]
            and e.candidate.passes[-1] == {k: v for k, v in step.items() if k != "exclude"}
        )

    for entry in follow:
        assert parent(entry).status == "rejected" and "-x" in entry.candidate.label
    # On a loaded machine the budget can end before a follow-up is measured; one must have been.
    measured = [e for e in follow if e.accuracy]
    assert measured, [(e.candidate.label, e.status, e.reason) for e in follow]
    for entry in measured:
        assert entry.accuracy["worst_error"] < parent(entry).accuracy["worst_error"]
    for entry in follow:  # the layers named stay float ops in the model the follow-up built
        if entry.status in ("ok", "rejected"):
            ops = {n.name: n.op_type for n in load_model(entry.prepared["model_path"]).graph.node}
            assert {ops.get(name) for name in entry.candidate.passes[-1]["exclude"]} <= {"MatMul", "Attention"}
