"""Decoder weight-only quantization as one step: the GQA decoder fusion first (optional), then
weight-only INT4/INT8 (``ortpilot quantize --mode int4|int8-weights [--fuse]``).

Its own module because it composes two passes that are otherwise independent:
``decoder_fusion`` packs weight MatMuls with ``weight_only``'s rewrites, so ``weight_only``
may not import the fusion back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ortpilot.errors import UsageError
from ortpilot.passes.base import ModelLike, Pass, Pipeline, PipelineResult
from ortpilot.passes.weight_only import WeightOnlyPass
from ortpilot.quantmodes import DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE, INT4


def _fusion_pass() -> Pass:
    try:
        from ortpilot.passes.decoder_fusion import DecoderFusionPass
    except ImportError as exc:  # pragma: no cover - depends on the optional fusion extra
        raise UsageError(
            f"The decoder fusion pass is not available ({exc}); install ortpilot[fusion] or quantize without fuse=True."
        ) from exc
    return DecoderFusionPass()


def quantize_weight_only(
    model: ModelLike,
    out: str | os.PathLike | None = None,
    mode: str = INT4,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    symmetric: bool = True,
    accuracy_level: int | None = DEFAULT_ACCURACY_LEVEL,
    embedding: bool = True,
    nodes_to_exclude: Iterable[str] = (),
    fuse: bool = False,
) -> PipelineResult:
    """Weight-only quantize ``model`` (optionally after the GQA decoder fusion) and save it to ``out``.

    The records carry ``extra.weight_bytes_before/after``; ``fuse=True`` runs the decoder fusion
    pass first so the result has both GroupQueryAttention and MatMulNBits.
    """
    passes: list[Pass] = [_fusion_pass()] if fuse else []
    passes.append(
        WeightOnlyPass(
            mode,
            block_size=block_size,
            symmetric=symmetric,
            accuracy_level=accuracy_level,
            embedding=embedding,
            nodes_to_exclude=nodes_to_exclude,
        )
    )
    result = Pipeline(passes).run(model)
    if out is not None:
        result.save(Path(out))
    return result


__all__ = ["quantize_weight_only"]
