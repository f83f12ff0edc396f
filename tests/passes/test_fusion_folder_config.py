"""Transformer fusion sized from the model folder's config.json when the graph cannot tell, and checked."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

from ortpilot.cli.main import cli
from ortpilot.data import folder_of
from ortpilot.errors import AccuracyGateError
from ortpilot.passes.fusion import FusionPass
from ortpilot.tuning.space import gather_facts
from ortpilot.tuning.transform import attention_dims
from ortpilot.tuning.tune import _folder_attention


def unsized_encoder(encoder_path) -> onnx.ModelProto:
    """The demo encoder with its Q/K/V reshape written [0, 0, -1, head_size] behind an Identity, as some
    exporters write it: neither ORT's fusion nor ``attention_dims`` can read the head count."""
    model = onnx.load(encoder_path)
    inits = {t.name: t for t in model.graph.initializer}
    split = {n for n, t in inits.items() if t.dims == [4] and numpy_helper.to_array(t).tolist() == [0, 0, 4, 32]}
    assert split
    for name in split:
        inits[name].CopyFrom(numpy_helper.from_array(np.array([0, 0, -1, 32], np.int64), name))
        model.graph.node.insert(0, helper.make_node("Identity", [name], [name + "/id"], f"unsized/{name}"))
    for node in model.graph.node:
        if node.op_type == "Reshape" and node.input[1] in split:
            node.input[1] += "/id"
    return model


@pytest.fixture
def unsized(tmp_path, demo_paths):
    bare = tmp_path / "bare" / "model.onnx"
    bare.parent.mkdir()
    onnx.save(unsized_encoder(demo_paths["encoder"]), bare)
    return bare


def folder_with(tmp_path, model_file, heads: int, hidden: int = 128):
    root = tmp_path / f"folder{heads}"
    root.mkdir()
    (root / "model.onnx").write_bytes(model_file.read_bytes())
    (root / "config.json").write_text(
        json.dumps({"model_type": "bert", "num_attention_heads": heads, "hidden_size": hidden})
    )
    return root


def test_attention_is_fused_only_with_the_folder_config_and_checked(unsized, tmp_path):
    alone = FusionPass("bert").run(str(unsized)).record
    assert not alone.fused.get("Attention")  # the graph does not tell the head count
    root = folder_with(tmp_path, unsized, 4)
    record = FusionPass("bert").run(str(root / "model.onnx")).record
    assert record.fused.get("Attention") == 2
    assert any("num_heads=4, hidden_size=128 (config.json" in n for n in record.notes)
    assert any("checked against the source" in n for n in record.notes)


def test_a_wrong_config_is_caught_by_the_check_not_shipped(unsized, tmp_path):
    root = folder_with(tmp_path, unsized, 8)  # 8 divides 128: the folder itself looks consistent
    with pytest.raises(AccuracyGateError, match="changed the outputs.*num_heads=8, hidden_size=128 from config.json"):
        FusionPass("bert").run(str(root / "model.onnx"))
    res = CliRunner().invoke(cli, ["optimize", str(root), "--fusion", "bert", "-o", str(tmp_path / "o.onnx")])
    assert res.exit_code == 1 and "config.json" in res.output and not (tmp_path / "o.onnx").exists()
    given = FusionPass("bert", num_heads=4, hidden_size=128).run(str(root / "model.onnx")).record
    assert given.fused.get("Attention") == 2  # explicit sizes win over the folder's


def test_optimize_folder_fuses_with_config_sizes(unsized, tmp_path):
    root = folder_with(tmp_path, unsized, 4)
    res = CliRunner().invoke(cli, ["optimize", str(root), "--fusion", "bert", "-o", str(tmp_path / "f.onnx"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["record"]["fused"]["Attention"] == 2


def test_tune_takes_attention_sizes_from_the_folder_when_the_graph_has_none(unsized, tmp_path):
    proto = onnx.load(unsized)
    assert attention_dims(proto) == (0, 0)
    root = folder_with(tmp_path, unsized, 4)
    assert _folder_attention(folder_of(root / "model.onnx")) == (4, 128) and _folder_attention(folder_of(unsized)) == (
        0,
        0,
    )
    facts = gather_facts(proto, None, quantize=False, folder_attention=(4, 128))
    assert facts.attention == (4, 128) and dict(facts.fusion_step)["num_heads"] == 4
