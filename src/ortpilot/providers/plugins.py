"""Plugin execution providers shipped as ``onnxruntime-ep-*`` packages.

Such a package holds a shared library that must be registered with
``onnxruntime.register_execution_provider_library``; its EP then appears in
``get_ep_devices()`` and is selected with ``SessionOptions.add_provider_for_devices``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from functools import lru_cache


@dataclass(frozen=True)
class PluginEP:
    """An installed plugin EP package."""

    distribution: str
    version: str
    module: str
    library_path: str
    ep_names: tuple[str, ...]
    error: str = ""

    def to_dict(self) -> dict:
        return {
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "library_path": self.library_path,
            "ep_names": list(self.ep_names),
            "error": self.error,
        }


@dataclass
class _Registry:
    registered: dict[str, str] = field(default_factory=dict)  # ep name -> library path
    failed: dict[str, str] = field(default_factory=dict)  # ep name -> error


_REGISTRY = _Registry()
_BUILD: list[str] = []  # get_available_providers() before ortpilot registered any plugin library


def build_providers() -> list[str]:
    """The providers compiled into this ORT build.

    ORT lists a registered plugin EP in ``get_available_providers()`` too (and OpenVINO's plugin adds a
    virtual ``OpenVINOExecutionProvider.AUTO``), but such an EP is created only through its devices:
    passed by name, ORT skips it without a word. So the build's list is read before the first
    registration and kept: an EP only a plugin provides is never counted as built in.
    """
    import onnxruntime as ort

    if not _BUILD:
        _BUILD.extend(ort.get_available_providers())
    return list(_BUILD)


def is_plugin_ep(ep_name: str) -> bool:
    """Created through its EP devices (a plugin library), not by name."""
    return ep_name not in build_providers() and (plugin_for_ep(ep_name) is not None or ep_name in _REGISTRY.registered)


def compute_providers() -> list[str]:
    """Providers that can run a model here: the build's, then each installed plugin EP that lists a device
    (registered on the way). Virtual EPs (``OpenVINOExecutionProvider.AUTO``) are left out."""
    out = list(build_providers())
    for plugin in discover_plugin_eps():
        for ep in plugin.ep_names:
            if ep not in out and not register_plugin(ep, plugin.library_path or None) and ep_devices(ep):
                out.append(ep)
    return out


def _is_plugin_dist(name: str) -> bool:
    norm = name.lower().replace("_", "-")
    return norm.startswith("onnxruntime-ep-")


@lru_cache(maxsize=1)
def discover_plugin_eps() -> tuple[PluginEP, ...]:
    """Installed plugin EP packages, found through their distribution metadata."""
    found: dict[str, PluginEP] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name") or ""
        if not _is_plugin_dist(name) or name in found:
            continue
        module_name = name.lower().replace("-", "_")
        try:
            top = (dist.read_text("top_level.txt") or "").split()
            if top:
                module_name = top[0]
            mod = importlib.import_module(module_name)
            lib = str(mod.get_library_path())
            if hasattr(mod, "get_ep_names"):
                eps = tuple(mod.get_ep_names())
            else:
                eps = (mod.get_ep_name(),)
            found[name] = PluginEP(name, dist.version, module_name, lib, eps)
        except Exception as exc:  # a broken plugin package must not break discovery
            found[name] = PluginEP(name, dist.version, module_name, "", (), f"{type(exc).__name__}: {exc}")
    return tuple(found.values())


def plugin_for_ep(ep_name: str) -> PluginEP | None:
    for plugin in discover_plugin_eps():
        if ep_name in plugin.ep_names:
            return plugin
    return None


def register_plugin(ep_name: str, library_path: str | None = None, *, registration_name: str | None = None) -> str:
    """Register a plugin EP library once per process. Returns '' on success, else ORT's error."""
    import onnxruntime as ort

    build_providers()  # read the build's list before a registration changes it
    key = registration_name or ep_name
    if key in _REGISTRY.registered:
        return ""
    if key in _REGISTRY.failed:
        return _REGISTRY.failed[key]
    if library_path is None:
        plugin = plugin_for_ep(ep_name)
        if plugin is None:
            return f"no installed onnxruntime-ep-* package provides {ep_name}"
        if plugin.error:
            return f"plugin package {plugin.distribution} is broken: {plugin.error}"
        library_path = plugin.library_path
    try:
        ort.register_execution_provider_library(key, library_path)
    except Exception as exc:
        message = str(exc)
        if "already registered" in message.lower():
            _REGISTRY.registered[key] = library_path
            return ""
        _REGISTRY.failed[key] = message
        return message
    _REGISTRY.registered[key] = library_path
    return ""


def ep_devices(ep_name: str | None = None) -> list:
    """``get_ep_devices()`` entries, optionally only those of one EP."""
    import onnxruntime as ort

    if not hasattr(ort, "get_ep_devices"):
        return []
    devices = list(ort.get_ep_devices())
    if ep_name is not None:
        devices = [d for d in devices if d.ep_name == ep_name]
    return devices


def describe_ep_device(device) -> dict:
    hw = device.device
    return {
        "ep_name": device.ep_name,
        "ep_vendor": device.ep_vendor,
        "device_type": str(hw.type).rsplit(".", 1)[-1],
        "device_vendor": hw.vendor,
        "device_id": getattr(hw, "device_id", None),
        "metadata": dict(device.ep_metadata),
    }


def plugin_request(ep_name: str, options: dict[str, str]) -> tuple[list, dict[str, str], str]:
    """(the EP devices to create ``ep_name`` on, the options to pass, '' or why there is no such device).

    Most plugins take every device ORT lists for them and their options as they are; OpenVINO's picks
    its device by ``device_type`` and reads its settings from ``load_config`` (``providers.openvino``)."""
    plugin = plugin_for_ep(ep_name)
    if plugin is not None:
        register_plugin(ep_name, plugin.library_path or None)  # once per process; a failure shows as no device
    devices = ep_devices(ep_name)
    from ortpilot.providers.openvino import OPENVINO, OpenVINOOptionError, listed_devices, pick_devices, plugin_options

    if ep_name != OPENVINO:
        return devices, dict(options), "" if devices else "get_ep_devices() lists none"
    try:
        device, passed = plugin_options(options)
    except OpenVINOOptionError as exc:
        return [], {}, str(exc)
    chosen = pick_devices(devices, device)
    if not chosen:
        listed = ", ".join(listed_devices(devices)) or "none"
        return [], passed, f"get_ep_devices() lists no OpenVINO {device} device (listed: {listed})"
    return chosen[:1], passed, ""


def plugin_build(ep_name: str) -> dict[str, str]:
    """What a compiled blob of ``ep_name`` was built by: ``plugin`` (package and version) and, for
    OpenVINO, ``openvino`` (the runtime inside the package); {} when no plugin package provides it."""
    from ortpilot.providers.openvino import OPENVINO, plugin_openvino_version

    plugin = plugin_for_ep(ep_name)
    if plugin is None or plugin.error:
        return {}
    build = {"plugin": f"{plugin.distribution} {plugin.version}"}
    if ep_name == OPENVINO:
        build["openvino"] = plugin_openvino_version(plugin.library_path)
    return build
