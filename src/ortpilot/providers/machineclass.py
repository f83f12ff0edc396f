"""Machine classes: the machines on which one tune's winner holds, keyed by the facts that decide it.

A fleet is tuned once per class, not once per node. Two machines are of one class when
everything that can change a tune's winner is the same (docs/concepts/fleets.md):

- ``arch``: the CPU architecture (other kernels for every op);
- ``int8``: the INT8 rule from ORT's *measured* u8s8 kernel (``providers.cpuisa.int8_rule``:
  exact VNNI/AMX/Arm dot product, or x86's saturating ``vpmaddubsw``);
- ``cpus``: the CPU budget (``providers.cpubudget``), which bounds every thread count the search
  tries; on a Ray node, the node's CPUs where they are fewer;
- ``eps`` and ``devices``: the execution providers that compute locally and the non-CPU
  devices ORT lists for them (``get_ep_devices``);
- ``ort`` and ``ort_build``: ORT's major.minor version and its distribution (``onnxruntime``,
  ``onnxruntime-gpu``, ...), which pick the kernels and the fusions.

The fp32 SIMD flags and the CPU model are recorded in a profile's ``machine`` section but are
not part of the class: they change latencies, not which candidates are valid. A class has an id
(the first 12 hex digits of the sha256 of its key) and a readable name built from the key
(``x86-vnni-2cpu``, ``x86-avx2-1cpu``, ``arm-dot-4cpu+cuda``, ``x86-amx-2cpu+openvino``).
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ortpilot.eps import CPU_EP
from ortpilot.providers.cpubudget import this_budget
from ortpilot.providers.cpuisa import RULES, int8_rule
from ortpilot.providers.spec import NOT_COMPUTE, short_name

KEY_VERSION = 1
KEY_FIELDS = ("version", "arch", "int8", "cpus", "eps", "devices", "ort", "ort_build")
_ISA_WORD = {"vnni": "vnni", "amx": "amx", "x86-no-vnni": "avx2", "arm-dot": "dot", "unknown": "generic"}
_ARCH_WORD = {"x86_64": "x86", "amd64": "x86", "aarch64": "arm", "arm64": "arm"}
_ID = re.compile(r"^[0-9a-f]{12}$")


@dataclass(frozen=True)
class MachineClass:
    """One class of machines: its key (the facts that decide a winner), id and readable name."""

    name: str
    id: str
    key: dict[str, Any]

    @property
    def cpus(self) -> int:
        return int(self.key["cpus"])

    def describe(self) -> str:
        """``x86-avx2-2cpu (x86_64; INT8 rule x86-no-vnni; 2 CPUs; CPU; ORT 1.32 onnxruntime)``."""
        key = self.key
        eps = ", ".join(short_name(e).upper() if short_name(e) != e else e for e in key["eps"]) or "no EP"
        devices = f"; devices {', '.join(key['devices'])}" if key["devices"] else ""
        return (
            f"{self.name} ({key['arch']}; INT8 rule {key['int8']}; {key['cpus']} CPU{'s' if key['cpus'] != 1 else ''}; "
            f"{eps}{devices}; ORT {key['ort']} {key['ort_build']})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "id": self.id, "key": dict(self.key)}


def class_of(key: Mapping[str, Any]) -> MachineClass:
    """The class with ``key`` (its id and readable name derived from it)."""
    key = {name: key[name] for name in KEY_FIELDS}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
    return MachineClass(class_name(key), digest, key)


def class_name(key: Mapping[str, Any]) -> str:
    """``ARCH-ISA-NcpuS[-EP...]``: what a person reads; the id, not the name, tells classes apart."""
    arch = str(key["arch"]).lower()
    word = _ARCH_WORD.get(arch, re.sub(r"[^a-z0-9]+", "", arch) or "cpu")
    parts = [word, _ISA_WORD.get(str(key["int8"]), "generic"), f"{key['cpus']}cpu"]
    eps = sorted({short_name(e).lower() for e in key["eps"] if e != CPU_EP})
    return "-".join(re.sub(r"[^a-z0-9]+", "", p) for p in parts) + "".join(
        "+" + re.sub(r"[^a-z0-9]+", "", e) for e in eps
    )


def class_key(
    *,
    arch: str,
    int8: str,
    cpus: int,
    eps: Sequence[str],
    devices: Sequence[str] = (),
    ort_version: str,
    ort_build: str,
) -> dict[str, Any]:
    """The key of a machine with these facts (``ort_build``: the distributions, versions dropped)."""
    return {
        "version": KEY_VERSION,
        "arch": arch,
        "int8": int8,
        "cpus": max(1, int(cpus)),
        # a virtual EP (OpenVINO's plugin lists ``OpenVINOExecutionProvider.AUTO``) is its EP on a meta-device
        "eps": sorted({e for e in eps if e not in NOT_COMPUTE and "." not in e}),
        "devices": sorted(set(devices)),
        "ort": ".".join(str(ort_version).split(".")[:2]),
        "ort_build": ",".join(sorted({d.split("==")[0] for d in str(ort_build).split(",") if d})) or "unknown",
    }


def this_class(cpus: int | None = None) -> MachineClass:
    """This process's class; ``cpus`` replaces the CPU budget where fewer are given (a Ray node's CPUs)."""
    import onnxruntime as ort

    from ortpilot.artifacts.stamp import ort_distribution
    from ortpilot.providers.plugins import compute_providers

    budget = this_budget().cpus
    return class_of(
        class_key(
            arch=platform.machine(),
            int8=int8_rule().name,
            cpus=min(budget, cpus) if cpus else budget,
            eps=compute_providers(),
            devices=_devices(),
            ort_version=ort.__version__,
            ort_build=ort_distribution(),
        )
    )


def _devices() -> list[str]:
    """``EP:TYPE:VENDOR:ID`` for every non-CPU device ORT lists (``get_ep_devices``; none before ORT 1.22)."""
    from ortpilot.providers.plugins import describe_ep_device, ep_devices

    try:
        found = [describe_ep_device(d) for d in ep_devices()]
    except Exception:  # an ORT without device discovery: the EP set alone speaks for the devices
        return []
    return [
        f"{d['ep_name']}:{d['device_type']}:{d['device_vendor']}:{d['device_id']}"
        for d in found
        if d["device_type"] != "CPU"
    ]


# ------------------------------------------------------------------ reading a recorded class


def check_class(value: Any, where: str) -> MachineClass:
    """A recorded class (``{name, id, key}``), checked by type and against its own id; ``ValueError``
    names the field (the caller, which knows the file, turns it into its message)."""
    if not isinstance(value, Mapping) or set(value) != {"name", "id", "key"}:
        raise ValueError(f"{where} must be an object with name, id and key")
    key = value["key"]
    if not isinstance(key, Mapping) or set(key) != set(KEY_FIELDS):
        raise ValueError(f"{where}.key must hold exactly {', '.join(KEY_FIELDS)}")
    if key["version"] != KEY_VERSION:
        raise ValueError(f"{where}.key.version is {key['version']!r}; this ortpilot reads class keys of version 1")
    if key["int8"] not in RULES:
        raise ValueError(f"{where}.key.int8 must be one of {', '.join(RULES)}, got {key['int8']!r}")
    if type(key["cpus"]) is not int or not 1 <= key["cpus"] <= 1 << 16:
        raise ValueError(f"{where}.key.cpus must be a positive integer, got {key['cpus']!r}")
    for name in ("arch", "ort", "ort_build"):
        if not isinstance(key[name], str) or not key[name] or len(key[name]) > 256:
            raise ValueError(f"{where}.key.{name} must be a non-empty string")
    for name in ("eps", "devices"):
        if not isinstance(key[name], list) or not all(isinstance(x, str) and len(x) <= 512 for x in key[name]):
            raise ValueError(f"{where}.key.{name} must be a list of strings")
    if not isinstance(value["id"], str) or not _ID.match(value["id"]):
        raise ValueError(f"{where}.id must be 12 hex digits")
    found = class_of(key)
    if found.id != value["id"]:
        raise ValueError(f"{where}.id {value['id']} is not the id of its key ({found.id}): the key was edited")
    if not isinstance(value["name"], str) or not value["name"]:
        raise ValueError(f"{where}.name must be a non-empty string")
    return MachineClass(value["name"], found.id, found.key)


# ------------------------------------------------------------------ the nearest class


def differences(here: MachineClass, there: MachineClass) -> list[str]:
    """What differs between two classes, in words (``cpus 2 here, 1 there``)."""
    out = []
    for name in KEY_FIELDS[1:]:
        if here.key[name] != there.key[name]:
            a, b = here.key[name], there.key[name]
            a, b = (", ".join(a) or "none", ", ".join(b) or "none") if isinstance(a, list) else (a, b)
            out.append(f"{name} {a} here, {b} there")
    return out


def _distance(here: MachineClass, there: MachineClass) -> tuple[int, ...]:
    """Which difference costs most: the architecture, the ORT build, the EPs and devices, the INT8 rule,
    the ORT version, then the CPUs (fewer CPUs there is nearer than more: its threads fit here)."""
    h, t = here.key, there.key
    cpus = h["cpus"] - t["cpus"]
    return (
        int(h["arch"] != t["arch"]),
        int(h["ort_build"] != t["ort_build"]),
        int(h["eps"] != t["eps"]) + int(h["devices"] != t["devices"]),
        int(h["int8"] != t["int8"]),
        int(h["ort"] != t["ort"]),
        int(cpus < 0),
        abs(cpus),
    )


def nearest_class(here: MachineClass, among: Sequence[MachineClass]) -> MachineClass | None:
    """The class in ``among`` whose differences from ``here`` can change a winner least (None if empty;
    ties keep ``among``'s order)."""
    return min(among, key=lambda c: _distance(here, c)) if among else None


__all__ = [
    "KEY_FIELDS",
    "MachineClass",
    "check_class",
    "class_key",
    "class_name",
    "class_of",
    "differences",
    "nearest_class",
    "this_class",
]
