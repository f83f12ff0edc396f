"""Machine classes: the key from the facts that decide a winner, its id and name, reading one back, the nearest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnxruntime as ort
import pytest

from ortpilot.providers.cpubudget import this_budget
from ortpilot.providers.cpuisa import int8_rule
from ortpilot.providers.machineclass import (
    check_class,
    class_key,
    class_of,
    differences,
    nearest_class,
    this_class,
)

# The name carries the measured INT8 rule: .ci/run also runs these on an emulated AVX2 CPU.
pytestmark = pytest.mark.isa


def _class(cpus: int = 2, int8: str = "vnni", arch: str = "x86_64", eps=("CPUExecutionProvider",), **kw):
    return class_of(
        class_key(
            arch=arch,
            int8=int8,
            cpus=cpus,
            eps=eps,
            ort_version=kw.get("ort", "1.32.0"),
            ort_build=kw.get("build", "onnxruntime==1.32.0"),
        )
    )


def test_this_machines_class_is_made_of_its_measured_int8_rule_budget_eps_and_ort_build():
    here = this_class()
    assert here.key["int8"] == int8_rule().name and here.cpus == this_budget().cpus
    assert "CPUExecutionProvider" in here.key["eps"] and "AzureExecutionProvider" not in here.key["eps"]
    assert here.key["ort"] == ".".join(ort.__version__.split(".")[:2])
    word = {"vnni": "vnni", "amx": "amx", "x86-no-vnni": "avx2", "arm-dot": "dot", "unknown": "generic"}
    assert here.name.split("-")[1] == word[here.key["int8"]] and here.name.endswith(f"-{here.cpus}cpu")
    assert check_class(here.to_dict(), "here") == here


def test_a_ray_nodes_cpus_stand_in_for_the_budget_only_where_fewer():
    one = this_class(1)
    assert one.cpus == 1 and one.name.endswith("-1cpu")
    assert this_class(10_000).cpus == this_budget().cpus
    if this_budget().cpus > 1:
        assert one.id != this_class().id


def test_a_process_pinned_to_one_cpu_is_of_the_one_cpu_class():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs to pin to one")
    code = (
        "import json; from ortpilot.providers.machineclass import this_class; print(json.dumps(this_class().to_dict()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
        check=True,
    )
    child, mine = json.loads(out.stdout), this_class(1).to_dict()
    # The INT8 rule is measured on the CPU a process runs on: under the ISA lane's emulator this test runs
    # emulated and its child natively (qemu-user does not follow exec), so only the rest must match there.
    assert child["key"]["cpus"] == 1
    assert {k: v for k, v in child["key"].items() if k != "int8"} == {
        k: v for k, v in mine["key"].items() if k != "int8"
    }
    assert child["id"] == mine["id"] or child["key"]["int8"] != mine["key"]["int8"]


def test_names_read_the_key_and_ids_tell_classes_apart():
    assert _class(2, "vnni").name == "x86-vnni-2cpu"
    assert _class(1, "x86-no-vnni").name == "x86-avx2-1cpu"
    assert _class(4, "arm-dot", arch="aarch64").name == "arm-dot-4cpu"
    gpu = _class(8, "amx", eps=("CUDAExecutionProvider", "CPUExecutionProvider"), build="onnxruntime-gpu==1.32.0")
    assert gpu.name == "x86-amx-8cpu+cuda"
    # a patch release of ORT is the same class; another minor version or build is not
    assert _class(ort="1.32.1").id == _class().id
    assert _class(ort="1.33.0").id != _class().id and _class(build="onnxruntime-openvino==1.32").id != _class().id
    assert len({_class(c, r).id for c in (1, 2) for r in ("vnni", "x86-no-vnni")}) == 4


def test_a_recorded_class_whose_key_was_edited_is_refused():
    record = _class(2).to_dict()
    assert check_class(json.loads(json.dumps(record)), "c") == _class(2)
    edited = json.loads(json.dumps(record))
    edited["key"]["cpus"] = 4
    with pytest.raises(ValueError, match="not the id of its key"):
        check_class(edited, "classes[0].class")
    for bad, match in (
        ({**record, "key": {**record["key"], "int8": "fast"}}, "key.int8"),
        ({**record, "key": {**record["key"], "cpus": True}}, "key.cpus"),
        ({**record, "extra": 1}, "name, id and key"),
    ):
        with pytest.raises(ValueError, match=match):
            check_class(bad, "c")


def test_the_nearest_class_keeps_the_architecture_and_kernels_then_takes_fewer_cpus_over_more():
    here = _class(4, "vnni")
    two, eight = _class(2, "vnni"), _class(8, "vnni")
    avx2 = _class(4, "x86-no-vnni")
    arm = _class(4, "vnni", arch="aarch64")
    assert nearest_class(here, [eight, two]) == two
    assert nearest_class(here, [avx2, eight]) == eight
    assert nearest_class(here, [arm, avx2]) == avx2
    assert nearest_class(here, []) is None
    assert differences(here, two) == ["cpus 4 here, 2 there"]
    assert "int8 vnni here, x86-no-vnni there" in differences(here, avx2)
