"""The pass interface: model in, model plus a record of what changed out.

Like ONNX IR's passes, a pass never edits its input; it returns a ``PassResult`` whose record
says whether and how the model changed (node counts, op histogram diff, fused and quantized
node counts, size), how long it took, and the stamp written into the new model. A
``Pipeline`` runs passes in order; the tuner enumerates pipelines.
"""

from __future__ import annotations

import abc
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import onnx

from ortpilot.artifacts.stamp import make_stamp, write_stamp
from ortpilot.modelio import file_sha256, load_model, model_sha256, save_model

log = logging.getLogger("ortpilot")
ModelLike = Union[str, os.PathLike, onnx.ModelProto]

# Ops that only a quantizer writes; a node of one of these is a quantized node.
QUANT_OPS = frozenset({
    "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM",
    "QLinearConv", "QLinearMatMul", "QGemm", "QAttention", "QEmbedLayerNormalization", "QLinearAdd",
    "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearSoftmax",
    "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearWhere", "QLinearReduceMean", "QLinearConvTranspose",
    "MatMulNBits", "GatherBlockQuantized",
})
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


@dataclass
class SourceModel:
    """A pass input, loaded once: the proto, where it came from, and its content hash."""

    proto: onnx.ModelProto
    path: Path | None
    sha256: str

    @classmethod
    def of(cls, model: ModelLike) -> SourceModel:
        if isinstance(model, onnx.ModelProto):
            return cls(model, None, model_sha256(model))
        path = Path(model)
        return cls(load_model(path), path, file_sha256(path))


def iter_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    """Every node, subgraphs (If/Loop/Scan bodies) included."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from iter_nodes(sub)


def op_histogram(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in iter_nodes(model.graph))


def quantized_node_count(model: onnx.ModelProto) -> int:
    """Compute nodes that run quantized: QOperator/integer ops, plus float ops fed by a DequantizeLinear
    (QDQ format, where ORT fuses DQ -> op -> Q into the integer kernel)."""
    count = 0
    for graph in _graphs(model.graph):
        producers = {out: n.op_type for n in graph.node for out in n.output}
        for node in graph.node:
            if node.op_type in QUANT_OPS:
                count += 1
            elif node.op_type not in QDQ_OPS and any(producers.get(i) == "DequantizeLinear" for i in node.input):
                count += 1
    return count


def _graphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graphs(sub)


@dataclass
class PassRecord:
    """What one pass did to one model."""

    name: str
    options: dict[str, Any]
    changed: bool
    nodes_before: int
    nodes_after: int
    op_diff: dict[str, int]  # op type -> count after minus count before (non-zero only)
    fused: dict[str, int]  # fused op type -> count (fusion passes)
    quantized_nodes: int
    size_before: int
    size_after: int
    seconds: float
    stamp: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "options": self.options, "changed": self.changed,
            "nodes_before": self.nodes_before, "nodes_after": self.nodes_after, "op_diff": self.op_diff,
            "fused": self.fused, "quantized_nodes": self.quantized_nodes, "size_before": self.size_before,
            "size_after": self.size_after, "seconds": round(self.seconds, 4), "stamp": self.stamp,
            "notes": self.notes, **({"extra": self.extra} if self.extra else {}),
        }


@dataclass
class PassResult:
    """The new model and the record of how it was made."""

    model: onnx.ModelProto
    record: PassRecord

    @property
    def changed(self) -> bool:
        return self.record.changed

    def save(self, path: str | os.PathLike) -> Path:
        """Write the model atomically (nothing is written if the process dies first)."""
        return save_model(self.model, path)


@dataclass
class Outcome:
    """What a pass's ``transform`` returns: the model and pass-specific facts for the record."""

    model: onnx.ModelProto
    fused: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    level: str | None = None
    providers: Sequence[Any] | None = None
    ep_specific: bool = False


class Pass(abc.ABC):
    """A model -> model step. Subclasses implement ``transform`` and ``options``."""

    name: str = "pass"

    @abc.abstractmethod
    def options(self) -> dict[str, Any]:
        """The settings that decide this pass's output (recorded, and part of cache keys)."""

    @abc.abstractmethod
    def transform(self, source: SourceModel) -> Outcome:
        """Build the new model. Must not modify ``source.proto``."""

    def __call__(self, model: ModelLike | SourceModel) -> PassResult:
        return self.run(model)

    def run(self, model: ModelLike | SourceModel) -> PassResult:
        source = model if isinstance(model, SourceModel) else SourceModel.of(model)
        start = time.perf_counter()
        outcome = self.transform(source)
        seconds = time.perf_counter() - start
        before, after = op_histogram(source.proto), op_histogram(outcome.model)
        diff = {op: after[op] - before[op] for op in sorted(set(before) | set(after)) if after[op] != before[op]}
        stamp = make_stamp(source_sha256=source.sha256, providers=outcome.providers, level=outcome.level,
                           ep_specific=outcome.ep_specific,
                           source_path=str(source.path.resolve()) if source.path else None,
                           pass_name=self.name, options=self.options())
        changed = outcome.model is not source.proto and _graph_bytes(outcome.model) != _graph_bytes(source.proto)
        model = _copy(source.proto) if outcome.model is source.proto else outcome.model
        write_stamp(model, stamp)
        record = PassRecord(
            name=self.name, options=self.options(), changed=changed,
            nodes_before=sum(before.values()), nodes_after=sum(after.values()), op_diff=diff,
            fused={k: v for k, v in outcome.fused.items() if v}, quantized_nodes=quantized_node_count(model),
            size_before=source.proto.ByteSize(), size_after=model.ByteSize(), seconds=seconds, stamp=stamp,
            notes=list(outcome.notes), extra=dict(outcome.extra))
        return PassResult(model, record)


def _graph_bytes(model: onnx.ModelProto) -> bytes:
    return model.graph.SerializeToString()


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


@dataclass
class PipelineResult:
    model: onnx.ModelProto
    records: list[PassRecord]

    @property
    def changed(self) -> bool:
        return any(r.changed for r in self.records)

    def to_dict(self) -> dict[str, Any]:
        return {"changed": self.changed, "passes": [r.to_dict() for r in self.records]}

    def save(self, path: str | os.PathLike) -> Path:
        return save_model(self.model, path)


class Pipeline:
    """Passes run in order, each on the previous one's output."""

    def __init__(self, passes: Sequence[Pass]) -> None:
        self.passes = list(passes)

    def describe(self) -> str:
        return " -> ".join(p.name for p in self.passes) or "(no passes)"

    def to_dict(self) -> dict[str, Any]:
        return {"passes": [{"name": p.name, "options": p.options()} for p in self.passes]}

    def run(self, model: ModelLike) -> PipelineResult:
        current: ModelLike | SourceModel = SourceModel.of(model) if not isinstance(model, SourceModel) else model
        first = current
        records: list[PassRecord] = []
        for step in self.passes:
            result = step.run(current)
            records.append(result.record)
            current = SourceModel(result.model, None, model_sha256(result.model))
        final = current.proto if isinstance(current, SourceModel) else SourceModel.of(current).proto
        if records and isinstance(first, SourceModel) and first.path is not None:
            # The stamp of a pipeline's output names the original source, not an intermediate.
            records[-1].stamp = dict(records[-1].stamp or {}, source_sha256=first.sha256,
                                     source_path=str(first.path.resolve()))
            write_stamp(final, records[-1].stamp)
        return PipelineResult(final, records)

    __call__ = run


__all__ = ["ModelLike", "Outcome", "Pass", "PassRecord", "PassResult", "Pipeline", "PipelineResult", "QDQ_OPS",
           "QUANT_OPS", "SourceModel", "iter_nodes", "op_histogram", "quantized_node_count"]
