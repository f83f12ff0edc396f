"""The four fallback layers of docs/concepts/fallback-layers.md, one check each.

Layer 1 (provider not in this build) and layer 2 (library or device failed to load) are checked
before creation by ``check_available``; ``create_on_chain`` walks the chain itself, so that a
provider that raises at creation (layer 3) is recorded with ORT's reason; ``check_loaded`` finds
the layer-2 failures only the loaded providers show; ``check_coverage`` is layer 4. Each check
hands what it finds to one ``FallbackRecorder``, whose policy decides what a fallback does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import onnxruntime as ort

from ortpilot.eps import CPU_EP
from ortpilot.errors import ModelLoadError
from ortpilot.providers.names import EP_LIBRARY_OPTION, ProviderSpec
from ortpilot.providers.plugins import plugin_for_ep, plugin_request, register_plugin
from ortpilot.session.fallback import Fallback, FallbackRecorder, fix_for
from ortpilot.session.options import SessionSettings
from ortpilot.session.ortlog import capture_ort_output
from ortpilot.session.placement import Placement

DISABLE_CPU_FALLBACK = "session.disable_cpu_ep_fallback"


# --------------------------------------------------------------------------- layers 1 and 2, before creation


def check_available(requested: list[ProviderSpec], built_in: list[str], found: FallbackRecorder) -> list[ProviderSpec]:
    """Layers 1 and 2 before creation: record each requested provider this machine cannot offer.

    Returns the usable ones, in order; the policy acts on the first requested provider only."""
    problems = {spec.name: unavailable(spec, built_in) for spec in requested}
    usable = [spec for spec in requested if problems[spec.name] is None]
    chain = with_cpu(usable)
    for spec in requested:
        problem = problems[spec.name]
        if problem is not None:
            found.record(replace(problem, got=[s.name for s in chain]), enforce=spec is requested[0])
    return usable


def with_cpu(chain: list[ProviderSpec]) -> list[ProviderSpec]:
    """``chain`` with CPU as the last resort: appended unless the chain already holds it."""
    return chain if CPU_EP in [s.name for s in chain] else chain + [ProviderSpec(CPU_EP)]


def unavailable(spec: ProviderSpec, built_in: list[str]) -> Fallback | None:
    """Is the provider in this build, or a plugin with a device? (``got`` is left for the caller)"""
    library = spec.options.get(EP_LIBRARY_OPTION)
    if library:  # an explicit plugin library: register it under its own path
        error = register_plugin(spec.name, library, registration_name=f"ortpilot:{library}")
        return _plugin_problem(spec, error, f"plugin library {library}", f"plugin library {library}")
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
    return _plugin_problem(
        spec, error, f"plugin library {plugin.library_path or plugin.distribution}", f"plugin {plugin.distribution}"
    )


def _plugin_problem(spec: ProviderSpec, error: str, library: str, plugin: str) -> Fallback | None:
    """Layer 2 for a plugin EP: ``library`` failed to load, or ``plugin`` registered without a device."""
    if error:
        return Fallback(2, spec.name, [], f"{library} failed to load: {error}", fix_for(spec.name))
    _, _, missing = plugin_request(spec.name, spec.ort_options())
    if missing:
        return Fallback(
            2,
            spec.name,
            [],
            f"{plugin} registered, but ORT found no device for {spec.name} ({missing})",
            fix_for(spec.name),
        )
    return None


# --------------------------------------------------------------------------- layer 3, at creation


@dataclass(frozen=True)
class CreatedSession:
    """What the walk down the chain ended with: the session, the chain it was built on, ORT's words."""

    session: ort.InferenceSession
    chain: list[ProviderSpec]
    create_s: float  # ORT's own InferenceSession construction, as onnxruntime_perf_test times it
    captured: list[str]  # ORT's warnings and log lines over every attempt
    loaded: list[str]  # the providers that really loaded, in priority order


def create_on_chain(
    source: str | bytes,
    chain: list[ProviderSpec],
    built_in: list[str],
    settings: SessionSettings,
    extra_config: dict[str, str],
    primary: ProviderSpec,
    found: FallbackRecorder,
) -> CreatedSession:
    """Layer 3: create on ``chain``; when its first provider raises, record why and go on without it.

    ORT's own retry-with-CPU is off (``enable_fallback=0``), so the reason is kept. When ORT refused
    because nodes would need CPU (``DISABLE_CPU_FALLBACK`` set), the failure is layer 4's. The policy
    acts on the first requested provider's failure, and on any failure under strict."""
    extra = dict(extra_config)
    captured: list[str] = []
    while True:
        session, create_s, error = _attempt(source, chain, built_in, settings, extra, captured)
        if session is not None:
            return CreatedSession(session, chain, create_s, captured, session.get_providers())
        failed = chain[0]
        if failed.name == CPU_EP or (_is_model_error(error) and len(chain) == 1):
            # CPU is the last resort and runs every valid model: its failure is the model's fault.
            raise ModelLoadError(
                f"ORT could not load the model: {error}. Check that the model is valid "
                "('ortpilot inspect MODEL') and was exported for an opset this ORT supports."
            )
        rest = chain[1:] or [ProviderSpec(CPU_EP)]
        event = creation_failure(failed, rest, error, cpu_refused=DISABLE_CPU_FALLBACK in extra)
        found.record(event, enforce=failed.name == primary.name or found.policy == "strict")
        chain = rest
        extra.pop(DISABLE_CPU_FALLBACK, None)


def creation_failure(failed: ProviderSpec, rest: list[ProviderSpec], error: str, *, cpu_refused: bool) -> Fallback:
    """The record of ``failed`` raising at creation: layer 3, or 4 when ORT refused to place nodes on CPU."""
    got = [s.name for s in rest]
    if cpu_refused and "CPU" in error:
        # ORT refused because some nodes would need CPU: a layer-4 placement failure.
        return Fallback(4, failed.name, got, error, "allow CPU in the chain (-p cpu) or lower min_coverage.")
    return Fallback(
        3,
        failed.name,
        got,
        error,
        f"{failed.name} is installed but cannot build this model; keep a fallback in the "
        f"chain (-p {failed.name} -p cpu --policy warn), or fix dynamic dims with --shape.",
    )


def _attempt(
    source: str | bytes,
    chain: list[ProviderSpec],
    built_in: list[str],
    settings: SessionSettings,
    extra_config: dict[str, str],
    captured: list[str],
) -> tuple[ort.InferenceSession | None, float, str]:
    """One try at creation: (session or None, seconds ORT took, the error's gist); ORT's warnings go to ``captured``."""
    session: ort.InferenceSession | None = None
    create_s = 0.0
    error = ""
    with capture_ort_output() as out:
        try:
            started = time.perf_counter()
            session = _create(source, chain, built_in, settings, extra_config)
            create_s = time.perf_counter() - started
        except Exception as exc:  # the EP raised while building the session
            error = _first_line(str(exc))
    captured.extend(out.messages("W"))
    return session, create_s, error


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
            devices, options, _ = plugin_request(spec.name, spec.ort_options())
            if devices:
                opts.add_provider_for_devices(devices, options)
        return ort.InferenceSession(source, opts, enable_fallback=0)
    return ort.InferenceSession(source, opts, providers=[s.as_ort() for s in chain], enable_fallback=0)


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


# --------------------------------------------------------------------------- layer 2, after creation


def check_loaded(
    usable: list[ProviderSpec],
    created: CreatedSession,
    built_in: list[str],
    primary: ProviderSpec,
    found: FallbackRecorder,
) -> None:
    """Layer 2 for built-in providers: available, kept in the chain, yet not loaded (a missing .so).

    ORT says why only in a log line; the one naming the provider becomes the reason."""
    for spec in usable:
        if spec.name not in created.loaded and spec.name in built_in and spec in created.chain:
            reason = next(
                (m for m in created.captured if spec.name.replace("ExecutionProvider", "") in m),
                created.captured[0] if created.captured else "",
            )
            event = Fallback(
                2, spec.name, created.loaded, reason or "the provider library did not load", fix_for(spec.name)
            )
            found.record(event, enforce=spec is primary)


# --------------------------------------------------------------------------- layer 4, placement


def forbids_cpu(requested: list[ProviderSpec], policy: str, coverage: float) -> bool:
    """Strict with full coverage and no CPU asked for: ORT itself is told to place no node on CPU."""
    return (
        policy == "strict"
        and coverage >= 1.0
        and requested[0].name != CPU_EP
        and CPU_EP not in [s.name for s in requested]
    )


def check_coverage(
    place: Placement | None, primary: ProviderSpec, created: CreatedSession, minimum: float, found: FallbackRecorder
) -> None:
    """Layer 4: record (and apply the policy to) too little of the graph on the first requested provider."""
    if place is None or primary.name not in created.loaded:
        return
    event = coverage_fallback(place, primary.name, minimum)
    if event is not None:
        found.record(event)


def coverage_fallback(place: Placement, provider: str, minimum: float) -> Fallback | None:
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
