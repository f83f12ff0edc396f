"""Weight-only quantization for decoders: 4- or 8-bit blocked weights, float activations.

A decoder reads every weight once per generated token, so on a CPU its decode speed is set by
the bytes of its weights. This pass hands the work to ORT's own
``onnxruntime.quantization.matmul_nbits_quantizer``: every MatMul with a constant weight becomes
``com.microsoft::MatMulNBits`` (blocks along K, one scale per block, optional zero points) and,
in 4-bit mode, the token embedding ``Gather`` becomes ``GatherBlockQuantized``. ``accuracy_level``
picks the CPU kernel's compute type (4 = int8 compute, the fast one on AVX-512 VNNI).

Run it after the decoder fusion pass (GroupQueryAttention) so one model gets both; it touches
only weight MatMuls and the embedding, which the fusion leaves in place. It refuses what it
cannot do well (a block size that does not divide a weight's K, a model with nothing to
quantize) and does nothing to a model that is already weight-only quantized.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import onnx

from ortpilot.errors import UsageError
from ortpilot.passes.base import Outcome, Pass, PassResult, PipelineResult, SourceModel
from ortpilot.passes.options import WeightOnlyOptions
from ortpilot.passes.rotary import constant_tables
from ortpilot.quantmodes import DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE

log = logging.getLogger("ortpilot")

WEIGHT_ONLY_OPS = frozenset({"MatMulNBits", "GatherBlockQuantized"})
_QUANTIZER_LOGGER = "onnxruntime.quantization.matmul_nbits_quantizer"
_LAYER = re.compile(r"(?:^|[./_'\"])(?:layers?|h|blocks?)[./_](\d+)(?!\d)")
# Exporters that rename weights (torch dynamo: ``val_123``) keep the module path in node metadata.
_SCOPE_KEYS = ("pkg.torch.onnx.name_scopes", "namespace")
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
MIN_DIM = 16  # smaller constants are position tables (rotary inv_freq), not weights worth blocks


@dataclass(frozen=True)
class WeightTarget:
    """A node whose constant weight the quantizer would replace."""

    node: str
    op_type: str  # MatMul, FusedMatMul (transB) or Gather
    weight: str
    shape: tuple[int, ...]
    block_dim: int  # the dim split into blocks: K for MatMul, the hidden dim for Gather
    group: str  # "layer N", or the weight's own name for weights outside the repeated layers


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def find_targets(model: onnx.ModelProto, *, embedding: bool = True) -> list[WeightTarget]:
    """Weight MatMuls ([..., K] x constant [K, N]; FusedMatMul with transB: [N, K]) and, if asked,
    embedding Gathers (constant [V, H])."""
    inits = _initializers(model)
    out: list[WeightTarget] = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in inits:
            tensor = inits[node.input[1]]
            dims = tuple(int(d) for d in tensor.dims)
            if (
                tensor.data_type in _FLOAT_TYPES
                and len(dims) >= 2
                and all(d == 1 for d in dims[:-2])
                and min(dims[-2:]) >= MIN_DIM
            ):
                out.append(WeightTarget(node.name, "MatMul", tensor.name, dims, dims[-2], _group(node, tensor.name)))
        elif node.op_type == "FusedMatMul" and _plain_trans_b(node) and node.input[1] in inits:
            # onnxscript's fusions turn a tied LM head (x @ E^T) into FusedMatMul(x, E, transB=1).
            tensor = inits[node.input[1]]
            dims = tuple(int(d) for d in tensor.dims)
            if tensor.data_type in _FLOAT_TYPES and len(dims) == 2 and min(dims) >= MIN_DIM:
                out.append(
                    WeightTarget(node.name, "FusedMatMul", tensor.name, dims, dims[1], _group(node, tensor.name))
                )
        elif embedding and node.op_type == "Gather" and node.input and node.input[0] in inits:
            tensor = inits[node.input[0]]
            dims = tuple(int(d) for d in tensor.dims)
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if tensor.data_type in _FLOAT_TYPES and len(dims) == 2 and axis == 0 and min(dims) >= MIN_DIM:
                out.append(WeightTarget(node.name, "Gather", tensor.name, dims, dims[1], _group(node, tensor.name)))
    return out


def _plain_trans_b(node: onnx.NodeProto) -> bool:
    """FusedMatMul that is just x @ W^T: transB=1 and every other attribute at its default."""
    attrs = {a.name: (a.f if a.type == onnx.AttributeProto.FLOAT else a.i) for a in node.attribute}
    defaults = {"alpha": 1.0, "transA": 0, "transBatchA": 0, "transBatchB": 0}
    return (
        node.domain == "com.microsoft"
        and attrs.get("transB") == 1
        and all(attrs.get(k, v) == v for k, v in defaults.items())
    )


def _untranspose(model: onnx.ModelProto, targets: Sequence[WeightTarget]) -> None:
    """FusedMatMul(x, W, transB=1) -> MatMul(x, W^T) with W^T stored, so the quantizer sees a MatMul.

    W itself stays if something else reads it (the tied embedding Gather); the node keeps its
    name so that exclusion lists still find it.
    """
    from onnx import numpy_helper

    fused = {t.node: t for t in targets if t.op_type == "FusedMatMul"}
    if not fused:
        return
    inits = _initializers(model)
    for i, node in enumerate(model.graph.node):
        target = fused.get(node.name)
        if target is None or node.op_type != "FusedMatMul":
            continue
        name = f"{target.weight}.transposed"
        if name not in inits:
            array = numpy_helper.to_array(inits[target.weight]).T.copy()
            model.graph.initializer.append(numpy_helper.from_array(array, name))
            inits[name] = model.graph.initializer[-1]
        model.graph.node[i].CopyFrom(
            onnx.helper.make_node("MatMul", [node.input[0], name], list(node.output), name=node.name)
        )


def _pack_siblings(model: onnx.ModelProto, targets: Sequence[WeightTarget]) -> list[WeightTarget]:
    """MatMuls that read the same activation with weights of the same K and type become one MatMul
    (weights concatenated along N) followed by a Split, e.g. q/k/v and gate/up of each layer.

    On a CPU decode step a 4-bit MatMul is so cheap that each kernel call's fixed cost counts;
    this is what genai's builder does for q/k/v. Blocks run along K per column, so every column is
    quantized exactly as it would be alone. Returns the targets with packed ones replaced.
    """
    import numpy as np
    from onnx import numpy_helper

    inits = _initializers(model)
    index = {n.name: i for i, n in enumerate(model.graph.node)}
    siblings: dict[tuple[str, int, int], list[WeightTarget]] = {}
    for t in targets:
        if t.op_type in ("MatMul", "FusedMatMul") and len(inits[_weight_of(model, index, t)].dims) == 2:
            node = model.graph.node[index[t.node]]
            siblings.setdefault((node.input[0], t.block_dim, inits[node.input[1]].data_type), []).append(t)
    groups = [members for members in siblings.values() if len(members) > 1]
    if not groups:
        return list(targets)
    packed_names = {m.node for members in groups for m in members}
    out = [t for t in targets if t.node not in packed_names]
    inserts: dict[int, list[onnx.NodeProto]] = {}
    for members in groups:
        nodes = [model.graph.node[index[m.node]] for m in members]
        arrays = [numpy_helper.to_array(inits[n.input[1]]) for n in nodes]
        sizes = [int(a.shape[1]) for a in arrays]
        name, weight = f"{members[0].node}/packed", f"{nodes[0].input[1]}.packed"
        model.graph.initializer.extend(
            [
                numpy_helper.from_array(np.concatenate(arrays, axis=1), weight),
                numpy_helper.from_array(np.array(sizes, dtype=np.int64), f"{weight}.split"),
            ]
        )
        packed = [
            onnx.helper.make_node("MatMul", [nodes[0].input[0], weight], [f"{name}/output"], name=name),
            onnx.helper.make_node(
                "Split",
                [f"{name}/output", f"{weight}.split"],
                [n.output[0] for n in nodes],
                name=f"{name}/Split",
                axis=-1,
            ),
        ]
        for node in packed:  # the export's module path, which names the layer (``layer_groups``)
            node.metadata_props.extend(nodes[0].metadata_props)
        inserts[min(index[m.node] for m in members)] = packed
        out.append(
            WeightTarget(
                name, "MatMul", weight, (members[0].block_dim, sum(sizes)), members[0].block_dim, members[0].group
            )
        )
    kept = []
    for i, node in enumerate(model.graph.node):
        kept.extend(inserts.get(i, []))
        if node.name not in packed_names:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return out


def _feed_packed_qkv(model: onnx.ModelProto) -> int:
    """Where a packed q/k/v Split feeds a GroupQueryAttention's query, key and value (in that order and
    nowhere else), give GQA the packed tensor itself: GQA takes packed QKV with empty key/value inputs,
    as genai's builder emits it, and the Split disappears. Returns the number of GQAs rewired."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in model.graph.output}
    dropped: set[str] = set()
    for split in model.graph.node:
        if split.op_type != "Split" or len(split.output) != 3 or graph_outputs & set(split.output):
            continue
        users = [consumers.get(o, []) for o in split.output]
        if any(len(u) != 1 for u in users) or len({id(u[0]) for u in users}) != 1:
            continue
        gqa = users[0][0]
        if gqa.op_type != "GroupQueryAttention" or list(gqa.input[:3]) != list(split.output):
            continue
        gqa.input[0], gqa.input[1], gqa.input[2] = split.input[0], "", ""
        dropped.add(split.name)
    if dropped:
        kept = [n for n in model.graph.node if n.name not in dropped]
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return len(dropped)


def _weight_of(model: onnx.ModelProto, index: dict[str, int], target: WeightTarget) -> str:
    """The initializer a (possibly untransposed) target's node reads now."""
    return model.graph.node[index[target.node]].input[1]


def _group(node: onnx.NodeProto, weight: str) -> str:
    """The repeated layer a weight belongs to, from its name, its node's, or the node's export
    metadata (module path); else the weight itself (the LM head, the embedding)."""
    scopes = [p.value for p in node.metadata_props if p.key in _SCOPE_KEYS]
    for text in (weight, node.name, *scopes):
        match = _LAYER.search(text)
        if match:
            return f"layer {int(match.group(1))}"
    return weight


def layer_groups(model: onnx.ModelProto, *, embedding: bool = True) -> dict[str, list[str]]:
    """Quantizable node names per group ("layer 0", ..., then lm_head/embedding weights by name).

    The auto-exclude loop leaves whole groups in float: per-layer is the granularity that
    decides accuracy in practice and keeps the search short.
    """
    groups: dict[str, list[str]] = {}
    for target in find_targets(model, embedding=embedding):
        groups.setdefault(target.group, []).append(target.node)
    return dict(sorted(groups.items(), key=lambda kv: _group_order(kv[0])))


def _group_order(name: str) -> tuple[int, int, str]:
    match = re.fullmatch(r"layer (\d+)", name)
    return (0, int(match.group(1)), "") if match else (1, 0, name)


def weight_only_nodes(model: onnx.ModelProto) -> int:
    """MatMulNBits / GatherBlockQuantized nodes: non-zero means the model is already weight-only quantized."""
    return sum(1 for n in model.graph.node if n.op_type in WEIGHT_ONLY_OPS)


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes a tensor's data takes (4-bit types packed two to a byte), wherever it is stored."""
    count = math.prod(int(d) for d in tensor.dims)
    if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return (count + 1) // 2
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers a decode step streams (plus the KV cache): all of them but
    GroupQueryAttention's rotary tables, of which a step reads one row per position."""
    rotary = {t.name for t in constant_tables(model)}
    return sum(tensor_bytes(t) for t in model.graph.initializer if t.name not in rotary)


class WeightOnlyPass(Pass):
    """MatMul weights to MatMulNBits (4 or 8 bits), the embedding to GatherBlockQuantized (4 bits)."""

    name = "weight_only"

    def __init__(self, mode: str | WeightOnlyOptions | None = None, **settings: Any) -> None:
        """``mode``: one of ``WEIGHT_ONLY_MODES`` (None: the record's default), or a whole ``WeightOnlyOptions``;
        ``settings``: its other fields (with a record, changes to it)."""
        if isinstance(mode, WeightOnlyOptions):
            config = replace(mode, **settings)
        else:
            config = WeightOnlyOptions(**({"mode": mode} if mode is not None else {}), **settings)
        self.config = config
        self.mode, self.bits, self.block_size = config.mode, config.bits, config.block_size
        self.symmetric, self.accuracy_level, self.pack = config.symmetric, config.accuracy_level, config.pack
        # The quantizer's GatherBlockQuantized path is 4-bit only.
        self.embedding = config.quantizes_embedding
        self.nodes_to_exclude = config.nodes_to_exclude
        # Mixed precision: these stay in higher precision (8-bit MatMulNBits; an embedding stays float).
        self.nodes_in_int8 = config.nodes_in_int8 if self.bits == 4 else ()

    @classmethod
    def from_options(cls, options: WeightOnlyOptions, **_: Any) -> WeightOnlyPass:
        """A tune step: its ``WeightOnlyOptions``."""
        return cls(options)

    def options(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "block_size": self.block_size,
            "symmetric": self.symmetric,
            "accuracy_level": self.accuracy_level,
            "embedding": self.embedding,
            "nodes_to_exclude": list(self.nodes_to_exclude),
            "nodes_in_int8": list(self.nodes_in_int8),
            "pack": self.pack,
        }

    def label(self) -> str:
        return f"{self.mode.split('-')[0]}-weights"

    def transform(self, source: SourceModel) -> Outcome:
        model = source.proto
        done = weight_only_nodes(model)
        if done:
            return _already_quantized(model, done)
        chosen = self._chosen(model)
        wide = {t.node for t in chosen if t.node in self.nodes_in_int8 and t.op_type != "Gather"}
        quantized, packed, packed_qkv = self._rewrite(model, chosen, wide)
        before, after = weight_bytes(model), weight_bytes(quantized)
        matmuls = sum(1 for t in chosen if t.op_type != "Gather")
        gathers = sum(1 for t in chosen if t.op_type == "Gather" and t.node not in self.nodes_in_int8)
        return Outcome(
            quantized,
            notes=self._notes(before, after, matmuls, gathers, packed, packed_qkv, wide),
            extra={
                "weight_bytes_before": before,
                "weight_bytes_after": after,
                "matmuls_quantized": matmuls,
                "gathers_quantized": gathers,
                "matmuls_packed_away": packed,
                "gqa_packed_qkv": packed_qkv,
                "excluded": list(self.nodes_to_exclude),
                "int8_nodes": sorted(wide),
                "already_quantized": False,
            },
        )

    def _chosen(self, model: onnx.ModelProto) -> list[WeightTarget]:
        """The weights this pass quantizes; refuses a model with none, unknown node names, bad blocks."""
        targets = find_targets(model, embedding=self.embedding)
        if not any(t.op_type != "Gather" for t in targets):
            raise UsageError(
                "The model has no MatMul with a constant float weight, so weight-only quantization has "
                "nothing to do (it quantizes MatMul weights [K, N] stored as initializers). Use "
                "--mode dynamic/static for models whose weights are computed or in Gemm/Conv nodes."
            )
        unknown = sorted((set(self.nodes_to_exclude) | set(self.nodes_in_int8)) - {t.node for t in targets})
        if unknown:
            raise UsageError(
                f"nodes_to_exclude names node(s) that are not quantizable weights: {', '.join(unknown[:8])}."
            )
        chosen = [t for t in targets if t.node not in self.nodes_to_exclude]
        self._check_blocks(chosen)
        return chosen

    def _rewrite(
        self, model: onnx.ModelProto, chosen: Sequence[WeightTarget], wide: set[str]
    ) -> tuple[onnx.ModelProto, int, int]:
        """A quantized copy: the ``wide`` nodes in 8 bits, the rest in ``bits``, siblings packed first.
        Returns it with the MatMuls packed away and the GroupQueryAttentions given packed QKV."""
        quantized = _named_copy(model)
        _untranspose(quantized, chosen)
        packed = 0
        for subset, bits in (
            ([t for t in chosen if t.node in wide], 8),
            ([t for t in chosen if t.node not in self.nodes_in_int8], self.bits),
        ):
            if subset:
                if self.pack:
                    before = len(subset)
                    subset = _pack_siblings(quantized, subset)
                    packed += before - len(subset)
                quantized = self._quantize(quantized, subset, bits)
        packed_qkv = _feed_packed_qkv(quantized) if self.pack else 0
        return quantized, packed, packed_qkv

    def _notes(
        self, before: int, after: int, matmuls: int, gathers: int, packed: int, packed_qkv: int, wide: set[str]
    ) -> list[str]:
        notes = [
            f"{matmuls} MatMul -> MatMulNBits ({self.bits}-bit, block {self.block_size}, "
            f"{'symmetric' if self.symmetric else 'asymmetric'}, accuracy_level {self.accuracy_level})",
            f"weights {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB ({before / max(after, 1):.2f}x smaller)",
        ]
        if packed:
            notes.append(
                f"MatMuls reading the same input packed: {packed} fewer MatMulNBits calls per token"
                + (f"; {packed_qkv} GroupQueryAttention read packed QKV" if packed_qkv else "")
            )
        if gathers:
            notes.append(f"{gathers} embedding Gather -> GatherBlockQuantized")
        elif self.bits == 8:
            notes.append("the embedding stays float: ORT's block-quantized Gather is 4-bit only")
        if self.nodes_to_exclude:
            notes.append(f"left in float: {len(self.nodes_to_exclude)} node(s)")
        if self.nodes_in_int8:
            notes.append(
                f"kept in 8 bits: {len(wide)} node(s)"
                + (" (an embedding among them stays float)" if len(wide) < len(self.nodes_in_int8) else "")
            )
        return notes

    def _check_blocks(self, targets: Sequence[WeightTarget]) -> None:
        for t in targets:
            if t.block_dim % self.block_size:
                dim = {"MatMul": "K (rows)", "FusedMatMul": "K (columns, transB)"}.get(
                    t.op_type, "hidden size (columns)"
                )
                divisors = [b for b in (16, 32, 64, 128, 256) if t.block_dim % b == 0]
                hint = (
                    f"block sizes that divide it: {', '.join(map(str, divisors))}"
                    if divisors
                    else f"no power-of-two block >= 16 divides it; exclude node '{t.node}'"
                )
                raise UsageError(
                    f"Block size {self.block_size} does not divide the {dim} of weight "
                    f"'{t.weight}' (shape {list(t.shape)}, used by {t.op_type} '{t.node}'); "
                    f"{hint}."
                )

    def _quantize(self, model: onnx.ModelProto, targets: Sequence[WeightTarget], bits: int) -> onnx.ModelProto:
        """One run of ORT's quantizer over exactly ``targets`` (FusedMatMuls already untransposed)."""
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        chosen = {t.node for t in targets}
        # Every other MatMul/Gather is excluded by name (the quantizer's own switch); it would
        # otherwise also take tiny constants such as the rotary table.
        exclude = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gather") and n.name not in chosen]
        ops = ("MatMul", "Gather") if bits == 4 and any(t.op_type == "Gather" for t in targets) else ("MatMul",)
        if "Gather" in ops:
            _raise_opset(model, 21)
        quiet = logging.getLogger(_QUANTIZER_LOGGER)
        level = quiet.level
        quiet.setLevel(logging.WARNING)  # it logs every node at INFO
        try:
            quantizer = MatMulNBitsQuantizer(
                model,
                bits=bits,
                block_size=self.block_size,
                is_symmetric=self.symmetric,
                accuracy_level=self.accuracy_level,
                nodes_to_exclude=exclude,
                op_types_to_quantize=ops,
            )
            quantizer.process()
        finally:
            quiet.setLevel(level)
        return quantizer.model.model


def _already_quantized(model: onnx.ModelProto, done: int) -> Outcome:
    """The model unchanged, with a note: ``done`` MatMulNBits/GatherBlockQuantized nodes are already there."""
    note = f"already weight-only quantized ({done} MatMulNBits/GatherBlockQuantized node(s)); not quantized again"
    log.warning("The model is %s.", note)
    size = weight_bytes(model)
    return Outcome(
        model,
        notes=[note],
        extra={"already_quantized": True, "weight_bytes_before": size, "weight_bytes_after": size},
    )


def _raise_opset(model: onnx.ModelProto, version: int) -> None:
    """Int4 initializers need opset 21; the quantizer would bump it with a warning, so do it here.

    The ops a decoder uses keep their semantics from opset 18 to 21 (only new types were added).
    """
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < version:
            opset.version = version
    model.ir_version = max(model.ir_version, 10)


def _named_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy the quantizer may edit in place, with every node named (exclusion works by name)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    used = {n.name for n in out.graph.node if n.name}
    for i, node in enumerate(out.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in used:
                name += "_"
            node.name = name
            used.add(name)
    return out


def pack_weight_matmuls(model: onnx.ModelProto, *, untranspose: bool = True) -> onnx.ModelProto:
    """The same graph rewrites without quantization (for float decoders): MatMuls that read the same
    input are packed into one (q/k/v, gate/up; GQA then reads the packed QKV), and with ``untranspose``
    a tied LM head's FusedMatMul(transB) becomes a MatMul on a stored transposed copy of the embedding
    (a little faster, but the copy costs vocab x hidden floats). Fewer, larger GEMVs per decode step."""
    out = _named_copy(model)
    targets = find_targets(out, embedding=False)
    if untranspose:
        _untranspose(out, targets)
    else:
        targets = [t for t in targets if t.op_type == "MatMul"]
    _pack_siblings(out, targets)
    _feed_packed_qkv(out)
    used = {i for n in out.graph.node for i in n.input}
    kept = [t for t in out.graph.initializer if t.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out


def weight_only_summary(result: PassResult | PipelineResult) -> dict[str, Any]:
    """The numbers a CLI prints: weight bytes before/after, nodes quantized, notes."""
    records = result.records if isinstance(result, PipelineResult) else [result.record]
    record = next(r for r in reversed(records) if r.name == WeightOnlyPass.name)
    extra = record.extra
    before, after = extra.get("weight_bytes_before", 0), extra.get("weight_bytes_after", 0)
    return {
        "weight_bytes_before": before,
        "weight_bytes_after": after,
        "compression": round(before / after, 3) if after else None,
        "matmuls_quantized": extra.get("matmuls_quantized", 0),
        "gathers_quantized": extra.get("gathers_quantized", 0),
        "already_quantized": extra.get("already_quantized", False),
        "notes": record.notes,
        "passes": [r.name for r in records],
    }


__all__ = [
    "DEFAULT_ACCURACY_LEVEL",
    "DEFAULT_BLOCK_SIZE",
    "WEIGHT_ONLY_OPS",
    "WeightOnlyPass",
    "WeightTarget",
    "find_targets",
    "layer_groups",
    "pack_weight_matmuls",
    "tensor_bytes",
    "weight_bytes",
    "weight_only_nodes",
    "weight_only_summary",
]
