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


def test_optimize_outputs_fuses_the_pruned_graph_and_writes_only_the_named_outputs(tmp_path):
    import onnx
    from output_models import write_encoder_with_heads

    from ortpilot.cli.main import cli

    model = write_encoder_with_heads(tmp_path / "encoder3.onnx")
    out = tmp_path / "fused.onnx"
    args = ["optimize", str(model), "-o", str(out), "--fusion", "bert", "--outputs", "hidden_state_1", "--json"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["outputs"] == ["hidden_state_1"]
    assert doc["record"]["fused"]["Attention"] == 1  # layer 1, which only the other outputs need, is gone
    assert [o.name for o in onnx.load(out).graph.output] == ["hidden_state_1"]
    bad = CliRunner().invoke(cli, ["optimize", str(model), "-o", str(tmp_path / "x.onnx"), "--outputs", "logits"])
    assert bad.exit_code == 2 and "its outputs are: last_hidden_state, pooler_output, hidden_state_1" in bad.output
    assert "Traceback" not in bad.output and not (tmp_path / "x.onnx").exists()


def test_a_fusion_for_another_architecture_is_exit_2_naming_the_inputs_it_dropped(demo_paths, tmp_path):
    """ViT's fusion on the demo BERT encoder drops attention_mask: the fused model is refused, not run."""
    from ortpilot.cli.main import cli

    out = tmp_path / "vit.onnx"
    res = CliRunner().invoke(cli, ["optimize", str(demo_paths["encoder"]), "-o", str(out), "--fusion", "vit"])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert "The fusion does not fit this graph" in said and "attention_mask" in said and not out.exists()


def test_a_fusion_that_fuses_nothing_is_exit_2_and_writes_nothing(demo_paths, tmp_path):
    """BERT's fusion on the MLP matches no pattern: an unfused model under a --fusion name is refused."""
    from ortpilot.cli.main import cli

    out = tmp_path / "fused.onnx"
    res = CliRunner().invoke(cli, ["optimize", str(demo_paths["mlp"]), "-o", str(out), "--fusion", "bert"])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert "--fusion bert fused nothing in" in said and "no fusion matched" in said, said
    assert "--fusion auto" in said and "Traceback" not in said and not out.exists()
