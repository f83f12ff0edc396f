"""The verified session: ORT's InferenceSession plus proof of where it runs.

``load`` walks the four fallback layers of DESIGN.md in order (1: provider not in the build,
2: library or device failed to load, 3: provider raised at creation, 4: nodes placed elsewhere)
and applies one policy to each: strict raises, warn logs and records, allow records.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ortpilot.artifacts.stamp import check_stamp
from ortpilot.errors import InputError, ModelLoadError, OrtRunError, ProviderFallbackError, UsageError
from ortpilot.graph.check import refuse_malformed_einsums
from ortpilot.graph.feeds import make_feeds, validate_feeds
from ortpilot.graph.shapes import InputInfo, graph_inputs
from ortpilot.modelio import file_sha256, load_model, model_sha256
from ortpilot.providers.defaults import session_overrides
from ortpilot.providers.names import EP_LIBRARY_OPTION, ProviderLike, ProviderSpec, resolve_providers
from ortpilot.providers.plugins import ep_devices, plugin_for_ep, register_plugin
from ortpilot.session.fallback import Fallback, apply_policy, check_policy, fix_for
from ortpilot.session.isolate import preflight_in_child
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
CPU = "CPUExecutionProvider"


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
            self._explain(input_feed, exc)
            raise

    def _explain(self, input_feed: Mapping[str, Any], exc: Exception) -> None:
        validate_feeds(self._inputs, input_feed)  # raises InputError when the feed is wrong
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


def _available(spec: ProviderSpec, built_in: list[str]) -> Fallback | None:
    """Layers 1 and 2 before creation: is the provider in this build, or a plugin with a device?"""
    library = spec.options.get(EP_LIBRARY_OPTION)
    if library:  # an explicit plugin library: register it under its own path
        error = register_plugin(spec.name, library, registration_name=f"ortpilot:{library}")
        if error:
            return Fallback(2, spec.name, [], f"plugin library {library} failed to load: {error}", fix_for(spec.name))
        if not ep_devices(spec.name):
            return Fallback(
                2,
                spec.name,
                [],
                f"plugin library {library} registered, but ORT found no device for "
                f"{spec.name} (get_ep_devices() lists none)",
                fix_for(spec.name),
            )
        return None
    if spec.name in built_in:
        return None
    plugin = plugin_for_ep(spec.name)
    if plugin is None:
        return Fallback(
            1,
            spec.name,
            [],
            f"{spec.name} is not in this ORT build ({ort.__version__}, available: {', '.join(built_in)})",
            fix_for(spec.name),
        )
    error = register_plugin(spec.name, plugin.library_path or None)
    if error:
        return Fallback(
            2,
            spec.name,
            [],
            f"plugin library {plugin.library_path or plugin.distribution} failed to load: {error}",
            fix_for(spec.name),
        )
    if not ep_devices(spec.name):
        return Fallback(
            2,
            spec.name,
            [],
            f"plugin {plugin.distribution} registered, but ORT found no device "
            f"for {spec.name} (get_ep_devices() lists none)",
            fix_for(spec.name),
        )
    return None


def _create(
    source: str | bytes,
    chain: list[ProviderSpec],
    built_in: list[str],
    settings: SessionSettings,
    extra_config: dict[str, str],
) -> ort.InferenceSession:
    opts = settings.build()
    for key, value in extra_config.items():
        opts.add_session_config_entry(key, value)
    if any(spec.name not in built_in or EP_LIBRARY_OPTION in spec.options for spec in chain):
        # Plugin EPs are selected by device; when one is in the chain, all of it goes that way.
        for spec in chain:
            devices = ep_devices(spec.name)
            if devices:
                opts.add_provider_for_devices(devices, spec.ort_options())
        return ort.InferenceSession(source, opts, enable_fallback=0)
    return ort.InferenceSession(source, opts, providers=[s.as_ort() for s in chain], enable_fallback=0)


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
    if min_coverage is not None and not 0.0 <= min_coverage <= 1.0:
        raise UsageError(f"min_coverage must be between 0 and 1, got {min_coverage}.")
    coverage = DEFAULT_MIN_COVERAGE if min_coverage is None else min_coverage
    proto, path, source, digest = _read_model(model)
    refuse_malformed_einsums(proto)  # ORT's session creation would hang on them, isolated or not
    requested = resolve_providers(providers)
    check_stamp(proto, requested)  # an offline-optimized model built for another EP/ORT is refused
    settings = effective_settings(settings or SessionSettings(), requested)
    if isolate:
        preflight_in_child(source, requested, settings)
    built_in = ort.get_available_providers()
    fallbacks: list[Fallback] = []
    primary = requested[0]

    problems = {spec.name: _available(spec, built_in) for spec in requested}
    usable = [spec for spec in requested if problems[spec.name] is None]
    usable_chain = usable if CPU in [s.name for s in usable] else usable + [ProviderSpec(CPU)]
    for spec in requested:
        problem = problems[spec.name]
        if problem is None:
            continue
        problem = Fallback(
            problem.layer, problem.requested, [s.name for s in usable_chain], problem.reason, problem.fix
        )
        fallbacks.append(problem)
        if spec is primary:
            apply_policy(policy, problem)

    extra: dict[str, str] = {}
    if placement and assignment_api_available():
        extra[RECORD_ASSIGNMENT_KEY] = "1"
    if policy == "strict" and coverage >= 1.0 and primary.name != CPU and CPU not in [s.name for s in requested]:
        extra["session.disable_cpu_ep_fallback"] = "1"
        usable_chain = [s for s in usable_chain if s.name != CPU] or usable_chain

    session: ort.InferenceSession | None = None
    create_s = 0.0
    captured: list[str] = []
    chain = usable_chain
    while session is None:
        with capture_ort_output() as out:
            try:
                started = time.perf_counter()
                session = _create(source, chain, built_in, settings, extra)
                create_s = time.perf_counter() - started
            except Exception as exc:  # layer 3: the EP raised while building the session
                error = _first_line(str(exc))
        captured.extend(out.messages("W"))
        if session is not None:
            break
        failed = chain[0]
        if failed.name == CPU or (_is_model_error(error) and len(chain) == 1):
            # CPU is the last resort and runs every valid model: its failure is the model's fault.
            raise ModelLoadError(
                f"ORT could not load the model: {error}. Check that the model is valid "
                "('ortpilot inspect MODEL') and was exported for an opset this ORT supports."
            )
        rest = chain[1:] or ([ProviderSpec(CPU)] if failed.name != CPU else [])
        if "session.disable_cpu_ep_fallback" in extra and "CPU" in error:
            # ORT refused because some nodes would need CPU: a layer-4 placement failure.
            event = Fallback(
                4, failed.name, [s.name for s in rest], error, "allow CPU in the chain (-p cpu) or lower min_coverage."
            )
        else:
            event = Fallback(
                3,
                failed.name,
                [s.name for s in rest],
                error,
                f"{failed.name} is installed but cannot build this model; keep a fallback in the "
                f"chain (-p {failed.name} -p cpu --policy warn), or fix dynamic dims with --shape.",
            )
        fallbacks.append(event)
        if failed.name == primary.name or policy == "strict":
            apply_policy(policy, event)
        if not rest:
            raise ModelLoadError(f"No provider could create a session for this model: {error}.")
        chain = rest
        extra.pop("session.disable_cpu_ep_fallback", None)

    loaded = session.get_providers()
    for spec in usable:  # layer 2 for built-in EPs: available, yet did not load (missing .so)
        if spec.name not in loaded and spec.name in built_in and spec in chain:
            out_reason = next(
                (m for m in captured if spec.name.replace("ExecutionProvider", "") in m),
                captured[0] if captured else "",
            )
            event = Fallback(
                2, spec.name, loaded, out_reason or "the provider library did not load", fix_for(spec.name)
            )
            fallbacks.append(event)
            if spec is primary:
                apply_policy(policy, event)

    place: Placement | None = None
    if placement:
        place = _placement(session, proto, source, chain, built_in, settings, shapes)
    if place is not None and primary.name in loaded:
        event = _coverage_fallback(place, primary.name, coverage)
        if event is not None:
            fallbacks.append(event)
            apply_policy(policy, event)
    for message in captured:
        log.debug("ORT: %s", message)
    return VerifiedSession(
        session,
        model=proto,
        model_path=path,
        model_hash=digest,
        requested=requested,
        policy=policy,
        settings=settings,
        fallbacks=fallbacks,
        placement=place,
        min_coverage=coverage,
        captured=captured,
        create_s=create_s,
    )


def _coverage_fallback(place: Placement, provider: str, minimum: float) -> Fallback | None:
    """Layer 4: too little of the graph on the requested provider.

    Coverage is the share of estimated FLOPs where FLOPs are known, else the share of nodes.
    GPU EPs leave shape arithmetic (Shape, Gather, Unsqueeze on int64) on CPU by design; those
    nodes carry no FLOPs, so counting FLOPs does not punish a correct placement.
    """
    node_share = place.share(provider)
    flops_share = place.flops_share(provider)
    share = node_share if flops_share is None else flops_share
    if share >= minimum:
        return None
    others = {p: c for p, c in place.counts.items() if p != provider}
    basis = (
        f"{node_share:.1%} of {place.total} nodes"
        if flops_share is None
        else f"{flops_share:.1%} of estimated FLOPs ({node_share:.1%} of {place.total} nodes)"
    )
    return Fallback(
        4,
        provider,
        sorted(others),
        f"only {basis} run on {provider} (minimum {minimum:.0%}); "
        "elsewhere: " + ", ".join(f"{p} {c} nodes" for p, c in others.items()),
        "check which ops the provider lacks ('ortpilot inspect -p PROVIDER'), or lower min_coverage.",
    )


def _is_allocation_failure(message: str) -> bool:
    return any(k in message for k in ("Failed to allocate memory", "bad_alloc", "out of memory", "OutOfMemory"))


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) > 1:
        # Nested EP exceptions (OpenVINO) open with a C++ call chain and end with the cause
        # ("... doesn't support Parameter operation with dynamic rank"): keep both ends.
        return f"{lines[0][:160]} ... {lines[-1]}"
    return lines[0] if lines else text.strip()


def _is_model_error(message: str) -> bool:
    keys = (
        "INVALID_GRAPH",
        "INVALID_PROTOBUF",
        "NO_MODEL",
        "Load model",
        "NOT_IMPLEMENTED",
        "Unsupported model IR version",
        "opset",
        "Type Error",
        "ShapeInferenceError",
        "Node (",
    )
    return any(k in message for k in keys)


def _placement(
    session: ort.InferenceSession,
    proto: onnx.ModelProto,
    source: str | bytes,
    chain: list[ProviderSpec],
    built_in: list[str],
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
