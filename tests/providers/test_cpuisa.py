"""The INT8 rule: what the CPU flags advertise, and what ORT's kernel really computes here."""

from __future__ import annotations

import pytest

from ortpilot.providers.cpuisa import Int8Kernels, int8_rule, probe_int8_kernels, read_cpu_isa, this_cpu

# The answers depend on the CPU's INT8 kernel: .ci/run also runs these on an emulated AVX2 CPU.
pytestmark = pytest.mark.isa


def _isa(tmp_path, flags: str, model: str = "Test CPU"):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"model name\t: {model}\nflags\t\t: {flags}\n")
    return read_cpu_isa(cpuinfo)


EXACT = Int8Kernels(True, True, "measured")
SATURATING = Int8Kernels(False, True, "measured")
UNMEASURED = Int8Kernels(None, None, "not measured")


def test_the_rule_follows_the_flags_when_the_kernel_agrees(tmp_path):
    assert int8_rule(_isa(tmp_path, "avx2 fma"), SATURATING).name == "x86-no-vnni"
    assert int8_rule(_isa(tmp_path, "avx2 avx512f avx512bw"), SATURATING).u8s8_saturates
    assert int8_rule(_isa(tmp_path, "avx2 avx512f avx512_vnni"), EXACT).name == "vnni"
    assert int8_rule(_isa(tmp_path, "avx2 avx_vnni"), EXACT).name == "vnni"
    assert int8_rule(_isa(tmp_path, "avx2 avx512_vnni amx_tile amx_int8"), EXACT).name == "amx"
    arm = int8_rule(_isa(tmp_path, "fp asimd asimddp i8mm"), EXACT)
    assert arm.name == "arm-dot" and not arm.u8s8_saturates and "S8S8 QDQ" in arm.reason
    assert int8_rule(_isa(tmp_path, "avx2 avx512_vnni"), EXACT).measured


def test_a_measured_kernel_overrules_flags_that_do_not_match_it(tmp_path):
    """An emulator or a hypervisor can advertise VNNI while ORT's CPUID check takes the AVX2 path."""
    hidden = int8_rule(_isa(tmp_path, "avx2 avx512f avx512_vnni"), SATURATING)
    assert hidden.name == "x86-no-vnni" and hidden.u8s8_saturates and hidden.flags_rule == "vnni"
    assert "saturated in a measured probe" in hidden.reason
    exact = int8_rule(_isa(tmp_path, "avx2"), EXACT)
    assert exact.name == "vnni" and not exact.u8s8_saturates and "accumulated exactly" in exact.reason


def test_without_a_measurement_the_flags_decide(tmp_path):
    assert int8_rule(_isa(tmp_path, "avx2"), UNMEASURED).u8s8_saturates
    assert not int8_rule(_isa(tmp_path, "avx2 avx512_vnni"), UNMEASURED).u8s8_saturates
    assert not int8_rule(_isa(tmp_path, "avx2 avx512_vnni"), UNMEASURED).measured


def test_this_cpus_kernel_is_measured_and_the_rule_agrees_with_it():
    """The probe runs ORT's own u8s8 MatMulInteger; the rule here must follow what it found, and
    where the advertised flags disagree (an emulator), the rule says so."""
    kernels = probe_int8_kernels()
    assert kernels.u8s8_exact is not None and kernels.u8u8_exact is True  # u8u8 never saturates
    rule = int8_rule()
    assert rule.measured and rule.u8s8_saturates == (not kernels.u8s8_exact)
    flags_saturate = this_cpu().rule_from_flags() == "x86-no-vnni"
    assert (flags_saturate != rule.u8s8_saturates) == ("measured probe" in rule.reason)
