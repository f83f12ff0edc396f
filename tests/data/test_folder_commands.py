"""MODEL as a folder, everywhere a model is accepted (the CLI and ortpilot.load)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from folders import sentence_folder

import ortpilot
from ortpilot.errors import UsageError

CLI = [sys.executable, "-m", "ortpilot.cli.main"]


@pytest.fixture
def hf_folder(tmp_path, demo_paths):
    root = sentence_folder(tmp_path / "hf", demo_paths["encoder"], "hf-onnx")
    shutil.copy(demo_paths["encoder"], root / "onnx" / "model_quantized.onnx")
    return root


def test_load_takes_a_folder_and_model_file_chooses(hf_folder):
    assert ortpilot.load(str(hf_folder), model_file="model.onnx").model_path == hf_folder / "onnx" / "model.onnx"
    with pytest.raises(UsageError, match="several models"):
        ortpilot.load(str(hf_folder))


@pytest.mark.parametrize(
    "command",
    [
        ["run"],
        ["inspect", "--no-check"],
        ["bench", "--runs", "3", "--no-roofline"],
        ["compare", "-p", "cpu", "-p", "cpu"],
    ],
)
def test_commands_take_a_folder_and_model_file(hf_folder, command):
    listed = subprocess.run(
        [*CLI, command[0], str(hf_folder), *command[1:]], capture_output=True, text=True, timeout=300
    )
    assert listed.returncode == 2 and "--model-file" in listed.stderr and "model_quantized.onnx" in listed.stderr
    chosen = subprocess.run(
        [*CLI, command[0], str(hf_folder), "--model-file", "model.onnx", *command[1:]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert chosen.returncode == 0, chosen.stderr
