"""The environment doctor: is this ORT installation able to run what the user will ask for?

It gathers facts (distributions, providers, plugin EPs and devices, CPU ISA, NVIDIA driver and
libraries), proves each provider with a real session, and turns problems into findings with
one concrete fix each. It reports; only ``error`` findings (a broken install: clashing ORT
distributions, ORT not importable, the CPU probe failing) make ``exit_code`` 1.

The probe builds a verified session (``ortpilot.session.load``, strict policy), which sits one
layer above this module: ``session.probe`` holds it and ``run_doctor``, and hands the probe to
:func:`examine`, so that the rest of the doctor works even when ORT itself cannot be imported.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ortpilot.eps import CPU_EP
from ortpilot.providers.cpubudget import (
    CpuBudget,
    cpu_budget,
    ort_default_outside,
    ort_default_pinned,
    ort_default_threads,
)
from ortpilot.providers.cpuisa import CpuIsa, Int8Rule, int8_rule, read_cpu_isa
from ortpilot.providers.gpulibs import GpuEnvironment, library_mismatches, scan_gpu_environment
from ortpilot.providers.machineclass import MachineClass, this_class
from ortpilot.providers.openvino import OPENVINO, ORT_DISTRIBUTION
from ortpilot.providers.ortdists import DistributionReport, find_ort_distributions
from ortpilot.providers.plugins import build_providers
from ortpilot.providers.spec import short_name

SEVERITIES = ("ok", "info", "warn", "error")
# Providers that do no local compute, so a probe would prove nothing.
NOT_PROBED = {"AzureExecutionProvider": "runs remote Azure endpoints, no local compute to probe"}
GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider")


@dataclass(frozen=True)
class Finding:
    """One problem or fact, how bad it is, and the one thing to do about it."""

    severity: str
    topic: str
    message: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"severity": self.severity, "topic": self.topic, "message": self.message, "fix": self.fix}


@dataclass
class ProbeResult:
    """A tiny real session on one provider: did it build, run, and place its nodes there?"""

    provider: str
    status: str  # ok | failed | skipped
    reason: str = ""
    share: float | None = None
    seconds: float = 0.0
    kind: str = "built-in"  # built-in | plugin

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "kind": self.kind,
            "status": self.status,
            "reason": self.reason,
            "placement_share": self.share,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class OrtInfo:
    """What the imported ``onnxruntime`` says about itself."""

    version: str | None = None
    path: str | None = None
    package_name: str | None = None
    build_info: str | None = None
    available: list[str] = field(default_factory=list)
    import_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "path": self.path,
            "package_name": self.package_name,
            "build_info": self.build_info,
            "available_providers": self.available,
            "import_error": self.import_error,
        }


@dataclass
class DoctorReport:
    """Everything ``ortpilot doctor`` found; ``to_dict`` is the ``--json`` document."""

    ort: OrtInfo
    distributions: DistributionReport
    plugins: list[dict[str, Any]]
    ep_devices: list[dict[str, Any]]
    probes: list[ProbeResult]
    cpu: CpuIsa
    gpu: GpuEnvironment
    findings: list[Finding]
    cpu_budget: CpuBudget | None = None
    int8: Int8Rule | None = None
    ort_default_threads: int | None = None
    machine_class: MachineClass | None = None  # the class a fleet tune would file this machine under

    @property
    def exit_code(self) -> int:
        return 1 if any(f.severity == "error" for f in self.findings) else 0

    def to_dict(self) -> dict[str, Any]:
        from ortpilot.version import __version__

        return {
            "ortpilot_version": __version__,
            "python": {
                "version": platform.python_version(),
                "executable": sys.executable,
                "platform": platform.platform(),
            },
            "onnxruntime": self.ort.to_dict(),
            "distributions": self.distributions.to_dict(),
            "plugins": self.plugins,
            "ep_devices": self.ep_devices,
            "probes": [p.to_dict() for p in self.probes],
            "cpu": {**self.cpu.to_dict(), "int8_rule": self.int8.to_dict() if self.int8 else None},
            "cpu_budget": {**self.cpu_budget.to_dict(), "ort_default_threads": self.ort_default_threads}
            if self.cpu_budget
            else None,
            "machine_class": self.machine_class.to_dict() if self.machine_class else None,
            "gpu": self.gpu.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "exit_code": self.exit_code,
        }


def read_ort_info() -> OrtInfo:
    """Import ORT and ask it; a failed import is a fact to report, not a crash."""
    try:
        import onnxruntime as ort
    except Exception as exc:  # a clobbered install can raise anything from ImportError to OSError
        return OrtInfo(import_error=f"{type(exc).__name__}: {exc}")
    info = OrtInfo(version=getattr(ort, "__version__", None), path=getattr(ort, "__file__", None))
    try:
        from onnxruntime.capi import build_and_package_info as build

        info.package_name = getattr(build, "package_name", None)
    except Exception:
        pass
    try:
        info.build_info = ort.get_build_info()
        info.available = build_providers()  # the build's own; plugin EPs are probed as plugins
    except Exception as exc:
        info.import_error = f"{type(exc).__name__}: {exc}"
    return info


def plugin_status() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Installed plugin EP packages with their registration result, and every EP device ORT lists."""
    from ortpilot.providers.plugins import describe_ep_device, discover_plugin_eps, ep_devices, register_plugin

    plugins = []
    for plugin in discover_plugin_eps():
        entry = plugin.to_dict()
        entry["registration"] = {}
        for ep in plugin.ep_names:
            error = register_plugin(ep, plugin.library_path or None)
            entry["registration"][ep] = {
                "registered": not error,
                "error": error,
                "devices": len(ep_devices(ep)) if not error else 0,
            }
        plugins.append(entry)
    try:
        devices = [describe_ep_device(d) for d in ep_devices()]
    except Exception:  # ORT too old or broken: the ORT finding covers it
        devices = []
    return plugins, devices


def examine(probe: Callable[[str, str], ProbeResult] | None = None) -> DoctorReport:
    """Examine this environment; ``probe(provider, kind)`` proves each provider with a real session
    (``session.probe.probe_provider``, a layer above this one, passes itself in); None skips it."""
    dists = find_ort_distributions()
    ort_info = read_ort_info()
    plugins, devices = plugin_status() if ort_info.import_error is None else ([], [])
    probes = []
    if probe is not None and ort_info.import_error is None:
        probes = [probe(p, "built-in") for p in ort_info.available]
        probes += [
            probe(ep, "plugin")
            for plugin in plugins
            for ep in plugin.get("ep_names", [])
            if ep not in ort_info.available
        ]
    cpu = read_cpu_isa()
    gpu = scan_gpu_environment()
    budget = cpu_budget()
    rule = int8_rule(cpu)
    try:
        default_threads = ort_default_threads() if ort_info.import_error is None else None
    except Exception:  # a broken build: already an error finding of its own
        default_threads = None
    findings = diagnose(ort_info, dists, plugins, probes, cpu, gpu, budget, rule, default_threads)
    machine_class = this_class() if ort_info.import_error is None else None
    return DoctorReport(
        ort_info, dists, plugins, devices, probes, cpu, gpu, findings, budget, rule, default_threads, machine_class
    )


def diagnose(
    ort_info: OrtInfo,
    dists: DistributionReport,
    plugins: list[dict[str, Any]],
    probes: list[ProbeResult],
    cpu: CpuIsa,
    gpu: GpuEnvironment,
    budget: CpuBudget | None = None,
    rule: Int8Rule | None = None,
    default_threads: int | None = None,
) -> list[Finding]:
    """Turn the facts into findings, worst first."""
    plugin_findings = _plugin_findings(plugins) + _shadowed_plugin_findings(plugins, ort_info.available)
    explained = {
        ep
        for plugin in plugins
        for ep, reg in plugin.get("registration", {}).items()
        if reg["error"] or not reg["devices"]
    }
    findings = (
        _ort_findings(ort_info, dists)
        + _distribution_findings(dists, ort_info)
        + plugin_findings
        + _probe_findings([p for p in probes if p.provider not in explained])
        + [_cpu_finding(cpu, rule)]
        + _budget_findings(budget, default_threads)
        + _gpu_findings(gpu, ort_info)
        + tool_findings()
    )
    return sorted(findings, key=lambda f: -SEVERITIES.index(f.severity))


def _ort_findings(info: OrtInfo, dists: DistributionReport) -> list[Finding]:
    if info.import_error:
        return [
            Finding(
                "error",
                "onnxruntime",
                f"onnxruntime cannot be imported: {info.import_error}",
                "reinstall exactly one ORT build: pip uninstall -y onnxruntime onnxruntime-gpu "
                "onnxruntime-openvino && pip install onnxruntime (or -gpu / -openvino)",
            )
        ]
    return [
        Finding(
            "ok",
            "onnxruntime",
            f"onnxruntime {info.version} ({info.package_name or 'unknown package'}) "
            f"from {info.path}; providers: {', '.join(info.available)}",
        )
    ]


def _distribution_findings(dists: DistributionReport, info: OrtInfo) -> list[Finding]:
    if not dists.distributions:
        return [
            Finding(
                "error",
                "distributions",
                "no installed distribution provides the onnxruntime package",
                "pip install onnxruntime (or onnxruntime-gpu / onnxruntime-openvino)",
            )
        ]
    if not dists.conflict:
        only = dists.distributions[0]
        return [Finding("ok", "distributions", f"one ORT distribution: {only.name} {only.version}")]
    names = [f"{d.name} {d.version}" for d in dists.distributions]
    winner = dists.winner or "unknown"
    won = next((d for d in dists.distributions if d.name == winner), None)
    files = ", ".join(k.rsplit("/", 1)[-1] for k in won.key_files_won) if won and won.key_files_won else "none"
    message = (
        f"{len(names)} distributions share the 'onnxruntime' import: {', '.join(names)}. The files on disk "
        f"are {winner}'s (matching its RECORD: {files})"
    )
    if dists.mixed:
        message += "; some key files come from another distribution, a mix no one released"
    if info.package_name and info.package_name != winner:
        message += f"; the imported build names itself '{info.package_name}'"
    uninstall = " ".join(d.name for d in dists.distributions)
    return [
        Finding(
            "error",
            "distributions",
            message + ".",
            f"pip uninstall -y {uninstall}, then pip install exactly one of them (one virtual "
            "environment per ORT build); uninstalling only one deletes files the other needs.",
        )
    ]


def _plugin_findings(plugins: list[dict[str, Any]]) -> list[Finding]:
    out = []
    for plugin in plugins:
        if plugin.get("error"):
            out.append(
                Finding(
                    "warn",
                    "plugins",
                    f"plugin package {plugin['distribution']} is broken: {plugin['error']}",
                    f"pip install --force-reinstall {plugin['distribution']}",
                )
            )
            continue
        for ep, reg in plugin["registration"].items():
            if reg["error"]:
                out.append(
                    Finding(
                        "warn",
                        "plugins",
                        f"{ep} ({plugin['distribution']} {plugin['version']}) failed to register: {reg['error']}",
                        "install a plugin version built for this ORT version",
                    )
                )
            elif not reg["devices"] and ep == OPENVINO:
                out.append(
                    Finding(
                        "warn",
                        "plugins",
                        f"{ep} ({plugin['distribution']} {plugin['version']}) registered, but get_ep_devices() lists "
                        "no device for it: the OpenVINO plugin lists Intel CPUs (and Intel GPUs and NPUs) only",
                        f"on this CPU, OpenVINO runs through the {ORT_DISTRIBUTION} distribution instead: "
                        f"pip install {ORT_DISTRIBUTION} in its own virtual environment (it replaces onnxruntime), "
                        f"and uninstall {plugin['distribution']}",
                    )
                )
            elif not reg["devices"]:
                out.append(
                    Finding(
                        "warn",
                        "plugins",
                        f"{ep} ({plugin['distribution']} {plugin['version']}) "
                        "registered, but get_ep_devices() lists no device for it",
                        "install the device driver the plugin needs (e.g. Vulkan/Metal/D3D12 for "
                        "WebGPU, the OpenVINO runtime for OpenVINO), or uninstall the plugin",
                    )
                )
            else:
                out.append(Finding("ok", "plugins", f"{ep} registered with {reg['devices']} device(s)"))
    return out


def _shadowed_plugin_findings(plugins: list[dict[str, Any]], built_in: list[str]) -> list[Finding]:
    """A plugin EP whose name the ORT build already has (onnxruntime-openvino and onnxruntime-ep-openvino
    together): sessions get the build's EP by name, so the plugin is installed for nothing, or worse, its
    OpenVINO differs from the build's."""
    return [
        Finding(
            "warn",
            "plugins",
            f"two providers of {ep}: the ORT build's own and the plugin {plugin['distribution']} "
            f"{plugin['version']}; sessions get the build's, the plugin is never used",
            f"keep one: pip uninstall {plugin['distribution']} (the build's {short_name(ep)} stays), or use stock "
            "onnxruntime with the plugin in another virtual environment",
        )
        for plugin in plugins
        for ep in plugin.get("ep_names", [])
        if ep in built_in
    ]


def _probe_findings(probes: list[ProbeResult]) -> list[Finding]:
    out = []
    for p in probes:
        if p.status == "ok":
            share = f", {p.share:.0%} of nodes on it" if p.share is not None else ""
            out.append(Finding("ok", "probe", f"{p.provider}: session built and ran{share}"))
        elif p.status == "skipped":
            out.append(Finding("info", "probe", f"{p.provider}: not probed ({p.reason})"))
        else:
            severe = "error" if p.provider == CPU_EP else "warn"
            out.append(
                Finding(
                    severe,
                    "probe",
                    f"{p.provider}: probe failed: {p.reason}",
                    "see the GPU/plugin findings; 'ortpilot run MODEL -p <provider> --policy strict' "
                    "shows the full reason",
                )
            )
    return out


# Python packages ortpilot's steps import from ORT's tools or beside them: what breaks without each.
TOOLS = {
    "sympy": (
        "warn",
        "ORT's transformer fusions and quantization pre-processing (symbolic shape inference) "
        "fail with an ImportError (tune records its fusion candidates as failed)",
    ),
    "onnxscript": (
        "info",
        "the decoder fusion (generate --fuse, quantize --fuse, tune's gqa candidates) is unavailable",
    ),
    "tokenizers": ("info", "generate --prompt TEXT cannot read a tokenizer.json (--prompt-ids still works)"),
}


def tool_findings() -> list[Finding]:
    """One finding per helper package: present, or what is lost without it and how to install it."""
    out = []
    for name, (severity, lost) in TOOLS.items():
        if importlib.util.find_spec(name) is not None:
            out.append(Finding("ok", "python tools", f"{name} is installed"))
        else:
            out.append(Finding(severity, "python tools", f"{name} is not installed: {lost}", f"pip install {name}"))
    return out


def _cpu_finding(cpu: CpuIsa, rule: Int8Rule | None = None) -> Finding:
    level, verdict = cpu.int8_verdict()
    present = ", ".join(k for k, v in cpu.flags.items() if v) or "none detected"
    fix = "" if level != "warn" else "prefer fp32 or measure: 'ortpilot quantize ... --max-error' then 'ortpilot bench'"
    if rule is None or not rule.measured:
        return Finding(level, "cpu", f"{cpu.model}: {present}. {verdict}", fix)
    if rule.flags_rule != rule.name and "measured probe" in rule.reason:  # the flags lie to ORT's CPUID check
        return Finding(
            "warn",
            "cpu",
            f"{cpu.model}: {present}. INT8 rule '{rule.name}': {rule.reason}.",
            "trust the measurement: 'ortpilot tune' uses it; INT8 profiles from a machine where the "
            "flags were true are refused here",
        )
    if rule.u8s8_saturates:
        fix = (
            "quantize with --reduce-range (7-bit weights) or --weight-type quint8 (U8U8), then measure "
            "('ortpilot tune' tries both on this CPU)"
        )
    return Finding(level, "cpu", f"{cpu.model}: {present}. {verdict} INT8 rule '{rule.name}': {rule.reason}.", fix)


def _budget_findings(budget: CpuBudget | None, default_threads: int | None) -> list[Finding]:
    if budget is None:
        return []
    out = [Finding("info", "cpu budget", note, "check the container's cgroup mount") for note in budget.notes]
    text = f"this process may use {budget.describe()}"
    if default_threads and default_threads > budget.cpus:
        out.append(
            Finding(
                "warn",
                "cpu budget",
                f"{text}; ORT's default session starts {default_threads} intra-op "
                "threads anyway (it ignores cgroup quotas and sets its pool threads' affinity itself)"
                + (
                    f", and runs them on CPU {', '.join(map(str, sorted(outside)))} outside this process's own"
                    if (outside := ort_default_outside())
                    else ", so they compete for the CPUs"
                ),
                f"set intra_op_num_threads={budget.cpus} (ortpilot.load(..., settings=SessionSettings("
                f"intra_op_threads={budget.cpus})) or tune here: profiles record explicit thread counts)",
            )
        )
    else:
        out.append(
            Finding(
                "ok",
                "cpu budget",
                text
                + (f"; ORT's default session starts {default_threads} intra-op threads" if default_threads else ""),
            )
        )
        if default_threads and (pinned := ort_default_pinned()):
            out.append(_pinned_finding(pinned))
    return out


def _pinned_finding(pinned: frozenset[int]) -> Finding:
    """ORT's default session pins its pool threads; where the calling thread lands on one's CPU the two share
    it (BENCHMARKS.md, "ORT's default session and the calling thread's CPU")."""
    cpus = ", ".join(map(str, sorted(pinned)))
    return Finding(
        "info",
        "cpu budget",
        f"ORT's default session pins a pool thread to CPU {cpus}; when the OS puts the thread that calls run() "
        "there too, the two share one CPU while another idles (measured on a 2-CPU VM: the demo encoder's "
        "default 0.65-0.72 ms instead of 0.43 ms, for minutes)",
        "set intra_op_num_threads explicitly (ortpilot profiles do: such a pool pins nothing), or keep the calling "
        f"thread off CPU {cpus}",
    )


def _gpu_findings(gpu: GpuEnvironment, info: OrtInfo) -> list[Finding]:
    wants_gpu = [p for p in info.available if p in GPU_PROVIDERS]
    out = []
    if wants_gpu and gpu.driver_version is None:
        out.append(
            Finding(
                "warn",
                "gpu",
                f"this ORT build has {', '.join(wants_gpu)} but no NVIDIA driver was "
                "found (nvidia-smi missing): sessions fall back to CPU",
                "install the NVIDIA driver, or use the CPU package (pip install onnxruntime)",
            )
        )
    if wants_gpu:
        for _, problem in library_mismatches(gpu):
            out.append(
                Finding(
                    "warn",
                    "gpu",
                    problem,
                    "pip install onnxruntime-gpu[cuda,cudnn] (ships matching CUDA/cuDNN wheels) or "
                    "install the matching CUDA toolkit/cuDNN and add them to LD_LIBRARY_PATH",
                )
            )
        if "TensorrtExecutionProvider" in wants_gpu and not gpu.majors("tensorrt"):
            out.append(
                Finding(
                    "warn",
                    "gpu",
                    "TensorrtExecutionProvider is in this build but libnvinfer was not found",
                    "pip install tensorrt (the major this ORT release names in its docs)",
                )
            )
    if gpu.driver_version and not wants_gpu:
        out.append(
            Finding(
                "info",
                "gpu",
                f"NVIDIA driver {gpu.driver_version} present, but this ORT build has no CUDA/TensorRT provider",
                "pip install onnxruntime-gpu in its own virtual environment",
            )
        )
    if not wants_gpu and not gpu.driver_version:
        found = [f"{fam} {gpu.majors(fam)}" for fam in ("cuda_runtime", "cudnn", "tensorrt") if gpu.majors(fam)]
        out.append(
            Finding(
                "info",
                "gpu",
                "no NVIDIA driver and a CPU-only ORT build"
                + (f" (libraries present: {', '.join(found)})" if found else ""),
            )
        )
    return out


__all__ = ["NOT_PROBED", "DoctorReport", "Finding", "ProbeResult", "diagnose", "examine"]
