"""Functions behind CLI commands that are not a single layer's job (thin glue, no logic of its own)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import os

import onnx

from ortpilot.errors import StampMismatchError
from ortpilot.graph.feeds import make_feeds, plan_feeds
from ortpilot.graph.shapes import parse_shape_args
from ortpilot.session import SessionSettings, VerifiedSession
from ortpilot.session import load as load_verified


def load(model: str | os.PathLike | bytes | onnx.ModelProto, providers: Any = None, policy: str = "warn",
         *, model_file: str | None = None, **kwargs: Any) -> VerifiedSession:
    """``ortpilot.load``: the verified session, plus rebuild-on-mismatch for stamped artifacts.

    ``model`` may be a model folder (optimum export, Hugging Face ``onnx/``, onnxruntime-genai):
    its model file is used, ``model_file`` choosing among several. The session layer refuses an
    offline-optimized model stamped for another EP or ORT; when the stamp names a source model
    that still exists unchanged, the passes layer rebuilds it for what is in use (logged) and the
    rebuilt model is loaded instead.
    """
    if isinstance(model, (str, os.PathLike)) and (model_file is not None or os.path.isdir(model)):
        from ortpilot.data import model_path_of

        model = model_path_of(model, model_file)
    try:
        return load_verified(model, providers, policy, **kwargs)
    except StampMismatchError:
        if not isinstance(model, (str, os.PathLike)):
            raise
        from ortpilot.modelio import load_model
        from ortpilot.passes.optimize import check_or_rebuild
        from ortpilot.providers import resolve_providers

        rebuilt = check_or_rebuild(load_model(model, load_external_data=False), resolve_providers(providers))
        if rebuilt is None:
            raise
        return load_verified(rebuilt, providers, policy, **kwargs)


def run_once(model: str, providers: Sequence[str] | None, *, policy: str = "warn", min_coverage: float | None = None,
             level: str = "all", feeds: Mapping[str, np.ndarray] | None = None, shapes: Sequence[str] = (),
             isolate: bool = False) -> dict[str, Any]:
    """Load verified, run once (generated inputs unless given), describe everything."""
    shape_map = parse_shape_args(list(shapes))
    sess = load(model, providers, policy, min_coverage=min_coverage, settings=SessionSettings(level=level),
                shapes=shape_map, isolate=isolate)
    generated = ""
    if feeds:
        feeds = sess.check_feeds(feeds)
    else:
        plan = plan_feeds(sess.model, shape_map)
        feeds = make_feeds(sess.model, plan=plan)
        generated = plan.describe()
    names = [o.name for o in sess.get_outputs()]
    values = sess.run(None, feeds)
    outputs = []
    for name, value in zip(names, values):
        arr = np.asarray(value)
        numeric = arr.size and np.issubdtype(arr.dtype, np.number)
        outputs.append({"name": name, "shape": list(arr.shape), "dtype": str(arr.dtype),
                        "min": float(np.nanmin(arr)) if numeric else 0.0,
                        "max": float(np.nanmax(arr)) if numeric else 0.0,
                        "nan": int(np.isnan(arr).sum()) if numeric and np.issubdtype(arr.dtype, np.floating) else 0})
    return {"session": sess.to_dict(), "generated_inputs": generated, "outputs": outputs}
