"""The pytest plugin (``ortpilot.testing``), run as a user's CI runs it: pytest in a folder of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ortpilot


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory, tuned_mlp) -> Path:
    """The session's tune of the demo MLP (tests/conftest.py), in a folder of this module's: a test edits its model."""
    out = tmp_path_factory.mktemp("tuned") / "out"
    shutil.copytree(tuned_mlp, out)
    return out


def test_a_profile_is_one_test_item_that_fails_naming_the_hash_after_its_model_changes(tmp_path, profile_dir):
    empty = tmp_path / "ci"
    empty.mkdir()
    ok = _pytest(empty, "--ortpilot-profile", str(profile_dir / "profile.json"))
    assert ok.returncode == 0 and "1 passed" in ok.stdout, ok.stdout + ok.stderr
    with open(profile_dir / "model.onnx", "ab") as fh:
        fh.write(b"\0")
    try:
        bad = _pytest(empty, "--ortpilot-profile", str(profile_dir))
        assert bad.returncode == 1 and "1 failed" in bad.stdout, bad.stdout + bad.stderr
        assert "changed since it was tuned" in bad.stdout and "sha256" in bad.stdout
    finally:
        with open(profile_dir / "model.onnx", "rb+") as fh:
            fh.truncate(fh.seek(0, 2) - 1)


def test_requires_provider_skips_with_the_probes_reason_and_fails_when_strict(tmp_path):
    (tmp_path / "test_gpu.py").write_text(
        textwrap.dedent("""
        import pytest

        @pytest.mark.requires_provider("cuda")
        def test_on_cuda():
            pass

        @pytest.mark.requires_provider("cpu")
        def test_on_cpu():
            pass
    """)
    )
    cuda = ortpilot.probe("cuda")
    plain = _pytest(tmp_path)
    strict = _pytest(tmp_path, "--ortpilot-strict-providers")
    if cuda.status == "ok":  # a CUDA machine: both run
        assert plain.returncode == strict.returncode == 0
        return
    assert plain.returncode == 0 and "1 passed, 1 skipped" in plain.stdout, plain.stdout
    assert "CUDAExecutionProvider cannot run here" in plain.stdout and cuda.reason.split(" (")[0] in plain.stdout
    assert strict.returncode == 1 and "1 failed, 1 passed" in strict.stdout, strict.stdout
    assert "--ortpilot-strict-providers" in strict.stdout


def test_the_fixture_gives_a_strict_session_and_a_fallback_fails_the_test(tmp_path, demo_paths):
    (tmp_path / "test_load.py").write_text(
        textwrap.dedent(f"""
        import numpy as np

        def test_cpu(ortpilot_load):
            sess = ortpilot_load({str(demo_paths["mlp"])!r}, providers=["cpu"], min_coverage=0.95)
            assert sess.providers == ["CPUExecutionProvider"]
            assert sess.run(None, {{"x": np.zeros((1, 64), np.float32)}})[0].shape[0] == 1

        def test_cuda_falls_back(ortpilot_load):
            ortpilot_load({str(demo_paths["mlp"])!r}, providers=["cuda", "cpu"])
    """)
    )
    proc = _pytest(tmp_path)
    if ortpilot.probe("cuda").status == "ok":
        assert proc.returncode == 0
        return
    assert proc.returncode == 1 and "1 failed, 1 passed" in proc.stdout, proc.stdout
    assert "ProviderFallbackError" in proc.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--ortpilot-profile", "nowhere/profile.json"], "neither a profile.json nor a folder"),
        (["--ortpilot-max-slowdown", "-5"], "must be a positive percentage"),
    ],
)
def test_bad_plugin_options_are_usage_errors(tmp_path, args, message):
    proc = _pytest(tmp_path, *args)
    assert proc.returncode == 4 and message in proc.stderr, proc.stdout + proc.stderr


def test_a_marker_naming_an_unknown_provider_is_a_usage_error(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.requires_provider('tpu9')\ndef test_x():\n    pass\n"
    )
    proc = _pytest(tmp_path)
    assert proc.returncode != 0 and "Unknown execution provider 'tpu9'" in proc.stdout + proc.stderr
