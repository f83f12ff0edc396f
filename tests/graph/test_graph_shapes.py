"""``graph.shapes.resolve_input_shapes``: dims with no sensible default are all named in one error."""

from __future__ import annotations

import pytest
from onnx import TensorProto

from ortpilot.errors import InputError, UsageError
from ortpilot.graph.shapes import InputInfo, resolve_input_shapes


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


def test_a_dim_two_inputs_share_must_get_one_size_and_a_dim_the_model_lacks_is_named():
    inputs = [
        InputInfo("input_ids", TensorProto.INT64, ("batch", "sequence")),
        InputInfo("attention_mask", TensorProto.INT64, ("batch", "sequence")),
    ]
    with pytest.raises(InputError, match="'sequence' is 8 in input_ids but 9 in attention_mask"):
        resolve_input_shapes(inputs, {"input_ids": (1, 8), "attention_mask": (1, 9)})
    with pytest.raises(InputError, match="'sequence' is 8 in --shape sequence but 9 in attention_mask"):
        resolve_input_shapes(inputs, {"sequence": (8,), "attention_mask": (1, 9)})
    shapes, dims = resolve_input_shapes(inputs, {"input_ids": (2, 8), "attention_mask": (2, 8)})
    assert shapes == {"input_ids": (2, 8), "attention_mask": (2, 8)} and dims == {"batch": 2, "sequence": 8}
    with pytest.raises(UsageError, match="seqence=8 names neither an input nor a symbolic dim.*batch, sequence"):
        resolve_input_shapes(inputs, {"seqence": (8,)})
