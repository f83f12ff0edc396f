"""What the graph says about each output: its element type, its declared dims, the op that makes it.

An accuracy gate must know what an output *is* before it can say how to compare it: class
scores (top-1), vectors (cosine), integers passed through (exactly), token-level values under an
attention mask. Shape alone cannot tell a pooled sentence embedding ``[batch, 384]`` from class
scores ``[batch, 384]``; the op that produced it can. ``output_facts`` follows each output back
through ops that only move or retype values (Identity, Reshape, Cast, ...) to the op that
computed it; ``mask_input`` finds the input that marks real tokens; ``same_leading_dims`` says
whether an output is laid out like that mask (``[batch, sequence, ...]``). Static facts only:
the metric choice that reads them is ``measure.metrics``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from ortpilot.graph.shapes import InputInfo, graph_inputs, value_dims

# Ops that hand a value on without computing a new one: the producer is looked for behind them.
PASSTHROUGH_OPS = frozenset(
    {"Identity", "Reshape", "Cast", "CastLike", "Squeeze", "Unsqueeze", "Flatten", "Dropout", "Expand"}
)
# Ops that keep the axes where they are (a Softmax behind them still normalizes the last axis).
_SAME_AXES = frozenset({"Identity", "Cast", "CastLike", "Dropout"})
# Ops whose output is a score per class (normalized, or squashed into 0..1).
CLASS_SCORE_OPS = frozenset({"Softmax", "LogSoftmax", "Sigmoid"})
_GENERATED_DIM = re.compile(r"(__d\d+$|^unk__\d+$)")  # names exporters and shape inference make up
_MASK_NAME = re.compile(r"(attention_?mask|input_?mask|^mask$)", re.I)

Dims = tuple[int | str | None, ...]


@dataclass(frozen=True)
class OutputFacts:
    """One graph output as the graph declares it, and the op that computed it."""

    name: str
    dtype: np.dtype | None  # None: the graph does not say (or a type numpy has no dtype for)
    dims: Dims | None  # None: the rank is unknown
    producer: str = ""  # op type of the node that computed the value ("" for an input or initializer)
    via: tuple[str, ...] = ()  # pass-through ops between that node and the output, nearest first
    last_axis: bool | None = None  # Softmax/LogSoftmax: normalizes the output's last axis (None: cannot tell)
    # producer "Softmax" built from separate ops (Exp / ReduceSum over the last axis, often after x - ReduceMax):
    # those ops in graph order; () for a Softmax node or any other producer
    built_from: tuple[str, ...] = ()

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)

    @property
    def last_dim(self) -> int | None:
        """The last dim when it is a known number."""
        if not self.dims:
            return None
        d = self.dims[-1]
        return d if isinstance(d, int) and d > 0 else None

    @property
    def floating(self) -> bool:
        """Float, or of unknown type (which is treated as float: the looser claim)."""
        return self.dtype is None or bool(np.issubdtype(self.dtype, np.floating))

    def describe_dims(self) -> str:
        if self.dims is None:
            return "[?]"
        return "[" + ", ".join(_dim_text(d) for d in self.dims) + "]"

    @classmethod
    def of_array(cls, name: str, array: np.ndarray) -> OutputFacts:
        """Facts from a value alone (no graph): its dtype and its concrete shape."""
        value = np.asarray(array)
        return cls(name, value.dtype, tuple(int(d) for d in value.shape))


def _dim_text(dim: int | str | None) -> str:
    """A dim as printed: its number or symbol, "?" for none and for a generated formula (shape inference's)."""
    if dim is None or (isinstance(dim, str) and (not dim.isidentifier() or _GENERATED_DIM.search(dim))):
        return "?"
    return str(dim)


def _dtype(elem_type: int) -> np.dtype | None:
    if not elem_type:
        return None
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)


def _inferred_dims(model: onnx.ModelProto) -> dict[str, Dims | None]:
    """Output dims from onnx's shape inference, for outputs the graph declares without a shape."""
    from ortpilot.graph.check import malformed_einsums

    if malformed_einsums(model):  # onnx's Einsum inference can loop forever on these (graph.flops)
        return {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # onnx raises several error types for graphs it cannot follow
        return {}
    return {o.name: value_dims(o) for o in inferred.graph.output}


def _normalizes_last_axis(node: onnx.NodeProto, rank: int | None, opset: int, via: Sequence[str]) -> bool | None:
    if node.op_type not in ("Softmax", "LogSoftmax"):
        return None
    if rank is None or any(op not in _SAME_AXES for op in via):
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
    return axis in (-1, rank - 1)


def _behind(producers: dict[str, onnx.NodeProto], name: str) -> onnx.NodeProto | None:
    """The node that computed ``name``, looked for behind ops that keep values and axes (Identity, Cast)."""
    node, seen = producers.get(name), set()
    while node is not None and node.op_type in _SAME_AXES and node.input and id(node) not in seen:
        seen.add(id(node))
        node = producers.get(node.input[0])
    return node


def _int_values(model: onnx.ModelProto, producers: dict[str, onnx.NodeProto], name: str) -> list[int] | None:
    """The integers a constant input holds (an initializer or a Constant node), None when it is not one."""
    from onnx import numpy_helper

    tensor = next((t for t in model.graph.initializer if t.name == name), None)
    node = producers.get(name)
    if tensor is None and node is not None and node.op_type == "Constant":
        tensor = next((a.t for a in node.attribute if a.name == "value"), None)
    if tensor is None:
        return None
    return [int(v) for v in np.asarray(numpy_helper.to_array(tensor)).reshape(-1)]


def _reduces_last_axis_only(
    model: onnx.ModelProto, producers: dict[str, onnx.NodeProto], node: onnx.NodeProto, rank: int | None
) -> bool:
    """A Reduce* node that keeps its dims and reduces exactly the last axis (axes from the input or, in old
    opsets, the attribute)."""
    attrs = {a.name: a for a in node.attribute}
    if "keepdims" in attrs and attrs["keepdims"].i == 0:
        return False
    if "axes" in attrs:
        axes = list(attrs["axes"].ints)
    elif len(node.input) > 1 and node.input[1]:
        axes = _int_values(model, producers, node.input[1])
    else:
        return False  # no axes: every axis is reduced
    if not axes or len(axes) != 1:
        return False
    return axes[0] == -1 or (rank is not None and axes[0] == rank - 1)


def decomposed_softmax(
    model: onnx.ModelProto, producers: dict[str, onnx.NodeProto], node: onnx.NodeProto, rank: int | None
) -> tuple[str, ...]:
    """The ops of a softmax over the last axis built from separate ones and ending in ``node``:
    ``Exp(x) / ReduceSum(Exp(x), axes=[-1], keepdims=1)``, often with ``x - ReduceMax(x, axes=[-1])`` first for
    stability (exporters write it so when a framework's softmax is traced op by op). () when it is not one."""
    if node.op_type != "Div" or len(node.input) != 2:
        return ()
    exp, total = _behind(producers, node.input[0]), _behind(producers, node.input[1])
    if exp is None or total is None or exp.op_type != "Exp" or total.op_type != "ReduceSum" or not total.input:
        return ()
    if _behind(producers, total.input[0]) is not exp or not _reduces_last_axis_only(model, producers, total, rank):
        return ()
    ops: tuple[str, ...] = ("Exp", "ReduceSum", "Div")
    shifted = _behind(producers, exp.input[0]) if exp.input else None
    if shifted is not None and shifted.op_type == "Sub" and len(shifted.input) == 2:
        peak = _behind(producers, shifted.input[1])
        if (
            peak is not None
            and peak.op_type == "ReduceMax"
            and peak.input
            and peak.input[0] == shifted.input[0]
            and _reduces_last_axis_only(model, producers, peak, rank)
        ):
            ops = ("ReduceMax", "Sub", *ops)
    return ops


def output_facts(model: onnx.ModelProto) -> list[OutputFacts]:
    """Every graph output, in order, with its dtype, dims and producing op (see the module docstring)."""
    producers = {out: node for node in model.graph.node for out in node.output if out}
    declared = {o.name: value_dims(o) for o in model.graph.output}
    if any(d is None for d in declared.values()):
        declared.update({k: v for k, v in _inferred_dims(model).items() if declared.get(k) is None})
    opset = _opset(model)
    facts = []
    for value in model.graph.output:
        via: list[str] = []
        node = producers.get(value.name)
        seen = set()
        while node is not None and node.op_type in PASSTHROUGH_OPS and node.input and id(node) not in seen:
            seen.add(id(node))
            via.append(node.op_type)
            node = producers.get(node.input[0])
        dims = declared.get(value.name)
        rank = None if dims is None else len(dims)
        producer = node.op_type if node is not None else ""
        last = _normalizes_last_axis(node, rank, opset, via) if node else None
        # a softmax built from separate ops normalizes the last axis of the Div's output, which the output keeps
        # where only value-keeping ops follow (behind a Reshape neither its rank nor that axis is known here)
        kept = all(op in _SAME_AXES for op in via)
        built = decomposed_softmax(model, producers, node, rank if kept else None) if node else ()
        if built:
            producer, last = "Softmax", True if kept else None
        facts.append(
            OutputFacts(value.name, _dtype(value.type.tensor_type.elem_type), dims, producer, tuple(via), last, built)
        )
    return facts


def mask_input(model: onnx.ModelProto) -> InputInfo | None:
    """The input that marks real tokens (``attention_mask``, ``input_mask``): rank 2, [batch, sequence]."""
    for info in graph_inputs(model):
        if _MASK_NAME.search(info.name) and len(info.dims) == 2:
            return info
    return None


def same_leading_dims(dims: Dims | None, lead: Dims, count: int = 2) -> bool:
    """Whether ``dims`` start with the first ``count`` dims of ``lead``, each the same symbol or number.

    Only what the graph states counts: an unknown dim on either side is not a match, so an output
    is taken for token-level only when its layout is declared (``[batch, sequence, hidden]``).
    """
    if dims is None or len(dims) < count or len(lead) < count:
        return False
    for a, b in zip(dims[:count], lead[:count]):
        if a is None or b is None or a != b or (isinstance(a, int) and a <= 0):
            return False
    return True


__all__ = [
    "CLASS_SCORE_OPS",
    "PASSTHROUGH_OPS",
    "OutputFacts",
    "decomposed_softmax",
    "mask_input",
    "output_facts",
    "same_leading_dims",
]
