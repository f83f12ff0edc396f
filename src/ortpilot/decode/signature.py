"""Which input is what in an ONNX decoder: token ids, mask, positions, KV cache, logits.

Exporters name these differently (Optimum's ``past_key_values.N.key`` -> ``present.N.key``,
old GPT-2 exports' stacked ``past_N`` -> ``present_N`` of shape [2, batch, heads, past, dim],
``cache_position``, and GroupQueryAttention graphs that take ``seqlens_k`` and
``total_sequence_length`` as inputs), so the loops read roles from one record instead of
guessing names themselves. A model that does not fit is an exit-2 error that names what was
found and what is missing; ``mapping`` overrides any role (and pairs a past input with its
present output) when the names are unusual.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ortpilot.errors import UsageError
from ortpilot.graph.feeds import embedding_bounds
from ortpilot.graph.prune import cone, read_names
from ortpilot.graph.shapes import InputInfo, graph_inputs, model_max_positions
from ortpilot.passes.rotary import constant_tables

ROLES = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "cache_position",
    "seqlens_k",
    "total_sequence_length",
    "logits",
)
_ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "input_ids": ("input_ids", "input", "tokens", "ids", "token_ids"),
    "attention_mask": ("attention_mask", "mask", "attn_mask"),
    "position_ids": ("position_ids", "positions"),
    "cache_position": ("cache_position",),
    "seqlens_k": ("seqlens_k",),
    "total_sequence_length": ("total_sequence_length", "total_seq_len"),
    "logits": ("logits", "lm_logits", "output", "scores"),
}
_PAST = re.compile(r"past", re.I)
_SEQ_DIM = re.compile(r"(past|seq|len|total|cache)", re.I)
_BATCH_DIM = re.compile(r"batch", re.I)
_INDEX = re.compile(r"(\d+)")
GQA_OPS = ("GroupQueryAttention",)


@dataclass(frozen=True)
class CacheEntry:
    """One past input and the present output that becomes it at the next step.

    ``dims`` are the past input's declared dims; ``seq_axis`` grows by one per generated token;
    ``batch_axis`` takes the batch size. Every other dim must be a fixed number.
    """

    past: str
    present: str
    dims: tuple[int | str | None, ...]
    seq_axis: int
    batch_axis: int
    dtype: np.dtype

    def shape(self, batch: int, length: int) -> tuple[int, ...]:
        out = []
        for axis, dim in enumerate(self.dims):
            out.append(batch if axis == self.batch_axis else length if axis == self.seq_axis else int(dim))  # type: ignore[arg-type]
        return tuple(out)


@dataclass(frozen=True)
class DecoderSignature:
    """Roles of a decoder's inputs and outputs, plus what the loops need to know about it."""

    input_ids: str
    logits: str
    attention_mask: str | None = None
    position_ids: str | None = None
    cache_position: str | None = None
    seqlens_k: str | None = None
    total_sequence_length: str | None = None
    cache: tuple[CacheEntry, ...] = ()
    extra_inputs: tuple[str, ...] = ()
    vocab_size: int | None = None
    max_positions: int | None = None
    gqa_nodes: int = 0
    gqa_on_every_cache: bool = False
    gqa_reads_mask: bool = False
    unread_inputs: tuple[str, ...] = ()  # fed because ORT requires them, read by no node
    inputs: Mapping[str, InputInfo] = field(default_factory=dict)

    @property
    def has_cache(self) -> bool:
        return bool(self.cache)

    @property
    def kv_dtype(self) -> np.dtype | None:
        return self.cache[0].dtype if self.cache else None

    def outside_vocabulary(self, ids: Iterable[int]) -> list[int]:
        """The distinct ``ids`` the model never produces (below 0, or at or past its vocabulary where known)."""
        return sorted({t for t in ids if t < 0 or (self.vocab_size and t >= self.vocab_size)})

    @property
    def supports_shared_buffer(self) -> bool:
        """GQA reads every past/present pair, so one max-length buffer can be both."""
        return self.gqa_on_every_cache and self.has_cache

    @property
    def no_shared_buffer_reason(self) -> str:
        """Why one shared buffer cannot serve as both past and present ("" when it can): the shared
        loop and the batched loop refuse a model with this one reason."""
        if self.supports_shared_buffer:
            return ""
        if not self.has_cache:
            return "it has no KV cache"
        if not self.gqa_nodes:
            return "it has no GroupQueryAttention"
        return "its GroupQueryAttention nodes do not read every past input"

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "cache_position": self.cache_position,
            "seqlens_k": self.seqlens_k,
            "total_sequence_length": self.total_sequence_length,
            "logits": self.logits,
            "cache": [
                {
                    "past": c.past,
                    "present": c.present,
                    "dims": list(c.dims),
                    "seq_axis": c.seq_axis,
                    "dtype": str(c.dtype),
                }
                for c in self.cache
            ],
            "kv_dtype": str(self.kv_dtype) if self.cache else None,
            "vocab_size": self.vocab_size,
            "max_positions": self.max_positions,
            "gqa_nodes": self.gqa_nodes,
            "supports_shared_buffer": self.supports_shared_buffer,
            "gqa_reads_attention_mask": self.gqa_reads_mask,
            "unread_inputs": list(self.unread_inputs),
        }


def detect_signature(model: onnx.ModelProto, mapping: Mapping[str, str] | None = None) -> DecoderSignature:
    """Find the decoder roles in ``model`` (see the module docstring).

    ``mapping``: role -> name for any of :data:`ROLES`, and past input name -> present output
    name for cache pairs the usual patterns miss.
    """
    inputs = {i.name: i for i in graph_inputs(model)}
    outputs = [o.name for o in model.graph.output]
    mapping, dim_values = _read_mapping(dict(mapping or {}), inputs, outputs)
    pairs = _cache_pairs(inputs, outputs, {k: v for k, v in mapping.items() if k in inputs})
    roles = _assign_roles(inputs, outputs, mapping, pairs)
    _check_roles(roles, pairs, inputs, outputs)
    gqa = [n for n in model.graph.node if n.op_type in GQA_OPS]
    cache = tuple(_cache_entry(inputs[p], q, {**_gqa_head_dims(gqa, inputs[p]), **dim_values}) for p, q in pairs)
    reads_mask = _gqa_reads_mask(model, gqa, roles["attention_mask"])
    bounds = embedding_bounds(model)
    read = read_names(model)
    return DecoderSignature(
        input_ids=roles["input_ids"],
        logits=roles["logits"],  # type: ignore[arg-type]
        attention_mask=roles["attention_mask"],
        position_ids=roles["position_ids"],
        cache_position=roles["cache_position"],
        seqlens_k=roles["seqlens_k"],
        total_sequence_length=roles["total_sequence_length"],
        cache=cache,
        vocab_size=bounds.get(roles["input_ids"]) or _logits_vocab(model, roles["logits"]),  # type: ignore[arg-type]
        max_positions=_max_positions(model),
        gqa_nodes=len(gqa),
        gqa_on_every_cache=_gqa_on_every_cache(gqa, cache),
        gqa_reads_mask=reads_mask,
        unread_inputs=tuple(n for n in inputs if n not in read),
        inputs=dict(inputs),
    )


def _read_mapping(
    mapping: dict[str, str], inputs: Mapping[str, InputInfo], outputs: list[str]
) -> tuple[dict[str, str], dict[str, int]]:
    """Split ``--map`` into role/pair names and numbers for symbolic dims; refuse names the model lacks."""
    dim_names = {d for i in inputs.values() for d in i.dims if isinstance(d, str)}
    dim_values = {k: int(v) for k, v in mapping.items() if k in dim_names and str(v).isdigit()}
    mapping = {k: v for k, v in mapping.items() if k not in dim_values}
    unknown = [k for k in mapping if k not in ROLES and k not in inputs]
    if unknown:
        raise UsageError(
            f"Mapping key(s) {unknown} are neither roles ({', '.join(ROLES)}), inputs of the model "
            f"({', '.join(inputs)}) nor symbolic dims given a number ({', '.join(sorted(dim_names))})."
        )
    for key, name in mapping.items():
        pool = outputs if key == "logits" or key in inputs else list(inputs)
        if name not in pool:
            raise UsageError(
                f"Mapping {key}={name}: the model has no such "
                f"{'output' if pool is outputs else 'input'} (it has {', '.join(pool)})."
            )
    return mapping, dim_values


def _assign_roles(
    inputs: Mapping[str, InputInfo], outputs: list[str], mapping: Mapping[str, str], pairs: list[tuple[str, str]]
) -> dict[str, str | None]:
    """Role -> name for every role: the mapping's, else the usual names among what the cache left."""
    taken_in = {p for p, _ in pairs}
    taken_out = {q for _, q in pairs}
    roles = {
        role: mapping.get(role) or _find_role(role, [n for n in inputs if n not in taken_in])
        for role in ROLES
        if role != "logits"
    }
    roles["logits"] = mapping.get("logits") or _find_logits([o for o in outputs if o not in taken_out])
    return roles


def _check_roles(
    roles: Mapping[str, str | None], pairs: list[tuple[str, str]], inputs: Mapping[str, InputInfo], outputs: list[str]
) -> None:
    """Refuse a model without input_ids and logits, or with inputs the loops would not know how to feed."""
    missing = [r for r in ("input_ids", "logits") if not roles[r]]
    if missing:
        raise UsageError(
            f"This model does not look like a decoder: no {' and no '.join(missing)} found "
            f"(found: {', '.join(f'{r}={v}' for r, v in roles.items() if v) or 'no known role'}; "
            f"{len(pairs)} past/present pair(s)). "
            f"Inputs: {', '.join(inputs) or 'none'}; outputs: {', '.join(outputs) or 'none'}. "
            "Expected input_ids -> logits, with past_key_values.N.key/value -> present.N.key/value "
            "(or past_N -> present_N). Name the roles explicitly with --map ROLE=NAME "
            f"(roles: {', '.join(ROLES)}) or --map PAST_INPUT=PRESENT_OUTPUT."
        )
    used = {v for v in roles.values() if v} | {p for p, _ in pairs}
    extra = tuple(n for n in inputs if n not in used)
    if extra:
        raise UsageError(
            f"Decoder inputs {', '.join(extra)} have no known role, so the loops cannot feed them. "
            f"Found: {', '.join(f'{r}={v}' for r, v in roles.items() if v)}, "
            f"{len(pairs)} past/present pair(s). Map them with --map ROLE=NAME (roles: "
            f"{', '.join(ROLES)}) or --map PAST_INPUT=PRESENT_OUTPUT."
        )


def _gqa_on_every_cache(gqa: list[onnx.NodeProto], cache: tuple[CacheEntry, ...]) -> bool:
    """Every past input is a GroupQueryAttention's past key or value (so one buffer can serve past and present)."""
    pasts = {n.input[3] for n in gqa if len(n.input) > 4} | {n.input[4] for n in gqa if len(n.input) > 4}
    return bool(cache) and all(c.past in pasts for c in cache)


def _gqa_reads_mask(model: onnx.ModelProto, gqa: list[onnx.NodeProto], attention_mask: str | None) -> bool:
    """Whether the GQA nodes' seqlens_k is computed from the attention mask."""
    if not gqa or not attention_mask:
        return False
    _, sources = cone(model, [n.input[5] for n in gqa if len(n.input) > 5])
    return attention_mask in sources


def _find_role(role: str, names: Iterable[str]) -> str | None:
    names = list(names)
    for candidate in _ROLE_NAMES[role]:
        for name in names:
            if name.lower() == candidate:
                return name
    return None


def _find_logits(names: list[str]) -> str | None:
    exact = _find_role("logits", names)
    if exact:
        return exact
    return names[0] if len(names) == 1 else None


def _cache_pairs(
    inputs: Mapping[str, InputInfo], outputs: list[str], explicit: Mapping[str, str]
) -> list[tuple[str, str]]:
    """Past input -> present output, by the usual renamings, in layer order."""
    pairs = dict(explicit)
    out_set = set(outputs)
    for name in inputs:
        if name in pairs or not _PAST.search(name):
            continue
        for present in (
            name.replace("past_key_values", "present"),
            name.replace("past_key_values", "present_key_values"),
            re.sub("past", "present", name, flags=re.I),
            re.sub("past", "present", name, flags=re.I).replace("present_key_values", "present"),
        ):
            if present in out_set and present != name:
                pairs[name] = present
                break
    dangling = [n for n in inputs if _PAST.search(n) and n not in pairs]
    if dangling:
        raise UsageError(
            f"Past input(s) {', '.join(dangling)} have no matching present output "
            f"(outputs: {', '.join(outputs)}). Pair them with --map PAST_INPUT=PRESENT_OUTPUT."
        )

    def order(item: tuple[str, str]) -> tuple[int, int, str]:
        idx = _INDEX.search(item[0])
        kind = 1 if "value" in item[0].lower() else 0
        return (int(idx.group(1)) if idx else -1, kind, item[0])

    return sorted(pairs.items(), key=order)


def _gqa_head_dims(gqa: list[onnx.NodeProto], info: InputInfo) -> dict[str, int]:
    """A symbolic head_dim on a GQA past (onnxruntime-genai's ``kv_cache_dim``), from the node's scale."""
    last = info.dims[-1] if info.dims else None
    if not isinstance(last, str):
        return {}
    for node in gqa:
        if info.name in node.input[3:5]:
            scale = next((a.f for a in node.attribute if a.name == "scale"), 0.0)
            if scale > 0:
                return {last: round(1.0 / scale**2)}
    return {}


def _cache_entry(info: InputInfo, present: str, dim_values: Mapping[str, int]) -> CacheEntry:
    dims = tuple(dim_values.get(d, d) if isinstance(d, str) else d for d in info.dims)
    symbolic = [a for a, d in enumerate(dims) if not isinstance(d, int)]
    named_seq = [a for a in symbolic if isinstance(dims[a], str) and _SEQ_DIM.search(dims[a])]
    named_batch = [a for a in symbolic if isinstance(dims[a], str) and _BATCH_DIM.search(dims[a])]
    rank = len(dims)
    seq_axis = named_seq[0] if named_seq else (rank - 2 if rank >= 3 else -1)
    batch_axis = named_batch[0] if named_batch else (1 if rank == 5 else 0)
    others = [a for a in symbolic if a not in (seq_axis, batch_axis)]
    if rank < 3 or seq_axis < 0 or others:
        raise UsageError(
            f"Past input {info.name} has dims {list(dims)}: expected [batch, heads, past, "
            "head_dim] (or stacked [2, batch, heads, past, head_dim]) with fixed heads and "
            "head_dim. Give a symbolic dim its number with --map DIM=VALUE (e.g. head_dim=64)."
        )
    return CacheEntry(info.name, present, dims, seq_axis, batch_axis, np.dtype(info.dtype))


def _logits_vocab(model: onnx.ModelProto, logits: str) -> int | None:
    for out in model.graph.output:
        if out.name == logits:
            dims = out.type.tensor_type.shape.dim
            if dims and dims[-1].HasField("dim_value"):
                return int(dims[-1].dim_value)
    return None


def _max_positions(model: onnx.ModelProto) -> int | None:
    """The recorded context limit, else the rows of a constant GQA rotary table (past them GQA fails)."""
    rows = [int(table.dims[0]) for table in constant_tables(model)]
    limits = [x for x in (model_max_positions(model), min(rows) if rows else None) if x is not None]
    return min(limits) if limits else None


def is_kv_decoder(model: str | os.PathLike | onnx.ModelProto) -> bool:
    """Whether ``model`` is a decoder with a KV cache (what generation, not raw logits, should judge)."""
    from ortpilot.modelio import load_model

    try:
        proto = model if isinstance(model, onnx.ModelProto) else load_model(model, load_external_data=False)
        return detect_signature(proto).has_cache
    except UsageError:
        return False
