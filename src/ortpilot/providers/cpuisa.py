"""CPU instruction set extensions that decide whether INT8 pays off on this CPU.

ORT's CPU kernels (MLAS) pick their INT8 GEMM/conv kernels by ISA at run time, so the same
quantized model can be several times faster or slower than fp32 depending on the flags below.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# flag in /proc/cpuinfo -> what it means for ORT INT8/low-precision inference.
ISA_MEANING: dict[str, str] = {
    "avx2": "256-bit SIMD; INT8 via vpmaddubsw (u8s8 pairs saturate at int16, hence reduce_range)",
    "fma": "fused multiply-add for fp32 kernels",
    "avx512f": "512-bit SIMD for fp32 and INT8 kernels",
    "avx512_vnni": "VNNI (vpdpbusd): fast u8s8 dot products for dynamic and static INT8",
    "avx_vnni": "AVX-VNNI: the 256-bit VNNI dot products (Alder Lake and later)",
    "avx512_bf16": "BF16 dot products",
    "amx_tile": "AMX tiles: matrix units (Sapphire Rapids and later)",
    "amx_int8": "AMX INT8: large INT8 matmul speedups over VNNI in MLAS",
    "amx_bf16": "AMX BF16: large BF16 matmul speedups",
    "asimddp": "Arm dot product (sdot/udot): fast INT8 on Arm",
    "i8mm": "Arm INT8 matrix multiply (smmla/ummla)",
}


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

    def int8_verdict(self) -> tuple[str, str]:
        """(level, sentence): what INT8 quantization is likely to do on this CPU."""
        if self.amx:
            return "ok", "AMX INT8 present: big INT8 (and BF16) matmul speedups are available."
        if self.vnni:
            return "ok", ("VNNI present: fast u8s8 dot products, so dynamic and static INT8 usually beat fp32 "
                          "on MatMul-heavy models (conv nets still need measuring).")
        if self.flags.get("asimddp") or self.flags.get("i8mm"):
            return "ok", "Arm dot-product instructions present: INT8 kernels are fast."
        if self.flags.get("avx2"):
            return "warn", ("AVX2 without VNNI: INT8 uses saturating vpmaddubsw; it can be slower than fp32, "
                            "especially for conv nets. Measure before shipping INT8 ('ortpilot bench').")
        if not self.flags:
            return "info", "CPU flags unknown on this platform; measure INT8 against fp32."
        return "warn", "No AVX2/VNNI: INT8 is likely slower than fp32 on this CPU."

    def to_dict(self) -> dict[str, Any]:
        level, verdict = self.int8_verdict()
        return {"model": self.model, "machine": self.machine, "source": self.source, "flags": self.flags,
                "meaning": {k: ISA_MEANING[k] for k, v in self.flags.items() if v},
                "int8": {"level": level, "verdict": verdict}}


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


__all__ = ["CpuIsa", "ISA_MEANING", "read_cpu_isa"]
