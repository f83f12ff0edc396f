"""CPU instruction set extensions that decide whether, and how, INT8 pays off on this CPU.

ORT's CPU kernels (MLAS) pick their INT8 GEMM kernels by ISA at run time, so the same quantized
model can be faster or slower than fp32, and even give other numbers, depending on the CPU:

- x86-64 with VNNI (``vpdpbusd``) or AMX, and Arm with dot-product instructions, accumulate
  u8 x s8 products in int32: exact.
- x86-64 with AVX2 or AVX-512 but no VNNI uses ``vpmaddubsw`` for u8 x s8, whose int16 pair sums
  saturate (255 * 127 * 2 > 32767). ORT's documentation gives two ways out: ``reduce_range``
  (7-bit weights, the pair sums then fit) or U8U8 (u8 weights take another, exact kernel).

The flags in ``/proc/cpuinfo`` say what the CPU advertises; :func:`probe_int8_kernels` measures
what ORT's kernel really computes (one tiny MatMulInteger whose exact result saturates int16
pair sums). The two can disagree (an emulator, or a hypervisor that hides VNNI from CPUID):
:func:`int8_rule` trusts the measurement and says so.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortpilot.eps import CPU_EP

# flag in /proc/cpuinfo -> what it means for ORT INT8/low-precision inference.
ISA_MEANING: dict[str, str] = {
    "avx2": "256-bit SIMD; INT8 via vpmaddubsw (u8s8 pairs saturate at int16, hence reduce_range)",
    "fma": "fused multiply-add for fp32 kernels",
    "avx512f": "512-bit SIMD for fp32 and INT8 kernels",
    "avx512bw": "512-bit byte/word ops (AVX-512 INT8 kernels without VNNI use vpmaddubsw too)",
    "avx512_vnni": "VNNI (vpdpbusd): fast u8s8 dot products for dynamic and static INT8",
    "avx_vnni": "AVX-VNNI: the 256-bit VNNI dot products (Alder Lake and later)",
    "avx512_bf16": "BF16 dot products",
    "amx_tile": "AMX tiles: matrix units (Sapphire Rapids and later)",
    "amx_int8": "AMX INT8: tile matrix units for u8s8 GEMMs (exact, like VNNI)",
    "amx_bf16": "AMX BF16: large BF16 matmul speedups",
    "asimddp": "Arm dot product (sdot/udot): fast INT8 on Arm",
    "i8mm": "Arm INT8 matrix multiply (smmla/ummla)",
}
# The flags that change which INT8 (and fp32) kernels ORT runs: what a profile records.
KERNEL_FLAGS = (
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimddp",
    "i8mm",
)
# Int8Rule.name values.
RULES = ("amx", "vnni", "arm-dot", "x86-no-vnni", "unknown")


@dataclass
class CpuIsa:
    """The CPU's model name, the relevant flags present, and the INT8 verdict."""

    model: str
    machine: str
    flags: dict[str, bool] = field(default_factory=dict)
    source: str = ""

    @property
    def vnni(self) -> bool:
        return self.flags.get("avx512_vnni", False) or self.flags.get("avx_vnni", False)

    @property
    def amx(self) -> bool:
        return self.flags.get("amx_int8", False)

    @property
    def arm_dot(self) -> bool:
        return self.flags.get("asimddp", False) or self.flags.get("i8mm", False)

    def kernel_flags(self) -> dict[str, bool]:
        """The flags that change which kernels ORT runs (what a profile records), present or not."""
        return {name: bool(self.flags.get(name, False)) for name in KERNEL_FLAGS}

    def rule_from_flags(self) -> str:
        """The INT8 rule the advertised flags imply (one of ``RULES``)."""
        if self.amx:
            return "amx"
        if self.vnni:
            return "vnni"
        if self.arm_dot:
            return "arm-dot"
        if self.flags.get("avx2") or self.flags.get("avx512bw"):
            return "x86-no-vnni"
        return "unknown"

    def int8_verdict(self) -> tuple[str, str]:
        """(level, sentence): what INT8 quantization is likely to do on this CPU."""
        if self.amx:
            return "ok", (
                "AMX INT8 present: u8s8 products accumulate exactly, as with VNNI, so dynamic and static "
                "INT8 usually beat fp32 on MatMul-heavy models (conv nets still need measuring)."
            )
        if self.vnni:
            return "ok", (
                "VNNI present: fast u8s8 dot products, so dynamic and static INT8 usually beat fp32 "
                "on MatMul-heavy models (conv nets still need measuring)."
            )
        if self.arm_dot:
            return "ok", "Arm dot-product instructions present: INT8 kernels are fast."
        if self.flags.get("avx2"):
            return "warn", (
                "AVX2 without VNNI: INT8 uses saturating vpmaddubsw; it can be slower than fp32, "
                "especially for conv nets, and u8s8 products can clip (reduce_range or U8U8 "
                "weights avoid it). Measure before shipping INT8 ('ortpilot bench')."
            )
        if not self.flags:
            return "info", "CPU flags unknown on this platform; measure INT8 against fp32."
        return "warn", "No AVX2/VNNI: INT8 is likely slower than fp32 on this CPU."

    def to_dict(self) -> dict[str, Any]:
        level, verdict = self.int8_verdict()
        return {
            "model": self.model,
            "machine": self.machine,
            "source": self.source,
            "flags": self.flags,
            "meaning": {k: ISA_MEANING[k] for k, v in self.flags.items() if v},
            "int8": {"level": level, "verdict": verdict},
        }


def read_cpu_isa(cpuinfo: str | Path = "/proc/cpuinfo") -> CpuIsa:
    """Parse ``/proc/cpuinfo`` (Linux); elsewhere only the machine type is known."""
    path = Path(cpuinfo)
    machine = platform.machine()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return CpuIsa(platform.processor() or machine, machine, {}, "unavailable")
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    present = {name: name in flags for name in ISA_MEANING}
    # Older kernels spell the AVX-512 VNNI flag without the underscore.
    present["avx512_vnni"] = present["avx512_vnni"] or "avx512vnni" in flags
    relevant = {k: v for k, v in present.items() if not k.startswith(("asimd", "i8mm")) or "asimd" in flags}
    return CpuIsa(model or machine, machine, relevant, str(path))


@functools.lru_cache(maxsize=1)
def this_cpu() -> CpuIsa:
    """This machine's CPU, read once per process."""
    return read_cpu_isa()


@dataclass(frozen=True)
class Int8Kernels:
    """What ORT's CPU INT8 GEMM computed in the probe: exact int32 sums, or saturated int16 pairs."""

    u8s8_exact: bool | None  # None: not measured
    u8u8_exact: bool | None
    source: str  # "measured with onnxruntime X" or why it could not be

    def to_dict(self) -> dict[str, Any]:
        return {"u8s8_exact": self.u8s8_exact, "u8u8_exact": self.u8u8_exact, "source": self.source}


def _matmul_integer_probe(weight_type: int) -> tuple[int, int]:
    """(ORT's result, the exact result) of a 1x64 all-255 uint8 row times a 64x4 weight of the
    type's largest value: every vpmaddubsw pair sum (2 * 255 * 127 = 64770) overflows int16."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    k = 64
    signed = weight_type == TensorProto.INT8
    value = 127 if signed else 255
    weight = np.full((k, 4), value, np.int8 if signed else np.uint8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "int8_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 4])],
        [numpy_helper.from_array(weight, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=[CPU_EP])
    got = sess.run(None, {"a": np.full((1, k), 255, np.uint8)})[0]
    return int(got.min()), 255 * value * k


@functools.lru_cache(maxsize=1)
def probe_int8_kernels() -> Int8Kernels:
    """Run ORT's u8s8 and u8u8 MatMulInteger once each (a few ms) and see whether they saturate."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto

        exact = {}
        for name, dtype in (("u8s8", TensorProto.INT8), ("u8u8", TensorProto.UINT8)):
            got, want = _matmul_integer_probe(dtype)
            exact[name] = got == want
        return Int8Kernels(exact["u8s8"], exact["u8u8"], f"measured with onnxruntime {ort.__version__}")
    except Exception as exc:  # no ORT, or a build without the CPU INT8 kernels
        return Int8Kernels(None, None, f"not measured ({type(exc).__name__}: {exc})")


@dataclass(frozen=True)
class Int8Rule:
    """Which INT8 rule applies here (one of ``RULES``), whether u8s8 saturates, and why."""

    name: str
    u8s8_saturates: bool
    reason: str
    flags_rule: str = ""  # what the advertised flags alone imply
    measured: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "u8s8_saturates": self.u8s8_saturates,
            "reason": self.reason,
            "flags_rule": self.flags_rule,
            "measured": self.measured,
        }


_RULE_REASONS = {
    "amx": "AMX INT8 (flags): u8s8 products accumulate exactly; 8-bit weights as they are",
    "vnni": "VNNI (flags): u8s8 products accumulate exactly in vpdpbusd; 8-bit weights as they are",
    "arm-dot": "Arm dot product (flags): ORT's INT8 kernels are exact and fast; S8S8 QDQ is ORT's first choice",
    "x86-no-vnni": (
        "x86 without VNNI: u8s8 pair sums saturate in vpmaddubsw; ORT's fix is reduce_range "
        "(7-bit weights) or U8U8 weights"
    ),
    "unknown": "no INT8 dot-product flags known for this CPU: INT8 variants are measured like any other",
}


def int8_rule(isa: CpuIsa | None = None, kernels: Int8Kernels | None = None) -> Int8Rule:
    """The INT8 rule for this CPU: from its flags, overruled by the measured kernel where they disagree."""
    isa = isa if isa is not None else this_cpu()
    kernels = kernels if kernels is not None else probe_int8_kernels()
    by_flags = isa.rule_from_flags()
    flags_saturate = by_flags == "x86-no-vnni"
    if kernels.u8s8_exact is None:
        return Int8Rule(by_flags, flags_saturate, _RULE_REASONS[by_flags] + f" ({kernels.source})", by_flags)
    saturates = not kernels.u8s8_exact
    if saturates == flags_saturate:
        name = by_flags if by_flags != "unknown" or not saturates else "x86-no-vnni"
        return Int8Rule(name, saturates, _RULE_REASONS[name] + "; confirmed by ORT's kernel", by_flags, True)
    if saturates:
        return Int8Rule(
            "x86-no-vnni",
            True,
            (
                f"the CPU flags imply '{by_flags}', but ORT's u8s8 kernel saturated in a measured probe (an emulator, "
                "or a hypervisor that hides VNNI from CPUID): treated as x86 without VNNI, where u8s8 pair sums "
                "saturate; ORT's fix is reduce_range (7-bit weights) or U8U8 weights"
            ),
            by_flags,
            True,
        )
    name = "vnni" if isa.machine.lower() in ("x86_64", "amd64") else "arm-dot"
    return Int8Rule(
        name,
        False,
        (
            f"the CPU flags imply '{by_flags}', but ORT's u8s8 kernel accumulated exactly in a measured probe: "
            "treated as a CPU with exact INT8 dot products"
        ),
        by_flags,
        True,
    )


__all__ = [
    "ISA_MEANING",
    "KERNEL_FLAGS",
    "RULES",
    "CpuIsa",
    "Int8Kernels",
    "Int8Rule",
    "int8_rule",
    "probe_int8_kernels",
    "read_cpu_isa",
    "this_cpu",
]
