"""The verified session: ORT's InferenceSession plus proof of where it runs.

``load`` walks the four fallback layers of docs/concepts/fallback-layers.md in order (1: provider
not in the build, 2: library or device failed to load, 3: provider raised at creation, 4: nodes
placed elsewhere; one check each in ``session.layers``) and applies one policy to each: strict
raises, warn logs and records, allow records.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ortpilot.artifacts.stamp import check_stamp
from ortpilot.eps import CPU_EP
from ortpilot.errors import InputError, ModelLoadError, OrtRunError, ProviderFallbackError, UsageError
from ortpilot.graph.check import refuse_malformed_einsums
from ortpilot.graph.feeds import make_feeds, validate_feeds
from ortpilot.graph.shapes import InputInfo, graph_inputs
from ortpilot.modelio import file_sha256, load_model, model_sha256
from ortpilot.providers.defaults import session_overrides
from ortpilot.providers.names import ProviderLike, ProviderSpec, resolve_providers
from ortpilot.providers.plugins import build_providers
from ortpilot.session.fallback import Fallback, FallbackRecorder, check_policy
from ortpilot.session.isolate import preflight_in_child
from ortpilot.session.layers import (
    DISABLE_CPU_FALLBACK,
    check_available,
    check_coverage,
    check_loaded,
    create_on_chain,
    forbids_cpu,
    with_cpu,
)
from ortpilot.session.options import LEVEL_NAMES, SessionSettings
from ortpilot.session.ortlog import capture_ort_output
from ortpilot.session.placement import (
    RECORD_ASSIGNMENT_KEY,
    Placement,
    assignment_api_available,
    from_assignment_info,
    profile_placement,
)

log = logging.getLogger("ortpilot")
DEFAULT_MIN_COVERAGE = 0.95


class VerifiedSession:
    """An ORT session that knows what was asked for, what loaded, and where nodes run."""

    def __init__(
        self,
        session: ort.InferenceSession,
        *,
        model: onnx.ModelProto,
        model_path: Path | None,
        model_hash: str,
        requested: list[ProviderSpec],
        policy: str,
        settings: SessionSettings,
        fallbacks: list[Fallback],
        placement: Placement | None,
        min_coverage: float,
        captured: list[str],
        create_s: float = 0.0,
    ) -> None:
        self.session = session
        self.model = model
        self.model_path = model_path
        self.model_hash = model_hash
        self.requested = requested
        self.policy = policy
        self.settings = settings
        self.fallbacks = fallbacks
        self.placement = placement
        self.min_coverage = min_coverage
        self.ort_messages = captured
        self.create_s = create_s  # ORT's own InferenceSession construction, as onnxruntime_perf_test times it
        self._inputs = graph_inputs(model)
        self._validated = False

    @property
    def providers(self) -> list[str]:
        """Providers that really loaded, in priority order."""
        return list(self.session.get_providers())

    @property
    def inputs(self) -> list[InputInfo]:
        return list(self._inputs)

    def get_inputs(self):
        return self.session.get_inputs()

    def get_outputs(self):
        return self.session.get_outputs()

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: ort.RunOptions | None = None,
    ) -> list[np.ndarray]:
        """Same signature as ``InferenceSession.run``; bad feeds raise ``InputError``.

        The first call validates feeds (and warns on NaN); later calls go straight to ORT and
        are explained only if ORT rejects them, so the wrapper costs nothing per run.
        """
        if not self._validated:
            validate_feeds(self._inputs, input_feed)
            self._validated = True
        try:
            return self.session.run(output_names, input_feed, run_options)
        except Exception as exc:
            self._explain(output_names, input_feed, exc)
            raise

    def _explain(self, output_names: Any, input_feed: Mapping[str, Any], exc: Exception) -> None:
        validate_feeds(self._inputs, input_feed)  # raises InputError when the feed is wrong
        self._check_output_names(output_names)
        message = str(exc)
        if "InvalidArgument" in message or "INVALID_ARGUMENT" in message:
            raise InputError(f"ORT rejected the inputs: {message.splitlines()[0]}") from None
        shapes = ", ".join(f"{n}{list(np.shape(v))}" for n, v in input_feed.items())
        reason = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
        if _is_allocation_failure(message):
            raise OrtRunError(
                f"ORT ran out of memory while running the model ({reason}); inputs: {shapes}. Smaller "
                "inputs (--shape) or a machine with more memory may run it."
            ) from None
        if type(exc).__module__.startswith("onnxruntime"):
            raise OrtRunError(
                f"ORT failed while running the model ({reason}); inputs: {shapes}. The model does not "
                "run on these inputs under this ORT build."
            ) from None

    def _check_output_names(self, output_names: Any) -> None:
        """``run``'s first argument as ORT takes it: None (every output) or a list of the model's output names."""
        if output_names is None:
            return
        known = [o.name for o in self.session.get_outputs()]
        if isinstance(output_names, (str, bytes)) or not isinstance(output_names, Sequence):
            raise InputError(
                f"run's output names must be a list of names or None (every output), got {output_names!r}: "
                f"e.g. run([{known[0]!r}], feeds)."
            )
        unknown = [n for n in output_names if n not in known]
        if unknown:
            raise InputError(
                f"Unknown output name(s) {', '.join(map(repr, unknown))}. The model's outputs are: {', '.join(known)}."
            )

    def check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return validate_feeds(self._inputs, feeds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": str(self.model_path) if self.model_path else None,
            "model_sha256": self.model_hash,
            "policy": self.policy,
            "requested": [s.to_dict() for s in self.requested],
            "providers": self.providers,
            "fallbacks": [f.to_dict() for f in self.fallbacks],
            "placement": self.placement.to_dict() if self.placement else None,
            "min_coverage": self.min_coverage,
            "settings": self.settings.to_dict(),
        }


def _read_model(
    model: str | os.PathLike | bytes | onnx.ModelProto,
) -> tuple[onnx.ModelProto, Path | None, str | bytes, str]:
    """Return (proto without external data, path, what to hand ORT, content hash)."""
    if isinstance(model, onnx.ModelProto):
        data = model.SerializeToString()  # once: ORT takes these bytes and the hash is of them
        return model, None, data, hashlib.sha256(data).hexdigest()
    if isinstance(model, (bytes, bytearray)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as exc:
            raise ModelLoadError(f"The bytes given are not an ONNX model ({exc}).") from None
        return proto, None, bytes(model), model_sha256(proto)
    path = Path(model)
    proto = load_model(path, load_external_data=False)
    return proto, path, str(path), file_sha256(path)


def effective_settings(settings: SessionSettings, chain: list[ProviderSpec]) -> SessionSettings:
    """The settings a session on ``chain`` really gets: ``settings`` with the providers' needs applied
    (``providers.defaults.session_overrides``: TensorRT lowers the level to basic, DirectML ...)."""
    data = settings.to_dict()
    for override in session_overrides(chain):
        current = data.get(override.setting)
        if override.setting == "level":
            if LEVEL_NAMES.index(current) > LEVEL_NAMES.index(str(override.value)):
                log.info(
                    "%s: lowering optimization level to %s: %s", override.provider, override.value, override.reason
                )
                data[override.setting] = override.value
        elif current != override.value:
            log.info("%s: setting %s=%s: %s", override.provider, override.setting, override.value, override.reason)
            data[override.setting] = override.value
    return SessionSettings.from_dict(data)


def load(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    providers: Sequence[ProviderLike] | ProviderLike | None = None,
    policy: str = "warn",
    *,
    min_coverage: float | None = None,
    settings: SessionSettings | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    placement: bool = True,
    isolate: bool = False,
) -> VerifiedSession:
    """Create a session on the requested providers and verify that it really runs there.

    ``providers``: short or full names, ``"name:key=value"`` strings, (name, options) tuples.
    ``policy``: strict raises ``ProviderFallbackError``; warn logs once and records; allow records.
    ``min_coverage``: least share of nodes that must land on the first requested provider
    (default 0.95; 1.0 in strict mode also turns on ORT's ``session.disable_cpu_ep_fallback``).
    ``shapes`` fixes dynamic dims for the profiler placement path (ORT < 1.24).
    ``isolate`` first creates the session in a child process, so that a model that crashes
    ORT kills only the child.
    """
    policy = check_policy(policy)
    coverage = _min_coverage(min_coverage)
    proto, path, source, digest = _read_model(model)
    refuse_malformed_einsums(proto)  # ORT's session creation would hang on them, isolated or not
    requested = resolve_providers(providers)
    check_stamp(proto, requested)  # an offline-optimized model built for another EP/ORT is refused
    settings = effective_settings(settings or SessionSettings(), requested)
    if isolate:
        preflight_in_child(source, requested, settings)
    built_in = build_providers()  # a registered plugin EP is listed too, but is created through its devices
    primary = requested[0]
    found = FallbackRecorder(policy)

    usable = check_available(requested, built_in, found)  # layers 1 and 2, before creation
    chain, extra = _creation_plan(requested, usable, policy, coverage, placement)
    created = create_on_chain(source, chain, built_in, settings, extra, primary, found)  # layer 3
    check_loaded(usable, created, built_in, primary, found)  # layer 2, after creation
    place = _placement(created.session, proto, source, created.chain, settings, shapes) if placement else None
    check_coverage(place, primary, created, coverage, found)  # layer 4

    for message in created.captured:
        log.debug("ORT: %s", message)
    return VerifiedSession(
        created.session,
        model=proto,
        model_path=path,
        model_hash=digest,
        requested=requested,
        policy=policy,
        settings=settings,
        fallbacks=found.events,
        placement=place,
        min_coverage=coverage,
        captured=created.captured,
        create_s=created.create_s,
    )


def _min_coverage(min_coverage: float | None) -> float:
    if min_coverage is not None and not 0.0 <= min_coverage <= 1.0:
        raise UsageError(f"min_coverage must be between 0 and 1, got {min_coverage}.")
    return DEFAULT_MIN_COVERAGE if min_coverage is None else min_coverage


def _creation_plan(
    requested: list[ProviderSpec], usable: list[ProviderSpec], policy: str, coverage: float, placement: bool
) -> tuple[list[ProviderSpec], dict[str, str]]:
    """The chain to create on and the session config it needs (placement record, no-CPU under strict)."""
    chain = with_cpu(usable)
    extra: dict[str, str] = {}
    if placement and assignment_api_available():
        extra[RECORD_ASSIGNMENT_KEY] = "1"
    if forbids_cpu(requested, policy, coverage):
        extra[DISABLE_CPU_FALLBACK] = "1"
        chain = [s for s in chain if s.name != CPU_EP] or chain
    return chain, extra


def _is_allocation_failure(message: str) -> bool:
    return any(k in message for k in ("Failed to allocate memory", "bad_alloc", "out of memory", "OutOfMemory"))


def _placement(
    session: ort.InferenceSession,
    proto: onnx.ModelProto,
    source: str | bytes,
    chain: list[ProviderSpec],
    settings: SessionSettings,
    shapes: Mapping[str, tuple[int, ...]] | None,
) -> Placement | None:
    flops = _node_flops(proto, shapes)
    if assignment_api_available():
        return from_assignment_info(session, flops)
    try:
        feeds = make_feeds(proto, shapes)
    except Exception as exc:
        log.info(
            "Placement unavailable: ORT %s has no assignment API and inputs could not be generated (%s).",
            ort.__version__,
            exc,
        )
        return None
    with capture_ort_output():
        return profile_placement(source, [s.as_ort() for s in chain], settings.build(), feeds, flops)


def _node_flops(proto: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]] | None) -> dict[str, float]:
    try:
        from ortpilot.graph.flops import node_flops
    except ImportError:
        return {}
    try:
        return node_flops(proto, shapes)
    except Exception as exc:  # FLOPs are a nicety; never fail a load over them
        log.debug("FLOPs estimate failed: %s", exc)
        return {}


__all__ = ["ProviderFallbackError", "VerifiedSession", "load"]
