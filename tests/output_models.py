"""The demo encoder with the outputs a real export often has besides ``last_hidden_state`` (tests of ``--outputs``).

- ``hidden_state_1``: layer 0's output (an intermediate tensor exported as an output): pruning to it
  drops layer 1 entirely;
- ``pooler_output``: a pooler head (mean over the sequence, dense, tanh) that only it needs: pruning
  to ``last_hidden_state`` drops it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortpilot.artifacts.atomic import save_model
from ortpilot.models import demo_model_path

LAYER0 = "encoder.layer.0.output.LayerNorm/LayerNormalization"
OUTPUTS = ["last_hidden_state", "pooler_output", "hidden_state_1"]


def encoder_with_heads() -> onnx.ModelProto:
    model = onnx.load(demo_model_path("encoder"))
    out = next(o for o in model.graph.output if o.name == "last_hidden_state")
    hidden = out.type.tensor_type.shape.dim[2].dim_value
    rng = np.random.default_rng(0)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array((rng.standard_normal((hidden, hidden)) * 0.1).astype(np.float32), "pooler.W"),
            numpy_helper.from_array(np.array([1], np.int64), "pooler.axes"),
        ]
    )
    model.graph.node.extend(
        [
            helper.make_node("ReduceMean", ["last_hidden_state", "pooler.axes"], ["pooler/mean"], keepdims=0),
            helper.make_node("MatMul", ["pooler/mean", "pooler.W"], ["pooler/dense"]),
            helper.make_node("Tanh", ["pooler/dense"], ["pooler_output"]),
            helper.make_node("Identity", [LAYER0], ["hidden_state_1"]),
        ]
    )
    model.graph.output.extend(
        [
            helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["batch", hidden]),
            helper.make_tensor_value_info("hidden_state_1", TensorProto.FLOAT, ["batch", "sequence", hidden]),
        ]
    )
    onnx.checker.check_model(model)
    return model


def write_encoder_with_heads(path: Path) -> Path:
    save_model(encoder_with_heads(), path)
    return path
