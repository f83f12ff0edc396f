"""Machine facts in profiles, and which differences between two machines can change a tune's winner."""

from __future__ import annotations

import pytest

from ortpilot.errors import UsageError
from ortpilot.providers.cpuisa import KERNEL_FLAGS
from ortpilot.providers.machine import check_machine_section, compare_machines, describe_machine, machine_facts

# The answers depend on the CPU's INT8 kernel: .ci/run also runs these on an emulated AVX2 CPU.
pytestmark = pytest.mark.isa


def _machine(rule: str, *, cpus: int = 8, cpu: str = "Some CPU") -> dict:
    """A recorded machine section of one INT8 kind, as machine_facts writes it."""
    flags = dict.fromkeys(KERNEL_FLAGS, False)
    flags.update(avx2=True)
    exact = rule != "x86-no-vnni"
    if rule == "vnni":
        flags.update(avx512f=True, avx512bw=True, avx512_vnni=True)
    return {
        "cpu": cpu,
        "arch": "x86_64",
        "isa_flags": flags,
        "int8": {"rule": rule, "u8s8_exact": exact},
        "cores": cpus,
        "cpu_budget": {"cpus": cpus, "source": "affinity"},
    }


def test_this_machine_is_recorded_with_its_measured_int8_kernel_and_budget():
    facts = machine_facts()
    check_machine_section(facts)  # what we write, we read back
    assert facts["int8"]["u8s8_exact"] in (True, False) and facts["int8"]["rule"]
    assert facts["cpu_budget"]["cpus"] >= 1 and facts["ort_default_threads"] >= 1
    assert set(facts["isa_flags"]) == set(KERNEL_FLAGS)
    same = compare_machines(facts, facts, int8=True, threads=facts["cpu_budget"]["cpus"])
    assert same.same_kernels and not same.decisive


def test_an_int8_profile_moved_across_vnni_and_saturating_kernels_is_decisive_either_way():
    vnni, avx2 = _machine("vnni"), _machine("x86-no-vnni")
    for there, here in ((vnni, avx2), (avx2, vnni)):
        check = compare_machines(there, here, int8=True, threads=2)
        assert [d.field for d in check.decisive] == ["int8"] and not check.same_kernels
        assert "chosen for kernels this CPU does not have" in check.decisive[0].why
        fp32 = compare_machines(there, here, int8=False, threads=2)
        assert not fp32.decisive and any(d.field == "int8" for d in fp32.differences)


def test_more_threads_than_the_budget_is_decisive_and_fewer_cores_alone_is_not():
    tuned, small = _machine("vnni", cpus=8), _machine("vnni", cpus=2)
    assert [d.field for d in compare_machines(tuned, small, threads=4).decisive] == ["cpu_budget"]
    relaxed = compare_machines(tuned, small, threads=2)
    assert not relaxed.decisive and any(d.field == "cpu_budget" for d in relaxed.differences)


def test_profiles_written_before_the_int8_fields_are_judged_by_their_flags():
    old = {
        "cpu": "AMD EPYC",
        "arch": "x86_64",
        "isa": "avx512",
        "cores": 2,
        "flags": ["avx", "avx2", "avx512_vnni", "avx512bw", "avx512f", "fma"],
    }
    check = compare_machines(old, _machine("x86-no-vnni"), int8=True, threads=1)
    assert [d.field for d in check.decisive] == ["int8"]
    assert "AVX-512 VNNI" in describe_machine(old) and "u8s8 exact" in describe_machine(old)


@pytest.mark.parametrize(
    "field,value,named",
    [
        ("cores", "eight", "machine.cores"),
        ("cores", 0, "machine.cores"),
        ("isa_flags", ["avx2"], "machine.isa_flags"),
        ("int8", {"rule": "fast"}, "machine.int8.rule"),
        ("int8", {"u8s8_exact": "yes"}, "machine.int8.u8s8_exact"),
        ("cpu_budget", {"cpus": -1}, "machine.cpu_budget.cpus"),
        ("cpu", 7, "machine.cpu"),
        ("flags", "avx2", "machine.flags"),
    ],
)
def test_a_malformed_machine_section_is_a_usage_error_naming_the_field(field, value, named):
    section = _machine("vnni")
    section[field] = value
    with pytest.raises(UsageError, match=named.replace(".", r"\.")):
        check_machine_section(section, "p.json")
    with pytest.raises(UsageError, match="must be an object"):
        check_machine_section(["not", "a", "dict"], "p.json")
