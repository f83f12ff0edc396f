"""The machine a profile was measured on, and what about this one can change its winner.

A tune's answer holds for the kernels it ran. Two facts decide whether it still holds
elsewhere: which INT8 kernel ORT runs (an INT8 winner picked where u8s8 products are exact can
lose, or clip, where they saturate: x86 without VNNI) and how many CPUs the process may use (a
winner with 4 intra-op threads on a 1-CPU container oversubscribes). :func:`machine_facts`
records them, with the flags that pick fp32 kernels, in ``profile.json``'s ``machine``
section; :func:`compare_machines` lists the differences, marking the decisive ones.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ortpilot.errors import UsageError
from ortpilot.providers.cpubudget import ort_default_threads, this_budget
from ortpilot.providers.cpuisa import KERNEL_FLAGS, RULES, int8_rule, probe_int8_kernels, this_cpu

_FLAG_NAMES = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX-512 VNNI",
    "avx_vnni": "AVX-VNNI",
    "amx_int8": "AMX-INT8",
    "asimddp": "Arm dotprod",
    "i8mm": "Arm i8mm",
}


def machine_facts() -> dict[str, Any]:
    """This machine as a profile records it (JSON-ready)."""
    isa = this_cpu()
    rule = int8_rule(isa)
    kernels = probe_int8_kernels()
    budget = this_budget()
    flags = isa.kernel_flags()
    return {
        "cpu": isa.model,
        "arch": platform.machine(),
        "isa_flags": flags,
        "int8": {
            "rule": rule.name,
            "u8s8_exact": kernels.u8s8_exact,
            "u8u8_exact": kernels.u8u8_exact,
            "source": kernels.source,
        },
        "cores": os.cpu_count() or 1,
        "cpu_budget": {"cpus": budget.cpus, "source": budget.source},
        "ort_default_threads": ort_default_threads(),
        # Kept for readers of profiles written before the fields above existed.
        "isa": "avx512" if flags["avx512f"] else "avx2" if flags["avx2"] else "neon" if isa.arm_dot else "baseline",
        "flags": sorted(k for k, v in flags.items() if v),
        "os": platform.platform(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }


# ------------------------------------------------------------------ reading a recorded section


def _fail(path: str, field_name: str, problem: str) -> UsageError:
    return UsageError(
        f"Profile '{path}' has a malformed machine section: machine.{field_name} {problem}. "
        "The file was edited or damaged; regenerate it with 'ortpilot tune' (or restore it)."
    )


def check_machine_section(section: Any, path: str = "profile.json") -> dict[str, Any]:
    """Validate a recorded ``machine`` section by type and range (old and new layouts); UsageError names the field."""
    if not isinstance(section, Mapping):
        raise _fail(path, "", f"must be an object, got {type(section).__name__}")
    for key in ("cpu", "arch", "isa", "os", "python", "hostname"):
        if key in section and not isinstance(section[key], str):
            raise _fail(path, key, f"must be a string, got {section[key]!r}")
    for key in ("cores", "ort_default_threads"):
        if key in section and (type(section[key]) is not int or section[key] < 1):
            raise _fail(path, key, f"must be a positive integer, got {section[key]!r}")
    flags = section.get("isa_flags", {})
    if not isinstance(flags, Mapping) or not all(isinstance(k, str) and type(v) is bool for k, v in flags.items()):
        raise _fail(path, "isa_flags", "must map flag names to true/false")
    listed = section.get("flags", [])
    if not isinstance(listed, list) or not all(isinstance(f, str) for f in listed):
        raise _fail(path, "flags", "must be a list of flag names")
    int8 = section.get("int8", {})
    if not isinstance(int8, Mapping):
        raise _fail(path, "int8", "must be an object")
    if "rule" in int8 and int8["rule"] not in RULES:
        raise _fail(path, "int8.rule", f"must be one of {', '.join(RULES)}, got {int8['rule']!r}")
    for key in ("u8s8_exact", "u8u8_exact"):
        if key in int8 and int8[key] is not None and type(int8[key]) is not bool:
            raise _fail(path, f"int8.{key}", f"must be true, false or null, got {int8[key]!r}")
    budget = section.get("cpu_budget", {})
    if not isinstance(budget, Mapping):
        raise _fail(path, "cpu_budget", "must be an object")
    if "cpus" in budget and (type(budget["cpus"]) is not int or budget["cpus"] < 1):
        raise _fail(path, "cpu_budget.cpus", f"must be a positive integer, got {budget['cpus']!r}")
    return dict(section)


def _recorded_flags(section: Mapping[str, Any]) -> dict[str, bool]:
    if section.get("isa_flags"):
        return {k: bool(section["isa_flags"].get(k, False)) for k in KERNEL_FLAGS}
    listed = set(section.get("flags") or ())
    return {k: k in listed for k in KERNEL_FLAGS}


def _recorded_u8s8_exact(section: Mapping[str, Any]) -> bool | None:
    """Measured when recorded; for older profiles, what their flags imply (None: cannot tell)."""
    int8 = section.get("int8") or {}
    if int8.get("u8s8_exact") is not None:
        return bool(int8["u8s8_exact"])
    flags = _recorded_flags(section)
    if not any(flags.values()):
        return None
    if flags["avx512_vnni"] or flags["avx_vnni"] or flags["amx_int8"] or flags["asimddp"] or flags["i8mm"]:
        return True
    return False if flags["avx2"] or flags["avx512bw"] else None


def _recorded_rule(section: Mapping[str, Any]) -> str:
    int8 = section.get("int8") or {}
    if int8.get("rule"):
        return str(int8["rule"])
    flags = _recorded_flags(section)
    if flags["amx_int8"]:
        return "amx"
    if flags["avx512_vnni"] or flags["avx_vnni"]:
        return "vnni"
    if flags["asimddp"] or flags["i8mm"]:
        return "arm-dot"
    return "x86-no-vnni" if flags["avx2"] or flags["avx512bw"] else "unknown"


def describe_machine(section: Mapping[str, Any]) -> str:
    """``AMD EPYC (x86_64; AVX2, AVX-512, AVX-512 VNNI; u8s8 exact; 2 CPUs)``."""
    flags = _recorded_flags(section)
    shown = [name for key, name in _FLAG_NAMES.items() if flags.get(key)]
    exact = _recorded_u8s8_exact(section)
    int8 = "u8s8 exact" if exact else "u8s8 saturates" if exact is False else "u8s8 unknown"
    budget = (section.get("cpu_budget") or {}).get("cpus") or section.get("cores")
    cpus = f"; {budget} CPU{'s' if budget != 1 else ''}" if budget else ""
    return (
        f"{section.get('cpu') or 'unknown CPU'} ({section.get('arch') or '?'}; "
        f"{', '.join(shown) or 'no SIMD flags recorded'}; {int8}{cpus})"
    )


# ------------------------------------------------------------------ comparing


@dataclass(frozen=True)
class MachineDifference:
    """One way this machine differs from the recorded one; ``decisive`` when it can change the winner."""

    field: str
    recorded: Any
    here: Any
    decisive: bool
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "recorded": self.recorded,
            "here": self.here,
            "decisive": self.decisive,
            "why": self.why,
        }


@dataclass(frozen=True)
class MachineCheck:
    """The recorded machine against this one."""

    recorded: str
    here: str
    differences: list[MachineDifference] = field(default_factory=list)
    same_kernels: bool = True  # same arch, kernel flags and INT8 exactness: bit-exact outputs can be claimed

    @property
    def decisive(self) -> list[MachineDifference]:
        return [d for d in self.differences if d.decisive]

    def to_dict(self) -> dict[str, Any]:
        return {
            "recorded": self.recorded,
            "here": self.here,
            "same_kernels": self.same_kernels,
            "differences": [d.to_dict() for d in self.differences],
        }


def compare_machines(
    recorded: Mapping[str, Any], here: Mapping[str, Any] | None = None, *, int8: bool = False, threads: int = 0
) -> MachineCheck:
    """What differs between ``recorded`` and ``here`` (this machine by default) for a profile whose
    winner is INT8 (``int8``) and runs ``threads`` threads."""
    here = here if here is not None else machine_facts()
    diffs: list[MachineDifference] = []
    arch_then, arch_now = recorded.get("arch"), here.get("arch")
    if arch_then and arch_now and arch_then != arch_now:
        diffs.append(
            MachineDifference(
                "arch", arch_then, arch_now, True, "another CPU architecture runs other kernels for every op"
            )
        )
    exact_then, exact_now = _recorded_u8s8_exact(recorded), _recorded_u8s8_exact(here)
    rule_then, rule_now = _recorded_rule(recorded), _recorded_rule(here)
    if rule_then != rule_now or (exact_then is not None and exact_now is not None and exact_then != exact_now):
        what = {True: "exact", False: "saturating", None: "unknown"}
        why = (
            f"ORT's u8s8 INT8 kernel is {what[exact_now]} here and was {what[exact_then]} there "
            f"(INT8 rule '{rule_now}' vs '{rule_then}')"
        )
        diffs.append(
            MachineDifference(
                "int8",
                rule_then,
                rule_now,
                int8,
                why
                + (
                    ": the INT8 winner was chosen for kernels this CPU does not have"
                    if int8
                    else "; the profile runs no INT8 model"
                ),
            )
        )
    flags_then, flags_now = _recorded_flags(recorded), _recorded_flags(here)
    changed = sorted(k for k in KERNEL_FLAGS if flags_then[k] != flags_now[k] and any(flags_then.values()))
    if changed:
        diffs.append(
            MachineDifference(
                "isa_flags",
                {k: flags_then[k] for k in changed},
                {k: flags_now[k] for k in changed},
                False,
                "other SIMD flags pick other fp32 kernels: latencies may differ",
            )
        )
    budget_now = int((here.get("cpu_budget") or {}).get("cpus") or here.get("cores") or 1)
    budget_then = (recorded.get("cpu_budget") or {}).get("cpus") or recorded.get("cores")
    if threads > budget_now:
        diffs.append(
            MachineDifference(
                "cpu_budget",
                budget_then,
                budget_now,
                True,
                f"the profile runs {threads} threads and this process may use {budget_now} "
                "CPUs: its threads would compete for them",
            )
        )
    elif budget_then and budget_then != budget_now:
        diffs.append(
            MachineDifference(
                "cpu_budget",
                budget_then,
                budget_now,
                False,
                "another CPU budget: the thread count tuned there may not be the best here",
            )
        )
    if recorded.get("cpu") and here.get("cpu") and recorded["cpu"] != here["cpu"]:
        diffs.append(MachineDifference("cpu", recorded["cpu"], here["cpu"], False, "another CPU model"))
    same = (
        (arch_then == arch_now or not arch_then) and not changed and exact_then == exact_now and rule_then == rule_now
    )
    return MachineCheck(describe_machine(recorded), describe_machine(here), diffs, same)


__all__ = [
    "MachineCheck",
    "MachineDifference",
    "check_machine_section",
    "compare_machines",
    "describe_machine",
    "machine_facts",
]
