"""Decoder fusion: attention into ORT's GroupQueryAttention with onnxscript's ORT fusions.

``onnxscript.rewriter.ort_fusions`` recognises a Hugging Face Llama-style export (SDPA, KV
concat, repeat_kv, rotary embedding, RMSNorm) and rewrites it into ``com.microsoft`` ops. A
GQA graph is what lets the decode layer's shared-buffer loop write the cache in place. The
pass accepts the result only when every layer got its GroupQueryAttention and the fused
model's outputs match the source's (an empty past and a filled one); otherwise it says which
pattern stopped short, because a half-fused decoder is slower to debug than an unfused one.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ortpilot.artifacts.atomic import save_model
from ortpilot.artifacts.store import ModelStore, cache_key
from ortpilot.errors import AccuracyGateError, UsageError, VerificationError
from ortpilot.graph.feeds import embedding_bounds
from ortpilot.graph.prune import clear_unread_outputs
from ortpilot.graph.shapes import InputInfo, graph_inputs, model_max_positions
from ortpilot.modelio import load_model
from ortpilot.passes.base import ModelLike, Outcome, Pass, PassResult, SourceModel, op_histogram
from ortpilot.passes.difference import OutputDifference, output_difference
from ortpilot.passes.options import CHECK_NEW, CHECK_PAST, CHECK_TOKENS, DecoderFusionOptions
from ortpilot.passes.rotary import DEFAULT_MAX_POSITIONS, fold_rotary_tables
from ortpilot.passes.weight_only import pack_weight_matmuls

log = logging.getLogger("ortpilot")
FUSED_OPS = (
    "GroupQueryAttention",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "RotaryEmbedding",
    "MultiHeadAttention",
    "Attention",
)
_PAST = re.compile(r"past", re.I)
_BATCH = re.compile(r"batch", re.I)


class FusionIncompleteError(VerificationError):
    """onnxscript's fusions stopped short of a GroupQueryAttention per layer (the model stays unfused)."""


def count_layers(model: onnx.ModelProto) -> int:
    """Attention layers, from the KV inputs: one key per layer, or one stacked past_N per layer."""
    pasts = [i.name for i in graph_inputs(model) if _PAST.search(i.name)]
    keys = [n for n in pasts if "key" in n.lower().replace("key_values", "")]
    return len(keys) if keys else len(pasts)


def diagnose(counts: dict[str, int], layers: int) -> str:
    """Which of onnxscript's patterns stopped short, and what usually causes it."""
    sdpa, gqa = counts.get("sdpa", 0), counts.get("gqa", 0)
    rotary = counts.get("rotary_embedding", 0) + counts.get("partial_rotary_embedding", 0)
    if sdpa < layers:
        return (
            f"SDPA matched {sdpa} of {layers} layers: attention must be Softmax(Q @ K^T * scale + mask) @ V "
            "(a TorchScript export's Div(1, Sqrt) scale or a different op order does not match)"
        )
    if gqa < layers:
        hint = (
            ""
            if rotary >= 2 * layers
            else (
                f"; RotaryEmbedding fused only {rotary} of {2 * layers} "
                "(Slices need explicit axes, cos/sin must come from position_ids)"
            )
        )
        return (
            f"SDPA matched every layer but GQA only {gqa} of {layers}: the cache must be Concat(past, new) "
            "on the sequence axis, repeat_kv Unsqueeze/Expand/Reshape (not Tile), and the causal mask built "
            f"from Shape(input_ids) and Shape(past) as a transformers export does{hint}"
        )
    return f"every layer fused ({gqa} GroupQueryAttention)"


class DecoderFusionPass(Pass):
    """onnxscript ORT fusions, accepted only with a GQA per layer and matching outputs."""

    name = "decoder-fusion"
    revision = 2  # 2: constant rotary tables, unread optional outputs cleared

    def __init__(
        self,
        options: DecoderFusionOptions | None = None,
        *,
        use_cache: bool = False,
        store: ModelStore | None = None,
        **settings: Any,
    ) -> None:
        """``options`` (None: the defaults) and ``settings``, its fields or changes to it (``atol``, ``rtol``,
        ``seed``, ``pack``, ``max_positions``: the rows of the constant rotary tables, None for the export's
        recorded context length, else 8192; 0 keeps the per-step computation and no length limit).
        ``use_cache``: keep the fused model in the content-addressed ``store``."""
        self.config = config = replace(options or DecoderFusionOptions(), **settings)
        self.atol, self.rtol, self.seed, self.pack = config.atol, config.rtol, config.seed, config.pack
        self.max_positions = config.max_positions
        self.use_cache, self.store = use_cache, store

    @classmethod
    def from_options(cls, options: DecoderFusionOptions, **_: Any) -> DecoderFusionPass:
        """A tune step: its ``DecoderFusionOptions``."""
        return cls(options)

    def options(self) -> dict[str, Any]:
        return {
            "atol": self.atol,
            "rtol": self.rtol,
            "seed": self.seed,
            "pack": self.pack,
            "max_positions": self.max_positions,
        }

    def label(self) -> str:
        return "gqa"

    def transform(self, source: SourceModel) -> Outcome:
        layers = count_layers(source.proto)
        if not layers:
            raise UsageError(
                "The decoder fusion needs a model with a KV cache (past_* inputs); this one has "
                "none, so there is no GroupQueryAttention to build."
            )
        existing = op_histogram(source.proto).get("GroupQueryAttention", 0)
        if existing:
            return Outcome(
                source.proto,
                fused={"GroupQueryAttention": existing},
                notes=[f"already fused: {existing} GroupQueryAttention"],
                extra={"layers": layers},
            )
        return self._cached(source) if self.use_cache else self._fuse(source)

    def _cached(self, source: SourceModel) -> Outcome:
        """The fused model from the content-addressed cache (a SmolLM2 fusion takes about a minute)."""
        from onnxscript import __version__ as onnxscript_version

        key = cache_key(
            model_sha256=source.sha256,
            ort_version=ort.__version__,
            providers=[],
            level=self.name,
            extra={"options": self.options(), "onnxscript": onnxscript_version, "revision": self.revision},
        )

        def build(dest: Path) -> dict[str, Any]:
            outcome = self._fuse(source)
            save_model(outcome.model, dest)
            return {"fused": outcome.fused, "notes": outcome.notes, "extra": outcome.extra}

        store = self.store or ModelStore()
        path, hit = store.get_or_create(key, build, meta={"source_sha256": source.sha256, "options": self.options()})
        meta = store.read_entry(key).get("meta", {})
        notes = [*meta.get("notes", []), f"{'cache hit' if hit else 'built and cached'} ({key[:12]})"]
        return Outcome(
            load_model(path),
            fused=meta.get("fused", {}),
            notes=notes,
            extra={**meta.get("extra", {}), "cache_key": key, "cache_hit": hit, "cache_path": str(path)},
        )

    def _fuse(self, source: SourceModel) -> Outcome:
        layers = count_layers(source.proto)
        fused, counts = _optimize(source.proto)
        unpacked = op_histogram(fused)
        gqa = unpacked.get("GroupQueryAttention", 0)
        verdict = diagnose(counts, layers)
        if gqa != layers:
            raise FusionIncompleteError(
                f"Decoder fusion incomplete: {gqa} GroupQueryAttention for {layers} layers. "
                f"{verdict}. The model is left unfused."
            )
        matmuls = unpacked.get("MatMul", 0)
        if self.pack:  # q/k/v and gate/up as one GEMV each: a decode step is a chain of small kernels
            fused = pack_weight_matmuls(fused, untranspose=False)
        positions = (
            self.max_positions
            if self.max_positions is not None
            else model_max_positions(source.proto) or DEFAULT_MAX_POSITIONS
        )
        rotary = fold_rotary_tables(fused, positions) if positions else None
        cleared = clear_unread_outputs(fused)
        error = _max_error(source.proto, fused, self.seed)
        bound = error.bound(self.atol, self.rtol)
        if not error.within(self.atol, self.rtol):
            raise AccuracyGateError(
                f"Decoder fusion changed the outputs: max |fused - source| = {error.max_abs:.3g} on "
                f"'{error.worst}' (allowed {bound:.3g} = atol {self.atol} + rtol {self.rtol} x "
                f"{error.scale:.3g}). The model is left unfused."
            )
        ops = op_histogram(fused)
        notes = [verdict]
        if self.pack and ops.get("MatMul", 0) < matmuls:
            notes.append(f"weight MatMuls reading the same input packed: {matmuls} -> {ops.get('MatMul', 0)}")
        if cleared:
            notes.append(f"{cleared} optional outputs nobody reads left unnamed, so ORT skips them")
        if rotary is not None:
            notes.append(
                f"rotary tables constant for {rotary.max_positions} positions ({rotary.nodes_removed} "
                "nodes no longer run per token; longer sequences are refused)"
                if rotary.folded
                else f"rotary tables left computed: {rotary.reason}"
            )
        return Outcome(
            fused,
            fused={op: ops[op] for op in FUSED_OPS if ops.get(op)},
            notes=notes,
            extra={
                "layers": layers,
                "onnxscript_counts": counts,
                "max_abs_error": error.max_abs,
                "matmuls_before_packing": matmuls,
                "matmuls": ops.get("MatMul", 0),
                "rotary": vars(rotary) if rotary is not None else None,
                "unread_outputs_cleared": cleared,
            },
        )


def fuse_decoder(
    model: ModelLike | SourceModel,
    atol: float = 1e-3,
    rtol: float = 1e-3,
    *,
    use_cache: bool = False,
    max_positions: int | None = None,
) -> PassResult:
    """Run :class:`DecoderFusionPass` (raises when the fusion is incomplete or wrong)."""
    return DecoderFusionPass(atol=atol, rtol=rtol, use_cache=use_cache, max_positions=max_positions).run(model)


def summary(result: PassResult) -> str:
    rec = result.record
    fused = ", ".join(f"{v} {k}" for k, v in rec.fused.items()) or "nothing"
    err = rec.extra.get("max_abs_error")
    cached = {True: ", from the cache", False: ", cached"}.get(rec.extra.get("cache_hit"), "")
    rotary = rec.extra.get("rotary") or {}
    limit = f"; rotary tables for {rotary['max_positions']} positions" if rotary.get("folded") else ""
    return (
        f"decoder fusion: {fused} for {rec.extra.get('layers')} layers{limit}"
        + (f"; max output error {err:.2g}" if err is not None else "")
        + f" ({rec.seconds:.1f} s{cached})"
    )


def _optimize(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    try:
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort
    except ImportError:
        raise UsageError("The decoder fusion needs onnxscript: pip install onnxscript.") from None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    fused, counts = optimize_for_ort(ir.serde.deserialize_model(copy))
    return ir.serde.serialize_model(fused), dict(counts)


def _check_feeds(model: onnx.ModelProto, past: int, new: int, seed: int) -> dict[str, np.ndarray]:
    """Feeds for a decoder by name: ids < vocab, mask ones, positions past..past+new, random past."""
    rng = np.random.default_rng(seed)
    bounds = embedding_bounds(model)
    feeds: dict[str, np.ndarray] = {}
    for info in graph_inputs(model):
        name = info.name.lower()
        if _PAST.search(name):
            feeds[info.name] = rng.standard_normal(_past_shape(info, past)).astype(info.dtype)
        elif "mask" in name:
            feeds[info.name] = np.ones((1, past + new), dtype=info.dtype)
        elif "position" in name:
            positions = np.arange(past, past + new)
            feeds[info.name] = (positions if "cache" in name else positions[None, :]).astype(info.dtype)
        else:
            feeds[info.name] = rng.integers(0, bounds.get(info.name, 2), size=(1, new)).astype(info.dtype)
    return feeds


def _past_shape(info: InputInfo, past: int) -> tuple[int, ...]:
    symbolic = [a for a, d in enumerate(info.dims) if not isinstance(d, int)]
    batch = next(
        (a for a in symbolic if isinstance(info.dims[a], str) and _BATCH.search(info.dims[a])),
        symbolic[0] if symbolic else -1,
    )
    return tuple(
        1 if a == batch else past if a in symbolic else int(d)  # type: ignore[arg-type]
        for a, d in enumerate(info.dims)
    )


def _max_error(source: onnx.ModelProto, fused: onnx.ModelProto, seed: int) -> OutputDifference:
    """Largest output difference over an empty-past prefill and a step with a filled past."""
    return output_difference(
        source,
        fused,
        [_check_feeds(source, past, new, seed) for past, new in ((0, CHECK_TOKENS), (CHECK_PAST, CHECK_NEW))],
    )
