"""Transformer fusion (Attention, SkipLayerNormalization, BiasGelu, ...) without torch.

``onnxruntime.transformers.optimizer.optimize_model`` runs ORT's own optimization first, and
that step imports torch. We do that step ourselves (a basic-level offline optimization
through a verified session, cached like any other) and then call the optimizer with
``opt_level=0``, which only runs the pattern fusions (pure onnx/numpy code).

The optimizer reads the head count and hidden size from the graph's Q/K/V reshapes; exporters
that write ``[batch, seq, -1, head_size]`` leave them unreadable, and the attention is then left
unfused. A model in a folder (``data.folder_of``) has them in ``config.json``, and they are used
when none are given. A wrong value there gives wrong results, not an error, so every fused
model is run against its source on generated inputs before it is returned (``AccuracyGateError``,
exit 1, when an output moved).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import onnx

from ortpilot.errors import AccuracyGateError, UsageError
from ortpilot.passes.base import Outcome, Pass, Setting, SourceModel, op_histogram
from ortpilot.passes.optimize import OptimizePass
from ortpilot.passes.options import FusionOptions
from ortpilot.providers.names import ProviderLike, resolve_providers

log = logging.getLogger("ortpilot")
_DECODER_IO = ("past", "present", "cache")
# How to force a model type auto-detection refused: only 'ortpilot optimize' has --fusion (tune detects it and
# says why not), so the way for a tune is to fuse first and tune the fused file.
FORCE_FUSION = "to force one, run 'ortpilot optimize MODEL -o FUSED.onnx --fusion TYPE' and tune or run FUSED.onnx"
# A fusion rewrites math, it does not approximate it: fp32 outputs move by ~1e-6 of their scale.
CHECK_ATOL = 1e-3
CHECK_RTOL = 1e-3


def fusion_model_types() -> list[str]:
    from onnxruntime.transformers.optimizer import MODEL_TYPES

    return sorted(MODEL_TYPES)


def detect_model_type(model: onnx.ModelProto) -> tuple[str | None, str]:
    """Guess the ``onnxruntime.transformers`` model type from the graph, with the reason."""
    ops: Counter = op_histogram(model)
    names = [v.name.lower() for v in list(model.graph.input) + list(model.graph.output)]
    fused = {"Attention", "MultiHeadAttention", "GroupQueryAttention"} & set(ops)
    if fused:
        return None, f"already fused ({', '.join(sorted(fused))} present); there is nothing left to fuse"
    if not ops.get("Softmax"):
        return None, (
            "no attention pattern (no Softmax) in the graph: this does not look like a transformer; "
            f"{FORCE_FUSION} (TYPE one of {', '.join(fusion_model_types())})"
        )
    decoder = any(any(k in n for k in _DECODER_IO) for n in names) or ops.get("Trilu")
    layernorm = ops.get("LayerNormalization", 0) or (ops.get("ReduceMean", 0) and ops.get("Sub", 0))
    rmsnorm = ops.get("SimplifiedLayerNormalization", 0) or (
        ops.get("Pow", 0) and ops.get("ReduceMean", 0) and not layernorm
    )
    if decoder:
        if rmsnorm and not layernorm:
            return None, (
                "a decoder with RMSNorm (Llama-style): the GPT-2 fusions do not match it; use the "
                "decoder fusion, or if the model is a qwen3 or phi one, fuse it with 'ortpilot optimize MODEL "
                "-o FUSED.onnx --fusion qwen3' (or phi) and tune or run FUSED.onnx"
            )
        return "gpt2", "decoder: past/present KV inputs or a causal mask with LayerNorm (GPT-2 style)"
    if ops.get("Conv") and layernorm:
        return "vit", "attention with a Conv patch embedding and LayerNorm (ViT style)"
    if layernorm:
        return "bert", "encoder: self-attention (Softmax) with LayerNorm and no KV cache (BERT style)"
    return None, f"attention without LayerNorm: no optimizer model type fits; {FORCE_FUSION}"


def _check_model_type(model_type: str) -> None:
    if model_type not in ("auto", *fusion_model_types()):
        raise UsageError(
            f"Unknown fusion type '{model_type}'. Choose auto, none or one of {', '.join(fusion_model_types())}."
        )


class FusionPass(Pass):
    """ORT transformer fusions for one model type (``auto`` detects it from the graph)."""

    name = "fusion"

    def __init__(
        self,
        model_type: str | FusionOptions | None = None,
        *,
        providers: Sequence[ProviderLike] | ProviderLike | None = None,
        use_gpu: bool = False,
        check: bool = True,
        verify: bool = True,
        **settings: Any,
    ) -> None:
        """``model_type`` (None: auto) or a whole ``FusionOptions``; ``settings``: its other fields
        (``num_heads``, ``hidden_size``). ``check``: refuse an unknown ``model_type`` now (it imports ORT's
        transformer optimizer, 0.2 s); without it ``transform`` refuses it, when that import is needed
        anyway. ``verify``: run the fused model against its source (module docstring)."""
        if isinstance(model_type, FusionOptions):
            self.config = replace(model_type, **settings)
        else:
            self.config = FusionOptions(**({"model_type": model_type} if model_type is not None else {}), **settings)
        if check:
            _check_model_type(self.model_type)
        self.providers = resolve_providers(providers)
        self.use_gpu = use_gpu
        self.verify = verify

    @classmethod
    def from_options(cls, options: FusionOptions, **_: Any) -> FusionPass:
        """A tune step: its ``FusionOptions`` (the model type is checked when the pass runs)."""
        return cls(options, check=False)

    model_type = Setting()
    num_heads = Setting()
    hidden_size = Setting()
    skip_layer_norm = Setting()

    def options(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type,
            "num_heads": self.num_heads,
            "hidden_size": self.hidden_size,
            "skip_layer_norm": self.skip_layer_norm,
            "providers": [str(p) for p in self.providers],
        }

    def label(self) -> str:
        return f"fusion({self.model_type}{'' if self.skip_layer_norm else ', no SkipLayerNorm'})"

    def transform(self, source: SourceModel) -> Outcome:
        from onnxruntime.transformers.optimizer import optimize_model

        _check_model_type(self.model_type)
        model_type, reason = self.model_type, "given"
        if model_type == "auto":
            model_type, reason = detect_model_type(source.proto)
            if model_type is None:
                raise UsageError(f"--fusion auto cannot tell the model type: {reason}.")
        heads, hidden, sized = self.num_heads, self.hidden_size, "given"
        if not heads and not hidden:
            heads, hidden, sized = _folder_dims(source)
        # ORT's own optimization step, done here so that optimize_model never imports torch.
        basic = OptimizePass("basic", self.providers).run(source).model
        quiet = logging.getLogger("onnxruntime.transformers.optimizer")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # its "model producer not matched" warning is noise here
        try:
            optimizer = optimize_model(
                basic,
                model_type=model_type,
                num_heads=heads,
                hidden_size=hidden,
                opt_level=0,
                use_gpu=self.use_gpu,
                optimization_options=_ort_options(model_type, self.skip_layer_norm),
            )
        finally:
            quiet.setLevel(level)
        stats = {k: int(v) for k, v in (optimizer.get_fused_operator_statistics() or {}).items()}
        model = optimizer.model
        notes = [f"model type {model_type} ({reason})"]
        if heads or hidden:
            notes.append(
                f"num_heads={heads}, hidden_size={hidden} ({sized}; the graph's own values win where it has them)"
            )
        if not any(stats.values()):
            notes.append("no fusion matched: the graph differs from the patterns ORT knows for this model type")
        elif self.verify:
            notes.append(_check_fused(source.proto, model, heads, hidden, sized))
        return Outcome(
            model,
            fused=stats,
            notes=notes,
            level="basic",
            providers=self.providers,
            ep_specific=True,
            extra={
                "model_type": model_type,
                "fused_operator_statistics": stats,
                "num_heads": heads,
                "hidden_size": hidden,
                "sizes_from": sized,
            },
        )


def _ort_options(model_type: str, skip_layer_norm: bool) -> Any:
    """ORT's own FusionOptions for ``model_type``, with its SkipLayerNormalization fusions off unless asked."""
    from onnxruntime.transformers.fusion_options import FusionOptions as OrtFusionOptions

    options = OrtFusionOptions(model_type)
    options.enable_skip_layer_norm = options.enable_skip_layer_norm and skip_layer_norm
    options.enable_bias_skip_layer_norm = options.enable_bias_skip_layer_norm and skip_layer_norm
    return options


def _folder_dims(source: SourceModel) -> tuple[int, int, str]:
    """(num_heads, hidden_size, where from) of the model folder the source file sits in; (0, 0, "") otherwise."""
    from ortpilot.data import folder_of

    folder = folder_of(source.path) if source.path is not None else None
    if folder is None or not (folder.get("num_heads") or folder.get("hidden_size")):
        return 0, 0, ""
    where = {folder.values[k].source for k in ("num_heads", "hidden_size") if k in folder.values}
    return int(folder.get("num_heads") or 0), int(folder.get("hidden_size") or 0), ", ".join(sorted(where))


def _check_fused(source: onnx.ModelProto, fused: onnx.ModelProto, heads: int, hidden: int, sized: str) -> str:
    """Run both models on generated inputs; an output that moved is an AccuracyGateError naming the sizes."""
    from ortpilot.graph.feeds import make_feeds, plan_feeds
    from ortpilot.passes.difference import output_difference

    try:
        feeds = make_feeds(source, plan=plan_feeds(source), seed=0)
    except UsageError as exc:  # a dim with no default: nothing to run it on
        return f"fused model not checked against the source: {exc}"
    given, taken = [i.name for i in source.graph.input], [i.name for i in fused.graph.input]
    if sorted(given) != sorted(taken):  # a fusion for another architecture rewired the graph's inputs
        raise UsageError(
            f"The fusion does not fit this graph: the fused model takes inputs {', '.join(taken) or 'none'}, the "
            f"source takes {', '.join(given)}. Give --fusion the model type the graph is (or leave it out: "
            "ortpilot detects it)."
        )
    difference = output_difference(source, fused, [feeds])
    worst, where, bound = difference.max_abs, difference.worst, difference.bound(CHECK_ATOL, CHECK_RTOL)
    if not difference.within(CHECK_ATOL, CHECK_RTOL):
        told = f" (num_heads={heads}, hidden_size={hidden} from {sized})" if heads or hidden else ""
        raise AccuracyGateError(
            f"Transformer fusion changed the outputs: max |fused - source| = {worst:.3g} on '{where}' "
            f"(allowed {bound:.3g}){told}. A wrong head count or hidden size computes a different "
            "attention without any error; fix config.json or pass --num-heads/--hidden-size. The model "
            "is left unfused."
        )
    return f"fused model checked against the source: max |difference| {worst:.2g} (allowed {bound:.2g})"


__all__ = ["FusionPass", "detect_model_type", "fusion_model_types"]
