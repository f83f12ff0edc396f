"""Optimize and fusion passes: records, cache, pipelines, torch-free fusion, no partial files."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter

import onnx
import pytest

from ortpilot.artifacts.stamp import read_stamp
from ortpilot.artifacts.store import ModelStore
from ortpilot.errors import UsageError
from ortpilot.passes.base import Pipeline
from ortpilot.passes.fusion import FusionPass, detect_model_type
from ortpilot.passes.optimize import OptimizePass
from ortpilot.passes.quantize import QuantizePass


def test_offline_optimize_records_changes_and_hits_the_cache(demo_paths, tmp_path):
    store = ModelStore(tmp_path / "models")
    first = OptimizePass("all", "cpu", store=store).run(demo_paths["encoder"])
    rec = first.record
    assert rec.changed and rec.nodes_after < rec.nodes_before
    assert rec.op_diff.get("BiasGelu", 0) > 0  # ORT's CPU fusions at level all
    assert rec.stamp["level"] == "all" and rec.stamp["ep_specific"]
    assert read_stamp(first.model)["source_sha256"] == rec.stamp["source_sha256"]
    assert rec.extra["cache_hit"] is False
    second = OptimizePass("all", "cpu", store=store).run(demo_paths["encoder"])
    assert second.record.extra["cache_hit"] is True
    assert len(store.entries()) == 1
    json.dumps(rec.to_dict())


def test_online_optimize_changes_nothing(demo_paths):
    result = OptimizePass("extended", offline=False).run(demo_paths["mlp"])
    assert not result.changed and "online" in result.record.notes[0]


def test_basic_level_keeps_standard_ops_and_is_not_ep_specific(demo_paths):
    result = OptimizePass("basic").run(demo_paths["cnn"])
    assert "BatchNormalization" in result.record.op_diff  # Conv+BN folded
    assert not result.record.stamp["ep_specific"]


def test_pipeline_composes_and_stamps_the_original_source(demo_paths):
    pipe = Pipeline([OptimizePass("basic"), QuantizePass("dynamic")])
    out = pipe.run(demo_paths["mlp"])
    assert [r.name for r in out.records] == ["optimize", "quantize"]
    assert out.records[1].quantized_nodes > 0
    assert read_stamp(out.model)["source_path"].endswith("mlp.onnx")
    assert pipe.describe() == "optimize -> quantize"


def test_failing_pass_leaves_output_and_cache_clean(demo_paths, tmp_path, monkeypatch):
    from ortpilot.passes import optimize

    def explode(*args, **kwargs):
        dest = args[3]
        dest.write_bytes(b"partial")
        raise RuntimeError("boom midway")

    monkeypatch.setattr(optimize, "optimize_to_file", explode)
    store = ModelStore(tmp_path / "models")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(RuntimeError, match="boom"):
        OptimizePass("all", store=store).run(demo_paths["mlp"]).save(out_dir / "m.onnx")
    assert list(out_dir.iterdir()) == []
    assert store.entries() == [] and store.leftovers() == []


def test_fusion_reports_fused_attention_layernorm_gelu(demo_paths):
    result = FusionPass("auto").run(demo_paths["encoder"])
    fused = result.record.fused
    assert fused["Attention"] == 2
    assert fused["SkipLayerNormalization"] + fused.get("EmbedLayerNormalization", 0) >= 4
    assert fused.get("BiasGelu", 0) + fused.get("Gelu", 0) + fused.get("FastGelu", 0) >= 2
    assert result.record.nodes_after < result.record.nodes_before / 2


def test_fusion_without_skip_layer_norm_keeps_the_adds_and_layernorms_apart_and_the_same_outputs(demo_paths):
    import numpy as np
    import onnxruntime as ort

    from ortpilot.graph.feeds import make_feeds

    fused = FusionPass("auto").run(demo_paths["encoder"])
    apart = FusionPass("auto", skip_layer_norm=False).run(demo_paths["encoder"])
    ops = Counter(n.op_type for n in apart.model.graph.node)
    assert "SkipLayerNormalization" not in ops and ops["LayerNormalization"] >= 4
    assert apart.record.fused["Attention"] == fused.record.fused["Attention"] == 2  # the rest fuses as before
    assert "SkipLayerNormalization" in {n.op_type for n in fused.model.graph.node}
    assert apart.record.options["skip_layer_norm"] is False and FusionPass("bert", skip_layer_norm=False).label() == (
        "fusion(bert, no SkipLayerNorm)"
    )
    sessions = [
        ort.InferenceSession(m.model.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (fused, apart)
    ]
    feeds = make_feeds(onnx.load(demo_paths["encoder"]), seed=3)
    a, b = (s.run(None, feeds) for s in sessions)
    assert all(np.allclose(x, y, atol=1e-4) for x, y in zip(a, b))


def test_fusion_auto_says_when_it_cannot_detect(demo_paths):
    assert detect_model_type(onnx.load(demo_paths["encoder"]))[0] == "bert"
    with pytest.raises(UsageError, match="cannot tell the model type"):
        FusionPass("auto").run(demo_paths["cnn"])
    with pytest.raises(UsageError, match="Unknown fusion type"):
        FusionPass("nonsense")


def test_fusion_refusals_name_a_command_that_has_the_fusion_option(demo_paths):
    """The tune report printed 'pass --fusion TYPE to force one', but tune has no --fusion: the reason names the
    command that has it (optimize) and what to do with its output."""
    from ortpilot.cli.cmd_optimize import command as optimize
    from ortpilot.cli.cmd_tune import command as tune

    model_type, why = detect_model_type(onnx.load(demo_paths["cnn"]))
    assert model_type is None
    assert "'ortpilot optimize MODEL -o FUSED.onnx --fusion TYPE' and tune or run FUSED.onnx" in why
    assert "bert" in why  # the types it may force
    options = {name: {o for p in cmd.params for o in p.opts} for name, cmd in (("optimize", optimize), ("tune", tune))}
    assert "--fusion" in options["optimize"] and "--fusion" not in options["tune"]


def test_fusion_runs_without_importing_torch(demo_paths, tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from ortpilot.passes.fusion import FusionPass
        result = FusionPass('bert').run({str(demo_paths["encoder"])!r})
        assert result.record.fused['Attention'] == 2, result.record.fused
        assert 'torch' not in sys.modules
        print('ok')
    """)
    env_cache = {"ORTPILOT_CACHE_DIR": str(tmp_path / "cache")}
    import os

    proc = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, **env_cache},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")
