"""`ortpilot demo-models OUTDIR`: writes the four demo models and the three text folders; an OUTDIR it cannot write
exits 2 with a message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx


def _ortpilot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ortpilot.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def test_writes_every_demo_model_and_lists_them_in_json(tmp_path: Path) -> None:
    res = _ortpilot("demo-models", str(tmp_path / "demo"), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert sorted(doc) == ["cnn", "decoder", "encoder", "mlp", "text-classify", "text-embed", "text-rerank"]
    for name, entry in doc.items():
        if name.startswith("text-"):
            assert Path(entry["path"]) == tmp_path / "demo" / name and entry["kind"] == name[5:]
            assert (Path(entry["path"]) / "tokenizer.json").is_file()
            onnx.checker.check_model(onnx.load(Path(entry["path"]) / "model.onnx"))
            continue
        assert Path(entry["path"]) == tmp_path / "demo" / f"{name}.onnx"
        onnx.checker.check_model(onnx.load(entry["path"]))


def test_outdir_below_a_file_exits_2_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("x")
    res = _ortpilot("demo-models", str(tmp_path / "taken" / "demo"))
    assert res.returncode == 2, res.stderr
    assert "is a file, not a folder" in res.stderr and "Traceback" not in res.stderr
    assert (tmp_path / "taken").read_text() == "x"
