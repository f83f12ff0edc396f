"""``ortpilot optimize``: fusion with ``--json``, and a plain optimization level."""

from __future__ import annotations

import json

from click.testing import CliRunner


def test_optimize_cli_fusion_json(demo_paths, tmp_path):
    from ortpilot.cli.main import cli

    out = tmp_path / "fused.onnx"
    res = CliRunner().invoke(
        cli, ["optimize", str(demo_paths["encoder"]), "-o", str(out), "--fusion", "auto", "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["record"]["fused"]["Attention"] == 2 and out.is_file()
    res = CliRunner().invoke(
        cli, ["optimize", str(demo_paths["mlp"]), "-o", str(tmp_path / "m.onnx"), "--level", "extended"]
    )
    assert res.exit_code == 0, res.output
    assert "nodes" in res.output
