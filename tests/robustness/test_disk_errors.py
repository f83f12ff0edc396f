"""A full disk, a read-only folder, a file in the way: a message naming the path, the errno and the fix.

The disks are real: a tmpfs of a few MB fills up for ENOSPC, a tmpfs remounted read-only gives
EROFS (as root, chmod does not stop writes; a read-only mount does). Each test checks the exit
code, that the message names the path and errno without a traceback, and that nothing half-written
is left. Skipped only where mounting is impossible (not root, or no mount permission), saying why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from corpus import Workspace, run_cli, save, tiny_model
from leftovers import files_under, stray_entries, temp_files


def _mount(folder: Path, size: str, read_only: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): the full-disk and "
            "read-only cases need a real filesystem that fills up or refuses writes"
        )
    if read_only:
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[callable]:
    made: list[Path] = []

    def mount(name: str, size: str = "2m", read_only: bool = False, fill_from: Path | None = None) -> Path:
        folder = tmp_path / name
        _mount(folder, size)
        made.append(folder)
        if fill_from is not None:
            shutil.copytree(fill_from, folder, dirs_exist_ok=True)
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        return folder

    yield mount
    for folder in reversed(made):
        subprocess.run(["umount", "-l", str(folder)], check=False)


def assert_message(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text[-3000:]
    assert proc.returncode == code, text[-3000:]
    for word in words:
        assert word in text, f"{word!r} not in:\n{text[-3000:]}"


def test_optimize_onto_a_full_disk(mounts, demo_paths: dict[str, Path], tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    full = mounts("full", "1m")  # the encoder is 2.4 MB
    proc = run_cli(ws, "optimize", [str(demo_paths["encoder"]), "-o", str(full / "o.onnx")])
    assert_message(proc, 2, str(full / "o.onnx"), "ENOSPC", "bytes free", "-o")
    assert not list(full.iterdir()), "a partial or temp file was left on the full disk"


def test_a_full_cache_says_that_ort_could_not_save_the_model(
    mounts, demo_paths: dict[str, Path], tmp_path: Path
) -> None:
    ws = Workspace.create(tmp_path)
    cache = mounts("cache", "1m")
    proc = run_cli(
        ws,
        "optimize",
        [str(demo_paths["encoder"]), "-o", str(ws.out / "o.onnx")],
        env={"ORTPILOT_CACHE_DIR": str(cache)},
    )
    assert_message(proc, 2, "ORT could not save the optimized model", "the model itself loads", "ORTPILOT_CACHE_DIR")
    assert "check that the model is valid" not in proc.stderr.lower()
    assert not files_under(ws.out) and not temp_files(cache)


def test_a_read_only_output_folder(mounts, tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    ro = mounts("ro", read_only=True)
    model = save(tiny_model(), ws.inputs / "m.onnx")
    for command, extra in (("optimize", []), ("quantize", ["--mode", "dynamic"])):
        proc = run_cli(ws, command, [str(model), "-o", str(ro / "o.onnx"), *extra])
        assert_message(proc, 2, str(ro), "EROFS", "read-only")
    proc = run_cli(ws, "tune", [str(model), "-o", str(ro / "tune"), "--budget", "10"])
    assert_message(proc, 2, "EROFS")
    proc = run_cli(ws, "demo-models", [str(ro / "demo")])
    assert_message(proc, 2, "EROFS")


def test_a_read_only_cache(mounts, tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    cache = mounts("rocache", read_only=True)
    model = save(tiny_model(), ws.inputs / "m.onnx")
    proc = run_cli(ws, "optimize", [str(model), "-o", str(ws.out / "o.onnx")], env={"ORTPILOT_CACHE_DIR": str(cache)})
    assert_message(proc, 2, str(cache), "EROFS", "ORTPILOT_CACHE_DIR")
    assert not files_under(ws.out)
    proc = run_cli(
        ws, "optimize", [str(model), "-o", str(ws.out / "o.onnx"), "--no-cache"], env={"ORTPILOT_CACHE_DIR": str(cache)}
    )
    assert_message(proc, 0)


def test_a_cache_path_that_is_a_file(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    blocker = ws.inputs / "not-a-folder"
    blocker.write_text("x")
    proc = run_cli(
        ws,
        "optimize",
        [str(save(tiny_model(), ws.inputs / "m.onnx")), "-o", str(ws.out / "o.onnx")],
        env={"ORTPILOT_CACHE_DIR": str(blocker)},
    )
    assert_message(proc, 2, str(blocker), "is a file", "ORTPILOT_CACHE_DIR")


def test_a_tune_with_a_read_only_cache_stops_once_with_the_reason(
    mounts, demo_paths: dict[str, Path], tmp_path: Path
) -> None:
    """Every candidate that builds a model would fail the same way: the tune says so once and stops."""
    ws = Workspace.create(tmp_path)
    cache = mounts("rocache", read_only=True)
    proc = run_cli(
        ws,
        "tune",
        [str(demo_paths["mlp"]), "-o", str(ws.out), "--budget", "60"],  # INT8 builds models
        env={"ORTPILOT_CACHE_DIR": str(cache)},
        timeout_s=300,
    )
    assert_message(proc, 2, "The tune stopped at candidate", "EROFS", "--resume")
    assert proc.stderr.count("EROFS") == 1
    assert (ws.out / "journal.jsonl").is_file() and not (ws.out / "profile.json").exists()


def test_a_full_temp_folder_during_tune(mounts, demo_paths: dict[str, Path], tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    tmp = mounts("tmp", "64k")
    proc = run_cli(
        ws,
        "tune",
        [str(demo_paths["encoder"]), "-o", str(ws.out), "--budget", "30"],
        env={"TMPDIR": str(tmp)},
        timeout_s=300,
    )
    assert_message(proc, 2, "ENOSPC", "TMPDIR")
    assert not stray_entries(tmp), f"scratch left on the full disk: {stray_entries(tmp)}"


def test_a_bench_report_that_cannot_be_written_keeps_the_numbers(mounts, tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    full = mounts("full", "16k")  # writable when checked up front, full once the report (with its plot) is written
    proc = run_cli(
        ws,
        "bench",
        [
            str(save(tiny_model(), ws.inputs / "m.onnx")),
            "--runs",
            "3",
            "--warmup",
            "1",
            "--no-roofline",
            "--report",
            str(full / "r.html"),
            "--json",
        ],
    )
    assert_message(proc, 2, "ENOSPC", str(full / "r.html"))
    assert not list(full.iterdir())
    assert json.loads(proc.stdout)["latency"]["p50_ms"] > 0  # the benchmark's document came before the error


def test_a_machine_peak_that_cannot_be_cached_does_not_discard_the_benchmark(mounts, tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    cache = mounts("rocache", read_only=True)
    proc = run_cli(
        ws,
        "bench",
        [str(save(tiny_model(), ws.inputs / "m.onnx")), "--runs", "3", "--warmup", "1", "--json"],
        env={"ORTPILOT_CACHE_DIR": str(cache)},
    )
    assert_message(proc, 0, "could not be cached")
    doc = json.loads(proc.stdout)
    assert doc["roofline"]["peak_gflops"] > 0 and doc["roofline"]["peak"]["cached"] is False


def test_an_input_file_on_a_read_only_disk_is_only_read(mounts, tmp_path: Path) -> None:
    """Reading from a read-only folder works: only writes are refused."""
    ws = Workspace.create(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    save(tiny_model(), src / "m.onnx")
    np.save(src / "x.npy", np.ones((1, 4), np.float32))
    ro = mounts("ro", fill_from=src, read_only=True)
    proc = run_cli(ws, "run", [str(ro / "m.onnx"), "--input", f"x={ro / 'x.npy'}"])
    assert_message(proc, 0)
