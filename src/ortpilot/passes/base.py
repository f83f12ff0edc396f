"""The pass interface: model in, model plus a record of what changed out.

Like ONNX IR's passes, a pass never edits its input; it returns a ``PassResult`` whose record
says whether and how the model changed (node counts, op histogram diff, fused and quantized
node counts, size), how long it took, and the stamp written into the new model. A
``Pipeline`` runs passes in order; the tuner enumerates pipelines.

Serializing a large model is the slowest thing a pass does besides its own work (protobuf's
``ByteSize`` serializes too: about 1 s per 500 MB), so each model is serialized once: a source's
size is computed once and kept, a pass's output once, and those bytes give the record's size,
the next pass's input hash in a ``Pipeline`` and the file ``PassResult.save`` writes. Whether a
pass changed the graph is a protobuf comparison, which does not serialize.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import EncodeError

from ortpilot.artifacts.atomic import atomic_write_bytes, check_output_path, save_model
from ortpilot.artifacts.stamp import make_stamp, write_stamp
from ortpilot.modelio import file_sha256, load_model, set_ir_for_running_ort
from ortpilot.passes.options import PassOptions
from ortpilot.providers.names import resolve_providers
from ortpilot.walk import graphs, nodes

log = logging.getLogger("ortpilot")
ModelLike = str | os.PathLike | onnx.ModelProto
_TWO_GB = 2**31 - 1  # one protobuf file holds less; bigger models are saved with external data

# Ops that only a quantizer writes; a node of one of these is a quantized node.
QUANT_OPS = frozenset(
    {
        "MatMulInteger",
        "ConvInteger",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "DynamicQuantizeLSTM",
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "QAttention",
        "QEmbedLayerNormalization",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearConcat",
        "QLinearSoftmax",
        "QLinearGlobalAveragePool",
        "QLinearAveragePool",
        "QLinearWhere",
        "QLinearReduceMean",
        "QLinearConvTranspose",
        "MatMulNBits",
        "GatherBlockQuantized",
    }
)
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


@dataclass
class SourceModel:
    """A pass input, loaded once: the proto, where it came from, and its content hash."""

    proto: onnx.ModelProto
    path: Path | None
    sha256: str
    size: int | None = None  # serialized size in bytes; computed on first need, then kept

    @classmethod
    def of(cls, model: ModelLike) -> SourceModel:
        if isinstance(model, onnx.ModelProto):
            data = model.SerializeToString()  # once: the hash and the size come from the same bytes
            return cls(model, None, hashlib.sha256(data).hexdigest(), len(data))
        path = Path(model)
        return cls(load_model(path), path, file_sha256(path))

    def byte_size(self) -> int:
        """Serialized size of ``proto``, computed once (passes run many times on one source)."""
        if self.size is None:
            self.size = _byte_size(self.proto)
        return self.size


def op_histogram(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in nodes(model.graph))


def given_quantized_ops(model: onnx.ModelProto) -> dict[str, int]:
    """The quantizer's ops a model holds, by count ({} for a float model): integer/QOperator ops and
    activation quantizers (QuantizeLinear, DynamicQuantizeLinear). DequantizeLinear alone is left out:
    float models store compressed weights that way."""
    found = op_histogram(model)
    return {op: n for op, n in sorted(found.items()) if op in QUANT_OPS or op in QDQ_OPS - {"DequantizeLinear"}}


def quantized_node_count(model: onnx.ModelProto) -> int:
    """Compute nodes that run quantized: QOperator/integer ops, plus float ops fed by a DequantizeLinear
    (QDQ format, where ORT fuses DQ -> op -> Q into the integer kernel)."""
    count = 0
    for graph in graphs(model.graph):
        producers = {out: n.op_type for n in graph.node for out in n.output}
        for node in graph.node:
            fed_by_dq = node.op_type not in QDQ_OPS and any(producers.get(i) == "DequantizeLinear" for i in node.input)
            if node.op_type in QUANT_OPS or fed_by_dq:
                count += 1
    return count


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
            "name": self.name,
            "options": self.options,
            "changed": self.changed,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "op_diff": self.op_diff,
            "fused": self.fused,
            "quantized_nodes": self.quantized_nodes,
            "size_before": self.size_before,
            "size_after": self.size_after,
            "seconds": round(self.seconds, 4),
            "stamp": self.stamp,
            "notes": self.notes,
            **({"extra": self.extra} if self.extra else {}),
        }


def _fingerprint(model: onnx.ModelProto) -> tuple[Any, ...]:
    """What callers edit on a finished model (its stamp, its IR version), and cheap graph counts."""
    return (
        model.ir_version,
        tuple((o.domain, o.version) for o in model.opset_import),
        tuple((p.key, p.value) for p in model.metadata_props),
        len(model.graph.node),
        len(model.graph.initializer),
    )


@dataclass
class PassResult:
    """The new model and the record of how it was made.

    ``data`` holds the bytes ``Pass.run`` serialized the model to; they are reused for as long
    as the model's stamp, IR version, opsets and node counts are those it had then (editing a
    result's graph in place is not supported).
    """

    model: onnx.ModelProto
    record: PassRecord
    data: bytes | None = field(default=None, repr=False, compare=False)
    _data_of: tuple[Any, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._data_of = _fingerprint(self.model) if self.data is not None else ()

    @property
    def changed(self) -> bool:
        return self.record.changed

    def serialized(self) -> bytes:
        """The model's bytes: those ``run`` made while they still match the model, fresh ones otherwise."""
        if self.data is None or _fingerprint(self.model) != self._data_of:
            self.data = self.model.SerializeToString()
            self._data_of = _fingerprint(self.model)
        return self.data

    def as_source(self) -> SourceModel:
        """This result as the next pass's input, hashed from the bytes already made."""
        data = self.serialized()
        return SourceModel(self.model, None, hashlib.sha256(data).hexdigest(), len(data))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the model atomically (nothing is written if the process dies first)."""
        dest = check_output_path(path)  # a directory or an unwritable folder: UsageError, nothing written
        set_ir_for_running_ort(self.model)  # as save_model does; a lowered IR version makes fresh bytes
        if self.data is not None and len(self.data) < _TWO_GB:
            return atomic_write_bytes(dest, self.serialized())
        return save_model(self.model, dest)


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


class Setting:
    """A pass attribute that reads the field (or property) of the same name of its options record, ``config``
    (``passes.options``): the record holds each setting once, the pass reads as it always has. A tuple
    reads as a list, an empty one where the field may be None as None."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = getattr(obj.config, self.name)
        return list(value) if isinstance(value, tuple) else value


class Pass(abc.ABC):
    """A model -> model step. Subclasses implement ``transform`` and ``options``."""

    name: str = "pass"
    # Part of every cache key of this pass's output: bump it when the output changes for the same options.
    revision: int = 0
    # Whether the output depends on calibration samples (their digest is then part of cache keys).
    calibrated: bool = False

    @classmethod
    def from_options(
        cls, options: PassOptions, *, calibration: Sequence[Mapping[str, Any]] = (), prepared: bool = False
    ) -> Pass:
        """The pass a pipeline step's options record describes (``passes.registry.Step``, ``passes.options``).

        ``calibration``: samples, for passes that calibrate; ``prepared``: the input already went
        through ``PrepareForQuantization`` (a quantize step then skips its own preparation). This
        default hands a record's JSON form to the constructor as keywords (a pass with no record of its own).
        """
        return cls(**options.to_dict())

    @abc.abstractmethod
    def options(self) -> dict[str, Any]:
        """The settings that decide this pass's output (recorded, and part of cache keys)."""

    def label(self) -> str:
        """A short human label (tune's candidate labels, reports): what this pass does to a model."""
        return self.name

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
        providers = outcome.providers if outcome.providers is not None else resolve_providers(None)
        stamp = make_stamp(
            source_sha256=source.sha256,
            providers=providers,
            level=outcome.level,
            ep_specific=outcome.ep_specific,
            source_path=str(source.path.resolve()) if source.path else None,
            pass_name=self.name,
            options=self.options(),
        )
        # A field-by-field comparison: no serialization, and a different op mix settles it at once.
        changed = outcome.model is not source.proto and (bool(diff) or outcome.model.graph != source.proto.graph)
        model = _copy(source.proto) if outcome.model is source.proto else outcome.model
        write_stamp(model, stamp)
        data = _serialize(model)
        record = PassRecord(
            name=self.name,
            options=self.options(),
            changed=changed,
            nodes_before=sum(before.values()),
            nodes_after=sum(after.values()),
            op_diff=diff,
            fused={k: v for k, v in outcome.fused.items() if v},
            quantized_nodes=quantized_node_count(model),
            size_before=source.byte_size(),
            size_after=len(data) if data is not None else _byte_size(model),
            seconds=seconds,
            stamp=stamp,
            notes=list(outcome.notes),
            extra=dict(outcome.extra),
        )
        return PassResult(model, record, data)


def _serialize(model: onnx.ModelProto) -> bytes | None:
    """The model's bytes, or None when it is too big for one protobuf (over 2 GB)."""
    try:
        return model.SerializeToString()
    except EncodeError:
        return None


def _byte_size(model: onnx.ModelProto) -> int:
    """Serialized size; over 2 GB, where protobuf cannot serialize (ByteSize included), the tensor bytes."""
    try:
        return model.ByteSize()
    except EncodeError:
        return sum(len(t.raw_data) for graph in graphs(model.graph) for t in graph.initializer)


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
            current = result.as_source()
        final = current.proto if isinstance(current, SourceModel) else SourceModel.of(current).proto
        if records and isinstance(first, SourceModel) and first.path is not None:
            # The stamp of a pipeline's output names the original source, not an intermediate.
            records[-1].stamp = dict(
                records[-1].stamp or {}, source_sha256=first.sha256, source_path=str(first.path.resolve())
            )
            write_stamp(final, records[-1].stamp)
        return PipelineResult(final, records)

    __call__ = run


__all__ = [
    "QDQ_OPS",
    "QUANT_OPS",
    "ModelLike",
    "Outcome",
    "Pass",
    "PassRecord",
    "PassResult",
    "Pipeline",
    "PipelineResult",
    "Setting",
    "SourceModel",
    "given_quantized_ops",
    "op_histogram",
    "quantized_node_count",
]
