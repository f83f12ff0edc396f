"""Turn what a user types (``cuda:device_id=1``, ``OpenVINO``, a dict) into ORT provider specs.

Resolution is pure: it does not check availability (that is the session's job, so that a
missing provider becomes a recorded fallback, not a parse error). It does reject names that no
ORT build knows, and malformed options, with the list of valid names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

from ortpilot.eps import CPU_EP
from ortpilot.errors import ProviderError
from ortpilot.providers.defaults import apply_provider_defaults
from ortpilot.providers.spec import EP_LIBRARY_OPTION, PROVIDER_ALIASES, SHORT_NAMES, ProviderSpec, short_name

ProviderLike = Union[str, "ProviderSpec", tuple, Mapping[str, Any]]


def known_provider_names() -> list[str]:
    """Every provider name any ORT build knows, plus plugin EP names installed here."""
    names = set(PROVIDER_ALIASES.values())
    try:
        import onnxruntime as ort

        names.update(ort.get_all_providers())
    except ImportError:  # pragma: no cover - ortpilot needs ORT, but errors must still render
        pass
    from ortpilot.providers.plugins import discover_plugin_eps

    for plugin in discover_plugin_eps():
        names.update(plugin.ep_names)
    return sorted(names)


def canonical_name(name: str) -> str:
    """Map a short or full, any-case name to ORT's full provider name."""
    key = name.strip()
    if not key:
        raise ProviderError(_unknown_message(name))
    alias = PROVIDER_ALIASES.get(key.lower())
    if alias:
        return alias
    for full in known_provider_names():
        if full.lower() == key.lower() or full.lower() == key.lower() + "executionprovider":
            return full
    raise ProviderError(_unknown_message(name))


def _unknown_message(name: str) -> str:
    return (
        f"Unknown execution provider '{name}'. Valid short names: {', '.join(SHORT_NAMES)} "
        f"(case-insensitive), or a full ORT name such as {', '.join(sorted(set(PROVIDER_ALIASES.values()))[:6])}, .... "
        "Options follow a colon: 'cuda:device_id=1,cudnn_conv_algo_search=HEURISTIC'."
    )


def parse_provider_arg(text: str) -> ProviderSpec:
    """Parse the CLI form ``name[:key=value[,key=value...]]``."""
    name, _, opts = text.partition(":")
    options: dict[str, str] = {}
    if opts:
        for item in opts.split(","):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ProviderError(
                    f"Malformed provider options in '{text}': '{item}' is not KEY=VALUE. "
                    "Write options as 'name:key=value,key2=value2', e.g. 'cuda:device_id=1'."
                )
            options[key.strip()] = value.strip()
    return ProviderSpec(canonical_name(name), options)


def _one(item: ProviderLike) -> ProviderSpec:
    if isinstance(item, ProviderSpec):
        return item
    if isinstance(item, str):
        return parse_provider_arg(item)
    if _is_pair(item):
        base = parse_provider_arg(item[0])
        return ProviderSpec(base.name, {**base.options, **{str(k): _opt_str(v) for k, v in item[1].items()}})
    if isinstance(item, Mapping) and "name" in item:
        opts = item.get("options") or {}
        return ProviderSpec(canonical_name(str(item["name"])), {str(k): _opt_str(v) for k, v in opts.items()})
    raise ProviderError(
        f"Cannot read provider {item!r}: give a name ('cuda'), 'name:key=value', "
        "a (name, options-dict) tuple, or {'name': ..., 'options': {...}}."
    )


def _is_pair(item: Any) -> bool:
    """One ``(name, options)`` pair; any other tuple (click's ``multiple=True``, a frozen record's field) is a
    chain of providers."""
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], Mapping)


def _opt_str(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _checked(spec: ProviderSpec) -> ProviderSpec:
    """ORT's CPU EP reads no provider options and drops any it is given without a word (``get_provider_options``
    reports none back): a typo'd or misplaced option would silently do nothing, so it is refused here."""
    if spec.name == CPU_EP and spec.options:
        raise ProviderError(
            f"The CPU EP takes no provider options, and ORT ignores them silently: {', '.join(sorted(spec.options))} "
            "would do nothing. Threads, the arena and spinning are session settings, not provider options (bench's --threads; "
            "tune searches them); options belong to other providers, e.g. 'cuda:device_id=1'."
        )
    return spec


def resolve_providers(
    items: Iterable[ProviderLike] | ProviderLike | None, *, apply_defaults: bool = True
) -> list[ProviderSpec]:
    """Resolve a provider chain, apply each provider's gotcha defaults, drop duplicates.

    ``None`` or an empty chain means CPU only.
    """
    if items is None:
        raw: Sequence[ProviderLike] = ["cpu"]
    elif isinstance(items, (str, ProviderSpec)) or _is_pair(items) or (isinstance(items, Mapping) and "name" in items):
        raw = [items]  # type: ignore[list-item]
    else:
        raw = list(items)  # type: ignore[arg-type]
        if not raw:
            raw = ["cpu"]
    specs: list[ProviderSpec] = []
    seen: set[str] = set()
    for item in raw:
        spec = _checked(_one(item))
        if spec.name in seen:
            continue
        seen.add(spec.name)
        specs.append(spec)
    if apply_defaults:
        specs = apply_provider_defaults(specs)
    return specs


# The provider record and its names table live in ``providers.spec``; they are part of this module's surface.
__all__ = [
    "EP_LIBRARY_OPTION",
    "PROVIDER_ALIASES",
    "SHORT_NAMES",
    "ProviderLike",
    "ProviderSpec",
    "canonical_name",
    "known_provider_names",
    "parse_provider_arg",
    "resolve_providers",
    "short_name",
]
