"""The environment doctor on this machine, and on real distribution conflicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import onnxruntime as ort
import pytest

from ortpilot.providers.cpuisa import read_cpu_isa
from ortpilot.providers.gpulibs import GpuEnvironment, LibraryHit, library_mismatches
from ortpilot.providers.ortdists import find_ort_distributions
from ortpilot.session.probe import probe_provider, run_doctor

ORT_DIR = Path(ort.__file__).parent


def _record_of_real_ort() -> dict[str, str]:
    dist_info = next(ORT_DIR.parent.glob(f"onnxruntime-{ort.__version__}.dist-info"))
    rows = {}
    for line in (dist_info / "RECORD").read_text().splitlines():
        path, digest, _ = line.rsplit(",", 2)
        rows[path] = digest
    return rows


def _fake_second_dist(site: Path, name: str, *, init_hash_real: bool) -> None:
    """A second, real dist-info whose RECORD claims the onnxruntime files that ``site/onnxruntime`` holds.

    ``site/onnxruntime`` is a symlink to the installed package, so both distributions claim the
    same files on disk, exactly as after ``pip install onnxruntime-gpu`` over ``onnxruntime``.
    """
    site.mkdir(parents=True, exist_ok=True)
    (site / "onnxruntime").symlink_to(ORT_DIR, target_is_directory=True)
    record = _record_of_real_ort()
    info = site / f"{name.replace('-', '_')}-{ort.__version__}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {ort.__version__}\n")
    pybind = next(p for p in record if "onnxruntime_pybind11_state" in p)
    rows = [
        f"onnxruntime/__init__.py,{record['onnxruntime/__init__.py'] if init_hash_real else 'sha256=AAAA'},1",
        f"{pybind},sha256=not-the-file-on-disk,1",
        f"{info.name}/METADATA,,",
        f"{info.name}/RECORD,,",
    ]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def test_this_environment_reports_one_distribution_and_a_working_cpu_probe():
    report = run_doctor()
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["distributions"]["conflict"] is False
    assert doc["distributions"]["winner"] == "onnxruntime"
    assert doc["onnxruntime"]["version"] == ort.__version__
    cpu = next(p for p in doc["probes"] if p["provider"] == "CPUExecutionProvider")
    assert cpu["status"] == "ok" and cpu["placement_share"] == 1.0
    azure = [p for p in doc["probes"] if p["provider"] == "AzureExecutionProvider"]
    assert all(p["status"] == "skipped" for p in azure)
    assert report.exit_code == 0 and doc["exit_code"] == 0
    assert all(f["severity"] in ("ok", "info", "warn", "error") for f in doc["findings"])


def test_plugin_without_device_is_reported_with_a_fix():
    report = run_doctor(probe=True)
    webgpu = [p for p in report.plugins if "WebGpuExecutionProvider" in p["ep_names"]]
    if not webgpu:
        pytest.skip("onnxruntime-ep-webgpu is not installed")
    assert webgpu[0]["registration"]["WebGpuExecutionProvider"]["registered"] is True
    probe = next(p for p in report.probes if p.provider == "WebGpuExecutionProvider")
    assert probe.status == "failed" and "device" in probe.reason
    finding = next(f for f in report.findings if "WebGpuExecutionProvider" in f.message)
    assert finding.severity == "warn" and finding.fix


def test_probe_of_a_provider_missing_from_the_build_fails_with_the_reason():
    result = probe_provider("CUDAExecutionProvider")
    assert result.status == "failed"
    assert "not in this ORT build" in result.reason


def test_fake_second_distribution_is_a_conflict_and_the_real_files_win(tmp_path, monkeypatch):
    _fake_second_dist(tmp_path / "site", "onnxruntime-gpu", init_hash_real=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    dists = find_ort_distributions()
    assert dists.conflict
    assert sorted(d.name for d in dists.distributions) == ["onnxruntime", "onnxruntime-gpu"]
    assert dists.winner == "onnxruntime"
    assert not dists.mixed
    pybind = next(k for k in dists.key_files if "pybind11_state" in k.path)
    assert sorted(pybind.claimed_by) == ["onnxruntime", "onnxruntime-gpu"] and pybind.matches == ["onnxruntime"]


def test_identical_shared_file_is_not_a_mix(tmp_path, monkeypatch):
    _fake_second_dist(tmp_path / "site", "onnxruntime-openvino", init_hash_real=True)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    dists = find_ort_distributions()
    init = next(k for k in dists.key_files if k.path.endswith("onnxruntime/__init__.py"))
    assert sorted(init.matches) == ["onnxruntime", "onnxruntime-openvino"]
    assert dists.winner == "onnxruntime" and not dists.mixed


def test_cli_reports_conflict_as_json_and_exits_1(tmp_path):
    _fake_second_dist(tmp_path / "site", "onnxruntime-gpu", init_hash_real=False)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    proc = subprocess.run(
        [sys.executable, "-m", "ortpilot.cli.main", "doctor", "--json", "--no-probe"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["distributions"]["conflict"] is True and doc["distributions"]["winner"] == "onnxruntime"
    error = next(f for f in doc["findings"] if f["severity"] == "error")
    assert "onnxruntime-gpu" in error["message"] and "pip uninstall -y" in error["fix"]


def test_cpu_isa_parses_flags_and_judges_int8(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Test CPU\nflags\t\t: fpu sse avx2 fma\n")
    isa = read_cpu_isa(cpuinfo)
    assert isa.model == "Test CPU" and isa.flags["avx2"] and not isa.vnni
    assert isa.int8_verdict()[0] == "warn"
    cpuinfo.write_text("model name\t: Test CPU\nflags\t\t: avx2 avx512f avx512vnni amx_tile amx_int8\n")
    isa = read_cpu_isa(cpuinfo)
    assert isa.vnni and isa.amx and isa.int8_verdict()[0] == "ok"


def test_this_cpu_has_the_flags_the_machine_advertises():
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    line = next((ln for ln in flags.splitlines() if ln.startswith(("flags", "Features"))), "")
    present = set(line.partition(":")[2].split())
    isa = read_cpu_isa()
    assert isa.amx == ("amx_int8" in present)
    assert isa.vnni == bool(present & {"avx512_vnni", "avx512vnni", "avx_vnni"})
    verdict = isa.int8_verdict()[1]
    if "amx_int8" in present:  # AMX first: it is what MLAS's INT8 GEMM takes where both are there
        assert verdict.startswith("AMX INT8 present"), verdict
    elif isa.vnni:
        assert verdict.startswith("VNNI present"), verdict
    elif "avx2" in present:
        assert verdict.startswith("AVX2 without VNNI"), verdict


def test_gpu_library_major_mismatch_is_found():
    env = GpuEnvironment(
        libraries=[
            LibraryHit("cuda_runtime", 11, "/x/libcudart.so.11", "ldconfig"),
            LibraryHit("cudnn", 9, "/x/libcudnn.so.9", "ldconfig"),
        ],
        expected={"cuda_version": "12.8", "cudnn_version": "9.8"},
    )
    problems = library_mismatches(env)
    assert [fam for fam, _ in problems] == ["cuda_runtime"]
    assert "12.8" in problems[0][1] and "11" in problems[0][1]


# --- a real conflict: two ORT wheels installed into one virtual environment ---------------------

WHEELS = Path(os.environ.get("ORTPILOT_WHEEL_CACHE", Path.home() / ".cache" / "ortpilot-wheels"))
OPENVINO_ORT = "1.24.1"
# What ortpilot needs at import time, linked from this environment into the test venv.
_SHIM = [
    "numpy",
    "numpy.libs",
    "onnx",
    "google",
    "rich",
    "click",
    "pygments",
    "markdown_it",
    "mdurl",
    "ml_dtypes",
    "typing_extensions.py",
    "packaging",
    "flatbuffers",
]


def _wheel(name: str, version: str) -> Path:
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(WHEELS.glob(pattern))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(WHEELS), f"{name}=={version}"],
            capture_output=True,
            text=True,
        )
        found = sorted(WHEELS.glob(pattern))
        if not found:
            pytest.skip(f"cannot download {name}=={version}: {proc.stderr[-300:]}")
    return found[0]


@pytest.mark.slow
def test_real_onnxruntime_and_openvino_wheels_in_one_venv(tmp_path):
    cpu, openvino = _wheel("onnxruntime", ort.__version__), _wheel("onnxruntime-openvino", OPENVINO_ORT)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    for wheel in (cpu, openvino):  # the second install overwrites the first one's files, as pip does
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
            check=True,
            capture_output=True,
        )
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([str(python), "-c", purelib], text=True).strip())
    shim = tmp_path / "shim"
    shim.mkdir()
    here = Path(ort.__file__).parent.parent
    for name in _SHIM:
        if (here / name).exists():
            (shim / name).symlink_to(here / name)
    (shim / "ortpilot").symlink_to(Path(__file__).resolve().parents[2] / "src" / "ortpilot")
    (site / "zz_ortpilot_shim.pth").write_text(str(shim) + "\n")  # after site-packages: ORT comes from the venv
    proc = subprocess.run(
        [str(python), "-m", "ortpilot.cli.main", "doctor", "--json", "--no-probe"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    dists = doc["distributions"]
    assert sorted(d["name"] for d in dists["distributions"]) == ["onnxruntime", "onnxruntime-openvino"]
    assert dists["conflict"] and dists["winner"] == "onnxruntime-openvino"
    assert doc["onnxruntime"]["version"] == OPENVINO_ORT
    pybind = next(k for k in dists["key_files"] if "pybind11_state" in k["path"])
    assert pybind["matches"] == ["onnxruntime-openvino"]
    error = next(f for f in doc["findings"] if f["severity"] == "error" and f["topic"] == "distributions")
    assert "onnxruntime-openvino's" in error["message"]


def test_missing_helper_package_is_named_with_what_breaks_and_the_fix(monkeypatch):
    import importlib.util

    from ortpilot.providers import doctor

    present = {f.message.split()[0]: f.severity for f in doctor.tool_findings()}
    assert present == {"sympy": "ok", "onnxscript": "ok", "tokenizers": "ok"}  # the test extra installs them
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sympy" else real(name, *a))
    (sympy,) = [f for f in doctor.tool_findings() if f.message.startswith("sympy")]
    assert sympy.severity == "warn" and "fusion candidates" in sympy.message and sympy.fix == "pip install sympy"
