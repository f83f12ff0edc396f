"""``graph.shapes.resolve_input_shapes``: dims with no sensible default are all named in one error."""

from __future__ import annotations

import pytest
from onnx import TensorProto

from ortpilot.errors import UsageError
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
