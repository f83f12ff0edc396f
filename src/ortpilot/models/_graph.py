"""A tiny graph builder shared by the demo models.

onnx.helper is verbose for graphs of a few hundred nodes; this keeps names unique and
readable, turns numpy arrays into initializers, shares identical small constants, and
stamps every model with the same IR version and opsets so all demo models load in every
ORT ortpilot supports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortpilot.modelio import DEFAULT_OPSET, SAFE_IR_VERSION

MS_DOMAIN = "com.microsoft"
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64

Dim = int | str | None


class GraphBuilder:
    """Accumulates nodes, initializers and graph inputs/outputs, then builds a ModelProto.

    Weights come from ``numpy.random.default_rng(seed)`` in call order, so a model built with
    the same seed and the same code is byte-identical.
    """

    def __init__(self, name: str, seed: int) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.value_infos: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self._counts: dict[str, int] = {}
        self._constants: dict[tuple[int, tuple[int, ...], bytes], str] = {}
        self._domains: set[str] = set()

    # -- names ---------------------------------------------------------------------------
    def unique(self, base: str) -> str:
        """A value/node name not used yet: ``base``, else ``base_1``, ``base_2`` ..."""
        if base not in self._names:
            self._names.add(base)
            return base
        n = self._counts.get(base, 0)
        while True:
            n += 1
            cand = f"{base}_{n}"
            if cand not in self._names:
                self._counts[base] = n
                self._names.add(cand)
                return cand

    # -- graph inputs/outputs ------------------------------------------------------------
    def input(self, name: str, elem_type: int, shape: Sequence[Dim]) -> str:
        self._names.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, name: str, elem_type: int, shape: Sequence[Dim]) -> str:
        """Declare the already produced value ``name`` (see ``op(out=...)``) a graph output."""
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    # -- tensors -------------------------------------------------------------------------
    def initializer(self, name: str, array: np.ndarray) -> str:
        """Add ``array`` as an initializer named ``name`` (made unique) and return the name."""
        name = self.unique(name)
        # np.array, not np.ascontiguousarray: the latter turns 0-d scalars into 1-d arrays.
        tensor = numpy_helper.from_array(np.array(array, order="C", copy=True), name)
        self.initializers.append(tensor)
        return name

    def weight(self, name: str, shape: Sequence[int], std: float) -> str:
        """A float32 normal(0, std) initializer: the random weights of the demo models."""
        arr = self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)
        return self.initializer(name, arr.astype(np.float32))

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        arr = self.rng.uniform(low, high, size=tuple(shape)).astype(np.float32)
        return self.initializer(name, arr)

    def const(self, value: Any, dtype: Any = np.float32, name: str = "const") -> str:
        """A constant initializer, shared with any earlier constant of equal dtype/shape/value.

        Sharing keeps the graph small and matches what exporters emit after constant folding.
        """
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.num, arr.shape, arr.tobytes())
        if key not in self._constants:
            self._constants[key] = self.initializer(name, arr)
        return self._constants[key]

    def i64(self, value: Any, name: str = "const") -> str:
        return self.const(value, np.int64, name)

    # -- nodes ---------------------------------------------------------------------------
    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        name: str | None = None,
        *,
        out: str | None = None,
        domain: str = "",
        **attrs: Any,
    ) -> str:
        """Add a one-output node and return the output name (``out`` names it exactly)."""
        outs = [out] if out else None
        return self.op_multi(op_type, inputs, name, outputs=outs or 1, domain=domain, **attrs)[0]

    def op_multi(
        self,
        op_type: str,
        inputs: Sequence[str],
        name: str | None = None,
        *,
        outputs: int | Sequence[str] = 1,
        domain: str = "",
        **attrs: Any,
    ) -> list[str]:
        """Add a node; ``outputs`` is a count (names derived from the node) or exact names."""
        node_name = self.unique(name or op_type)
        if isinstance(outputs, int):
            outs = [node_name if outputs == 1 else self.unique(f"{node_name}:{i}") for i in range(outputs)]
        else:
            outs = [self.unique(o) for o in outputs]
        if domain:
            self._domains.add(domain)
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node_name, domain=domain or None, **attrs))
        return outs

    def annotate(self, value: str, elem_type: int, shape: Sequence[Dim]) -> None:
        """Record an intermediate shape (value_info), as exporters do."""
        self.value_infos.append(helper.make_tensor_value_info(value, elem_type, list(shape)))

    # -- model ---------------------------------------------------------------------------
    def build(self, doc: str = "", metadata: dict[str, str] | None = None) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs, self.outputs, initializer=self.initializers, value_info=self.value_infos
        )
        opsets = [helper.make_opsetid("", DEFAULT_OPSET)]
        opsets += [helper.make_opsetid(d, 1) for d in sorted(self._domains)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="ortpilot.models", doc_string=doc)
        model.ir_version = SAFE_IR_VERSION
        for key, value in (metadata or {}).items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.checker.check_model(model)
        return model
