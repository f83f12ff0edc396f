"""ORT graph optimization as a pass: online (at session creation) or offline (saved, cached, stamped).

Offline runs the model through a verified session with ``optimized_model_filepath`` set, on
the provider the model is meant for (strict: optimizing "for OpenVINO" on a CPU fallback
would stamp a lie). The result goes to the content-addressed cache, keyed by everything
that decides its bytes, so the same request never optimizes twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ortpilot.artifacts.atomic import save_model
from ortpilot.artifacts.oserrors import fix_for, free_bytes
from ortpilot.artifacts.scratch import scratch_dir
from ortpilot.artifacts.stamp import (
    EP_SPECIFIC_LEVELS,
    cpu_features,
    make_stamp,
    write_stamp,
)
from ortpilot.artifacts.store import ModelStore, cache_key
from ortpilot.errors import ModelLoadError, StorageError, UsageError
from ortpilot.modelio import load_model
from ortpilot.passes.base import Outcome, Pass, SourceModel
from ortpilot.providers.names import ProviderLike, ProviderSpec, resolve_providers
from ortpilot.session.options import SessionSettings, check_level

log = logging.getLogger("ortpilot")


def optimize_to_file(
    source: SourceModel,
    level: str,
    providers: Sequence[ProviderSpec],
    dest: Path,
    free_dimension_overrides: Mapping[str, int] | None = None,
) -> SessionSettings:
    """Let ORT optimize ``source`` at ``level`` for ``providers`` and save the graph to ``dest``."""
    from ortpilot.session import load

    settings = SessionSettings(
        level=level,
        free_dimension_overrides=dict(free_dimension_overrides or {}),
        optimized_model_filepath=str(dest),
        log_severity=3,
    )
    model = str(source.path) if source.path is not None else source.proto
    try:
        sess = load(model, list(providers), "strict", settings=settings, placement=False)
    except ModelLoadError as exc:
        _raise_if_write_failed(model, providers, settings, dest, exc)
        raise
    if not dest.is_file():
        raise UsageError(
            f"ORT did not write the optimized model for providers {[p.name for p in providers]} "
            f"at level {level}; this provider may not support saving optimized graphs."
        )
    return sess.settings


def _raise_if_write_failed(
    model: Any, providers: Sequence[ProviderSpec], settings: SessionSettings, dest: Path, exc: ModelLoadError
) -> None:
    """ORT reports a full disk while saving the optimized graph as a load failure ("Protobuf
    serialization failed"): when the same session loads without saving, the write failed, so say so."""
    from ortpilot.session import load

    unsaved = SessionSettings.from_dict({**settings.to_dict(), "optimized_model_filepath": ""})
    try:
        load(model, list(providers), "strict", settings=unsaved, placement=False)
    except Exception:
        return
    free = free_bytes(dest)
    said = str(exc).split("could not load the model: ", 1)[-1].split(". Check that the model is valid", 1)[0]
    raise StorageError(
        f"ORT could not save the optimized model to '{dest}' (ORT said: {said[:300]}); "
        f"the model itself loads, so the write failed"
        + (f": {free} bytes are free on that filesystem" if free is not None else "")
        + f". {fix_for(dest)}",
        path=str(dest),
    ) from None


class OptimizePass(Pass):
    """ORT's graph optimizations at one level for one provider chain."""

    name = "optimize"

    def __init__(
        self,
        level: str = "all",
        providers: Sequence[ProviderLike] | ProviderLike | None = None,
        *,
        offline: bool = True,
        free_dimension_overrides: Mapping[str, int] | None = None,
        use_cache: bool = True,
        store: ModelStore | None = None,
    ) -> None:
        check_level(level)
        self.level = level
        self.providers = resolve_providers(providers)
        self.offline = offline
        self.free_dims = dict(free_dimension_overrides or {})
        self.use_cache = use_cache
        self.store = store

    def options(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "providers": [str(p) for p in self.providers],
            "offline": self.offline,
            "free_dimension_overrides": self.free_dims,
        }

    def key(self, source: SourceModel) -> str:
        return cache_key(
            model_sha256=source.sha256,
            ort_version=ort.__version__,
            providers=[p.to_dict() for p in self.providers],
            level=self.level,
            free_dimension_overrides=self.free_dims,
            cpu=cpu_features(),
        )

    def transform(self, source: SourceModel) -> Outcome:
        ep_specific = self.level in EP_SPECIFIC_LEVELS
        if not self.offline:
            return Outcome(
                source.proto,
                level=self.level,
                providers=self.providers,
                ep_specific=False,
                notes=[
                    f"online: ORT applies level '{self.level}' each time the session is created; "
                    "the model itself is unchanged"
                ],
                extra={"session_settings": {"level": self.level, "free_dimension_overrides": self.free_dims}},
            )
        key = self.key(source)

        def build(dest: Path) -> None:
            optimize_to_file(source, self.level, self.providers, dest, self.free_dims)
            built = load_model(dest)
            write_stamp(
                built,
                make_stamp(
                    source_sha256=source.sha256,
                    providers=self.providers,
                    level=self.level,
                    source_path=str(source.path.resolve()) if source.path else None,
                    pass_name=self.name,
                    options=self.options(),
                ),
            )
            save_model(built, dest)

        if self.use_cache:
            store = self.store or ModelStore()
            path, hit = store.get_or_create(key, build, meta={**self.options(), "source_sha256": source.sha256})
            model = load_model(path)
            notes = [f"offline: {'cache hit' if hit else 'built and cached'} ({path.parent.name[:12]})"]
            extra = {"cache_key": key, "cache_hit": hit, "cache_path": str(path)}
        else:
            with scratch_dir("ortpilot-opt-") as tmp:
                build(Path(tmp) / "model.onnx")
                model = load_model(Path(tmp) / "model.onnx")
            notes, extra = ["offline: built (cache off)"], {"cache_key": key, "cache_hit": False}
        if ep_specific:
            notes.append(
                f"level '{self.level}' can save provider- and CPU-specific ops: the model is stamped for "
                f"{self.providers[0].name} and ORT {ort.__version__} and refused elsewhere"
            )
        return Outcome(
            model, level=self.level, providers=self.providers, ep_specific=ep_specific, notes=notes, extra=extra
        )


__all__ = ["OptimizePass", "optimize_to_file"]
