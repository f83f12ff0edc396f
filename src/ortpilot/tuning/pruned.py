"""The model pruned to the outputs the deployment reads (``--outputs``), as a model-cache entry.

Every candidate of a tune is built from this file (``tuning.transform`` keys its entries by the
source's hash, so the pruned graph gets its own fused and quantized variants), and ``verify
--max-slowdown`` times ORT's default session on it, as the tune did. The entry is keyed by the
source's hash, the ORT version (the IR version it is saved for) and the output names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort

from ortpilot.artifacts.atomic import save_model
from ortpilot.artifacts.store import ModelStore, cache_key
from ortpilot.graph.prune import prune_to_outputs
from ortpilot.modelio import file_sha256, load_model

PRUNE_VERSION = 1  # bump when prune_to_outputs changes what it writes


def pruned_model(source: Path, outputs: Sequence[str]) -> Path:
    """``source`` pruned to ``outputs`` (``graph.prune.prune_to_outputs``: bad names raise ``UsageError``)."""
    names = list(outputs)
    sha = file_sha256(source)
    key = cache_key(
        model_sha256=sha,
        ort_version=ort.__version__,
        providers=[],
        level="prune",
        extra={"outputs": names, "version": PRUNE_VERSION},
    )

    def build(dest: Path) -> dict[str, object]:
        pruned = prune_to_outputs(load_model(source), names)
        save_model(pruned, dest)
        return {"outputs": names}

    path, _ = ModelStore().get_or_create(key, build, meta={"source_sha256": sha, "pass": "prune"})
    return path


__all__ = ["pruned_model"]
