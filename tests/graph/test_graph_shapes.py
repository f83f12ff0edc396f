"""``graph.shapes.resolve_input_shapes``: dims with no sensible default are all named in one error."""

from __future__ import annotations

import pytest
from onnx import TensorProto

from ortpilot.errors import UsageError
from ortpilot.graph.shapes import InputInfo, check_shape_names, resolve_input_shapes


def test_every_dim_without_a_default_is_named_with_the_fix():
    inputs = [
        InputInfo("image", TensorProto.FLOAT, ("batch", 3, None, "width")),
        InputInfo("boxes", TensorProto.FLOAT, (None, 4)),
    ]
    with pytest.raises(UsageError) as err:
        resolve_input_shapes(inputs)
    message = str(err.value)
    assert "Input 'image' has dim 2 unnamed and dim 3 named 'width' with no sensible default" in message
    assert "--shape image=Nx3xNxN (or --shape width=N)" in message
    assert "Input 'boxes' has dim 0 unnamed with no sensible default. Fix it with --shape boxes=Nx4." in message
    shapes, _ = resolve_input_shapes(inputs, {"image": (1, 3, 64, 80), "boxes": (5, 4)})
    assert shapes == {"image": (1, 3, 64, 80), "boxes": (5, 4)}


def test_a_shape_naming_nothing_in_the_model_is_refused_where_one_model_is_run():
    inputs = [
        InputInfo("input_ids", TensorProto.INT64, ("batch", "sequence")),
        InputInfo("attention_mask", TensorProto.INT64, ("batch", "sequence")),
    ]
    with pytest.raises(UsageError, match="--shape seqence names neither an input nor a symbolic dim.*batch, sequence"):
        check_shape_names(inputs, {"seqence": (8,)})
    check_shape_names(inputs, {"sequence": (8,), "input_ids": (1, 8)})
    # bench --vs hands one --shape to every model: one without the dim resolves at its own defaults
    shapes, _ = resolve_input_shapes(inputs, {"height": (32,)})
    assert shapes == {"input_ids": (1, 128), "attention_mask": (1, 128)}
