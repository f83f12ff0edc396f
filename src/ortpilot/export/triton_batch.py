"""Whether a model's first dim is a batch dim Triton's dynamic batcher may split and join.

Triton's ONNX Runtime backend batches along dim 0 when ``max_batch_size`` > 0: requests are
stacked on it and each request gets its own rows back. That is right only when every input's
and output's first dim is dynamic and rows do not interact. A dim named like batch is taken
at its word (:func:`~ortpilot.graph.tensors.has_batch_dim`). Exporters often leave the batch
dim unnamed (``-1``) or give it a generated name (tf2onnx's ``unk__214``, Paddle's
``DynamicDimension.0``); then ortpilot runs the model, on the CPU with ORT's defaults, on two
rows and checks that each row's outputs are those it gives beside a copy of itself (same batch
size, same kernels): rows that influence each other (a reduction over dim 0, detections of
varying count) make it no batch dim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ortpilot.eps import CPU_EP
from ortpilot.graph.tensors import TensorSpec, has_batch_dim


@dataclass(frozen=True)
class BatchDecision:
    """Whether dim 0 is Triton's batch dim, and the one sentence that says how that was decided."""

    batchable: bool
    evidence: str
    # how far a row's outputs in a 2-row batch are from its outputs alone (kernel numerics), when run
    batch_vs_single: float | None = None


def first_dims(inputs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{t.name}: {t.dims[0] if t.dims else 'scalar'}" for t in inputs)


def decide_batching(
    model_path: Path,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    feeds: Mapping[str, np.ndarray] | None,
) -> BatchDecision:
    """Named like batch: yes. Else every first dim dynamic and rows independent when run: yes. Else no."""
    if has_batch_dim(inputs, outputs):
        return BatchDecision(True, "every input's first dim is dynamic and named like batch, every output's dynamic")
    fixed = [t.name for t in [*inputs, *outputs] if not t.dims or t.dims[0] != -1]
    if not inputs or fixed:
        return BatchDecision(
            False, f"not every input's and output's first dim is dynamic ({', '.join(fixed) or 'no inputs'})"
        )
    if feeds is None or any(name not in feeds or np.ndim(feeds[name]) == 0 for name in (t.name for t in inputs)):
        return BatchDecision(
            False,
            "dim 0 is dynamic everywhere but not named like batch, and without sample inputs ortpilot cannot "
            "check that its rows are independent",
        )
    return _probe(model_path, inputs, outputs, feeds)


def _probe(
    model_path: Path, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], feeds: Mapping[str, np.ndarray]
) -> BatchDecision:
    import onnxruntime as ort

    a = {t.name: np.ascontiguousarray(feeds[t.name][:1]) for t in inputs}
    # A second row with the same values in another order: valid wherever the first is (token ids, bytes).
    b = {name: np.roll(row.reshape(-1), 1).reshape(row.shape) for name, row in a.items()}
    names = [t.name for t in outputs]
    try:
        session = ort.InferenceSession(str(model_path), providers=[CPU_EP])
        single = session.run(names, a)
        pairs = {
            key: session.run(names, {n: np.concatenate([x[n], y[n]]) for n in a})
            for key, (x, y) in {"ab": (a, b), "aa": (a, a), "bb": (b, b)}.items()
        }
    except Exception as exc:  # ORT refusing 2 rows is the answer: dim 0 is not free to grow
        text = " ".join(str(exc).split())[:300]
        return BatchDecision(False, f"dim 0 is not named like batch, and the model fails on 2 rows ({text})")
    for i, name in enumerate(names):
        got = [pairs["ab"][i], pairs["aa"][i], pairs["bb"][i]]
        if any(np.ndim(o) == 0 or o.shape[0] != 2 for o in got) or np.ndim(single[i]) == 0 or single[i].shape[0] != 1:
            return BatchDecision(
                False,
                f"dim 0 is not named like batch, and output '{name}' does not follow it "
                f"({list(np.shape(single[i]))} for 1 row, {list(np.shape(got[0]))} for 2)",
            )
        if not (_same(got[0][0], got[1][0]) and _same(got[0][1], got[2][1])):
            return BatchDecision(
                False,
                f"dim 0 is not named like batch, and its rows are not independent: output '{name}' of a row "
                "changes with the row beside it (run on 2 rows)",
            )
    drift = max(_relative(pairs["aa"][i][0], single[i][0]) for i in range(len(names)))
    return BatchDecision(
        True,
        "dim 0 is dynamic in every input and output but not named like batch, and running the model on 2 rows "
        "gave each row the outputs it gets beside a copy of itself (its rows are independent)",
        drift,
    )


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    """Equal, up to float noise far below any effect of a neighbouring row."""
    if x.shape != y.shape:
        return False
    if not np.issubdtype(x.dtype, np.floating):
        return bool(np.array_equal(x, y))
    return _relative(x, y) <= 1e-6


def _relative(x: np.ndarray, y: np.ndarray) -> float:
    """Max absolute difference over the larger magnitude (0 for two empty or all-zero arrays)."""
    if not np.issubdtype(np.asarray(x).dtype, np.floating):
        return 0.0 if np.array_equal(x, y) else 1.0
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x64.size == 0:
        return 0.0
    scale = max(float(np.nanmax(np.abs(x64))), float(np.nanmax(np.abs(y64))), 1e-30)
    return float(np.nanmax(np.abs(x64 - y64))) / scale


__all__ = ["BatchDecision", "decide_batching", "first_dims"]
