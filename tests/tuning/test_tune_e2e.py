"""A tune end to end through the library: the reference inputs come from the source model (so a fused winner
reproduces), and a decoder is searched with GQA and weight-only candidates. The command's own end-to-end run
(no arguments, four outputs, the profile reproducing the winner) is in tests/cli/test_cmd_tune.py."""

from __future__ import annotations

import json

import ortpilot
from ortpilot.tuning.reference import array_digest as _digest
from ortpilot.tuning.reference import reference_feeds


def test_reference_inputs_come_from_the_source_model_so_a_fused_winner_reproduces(tmp_path, demo_paths):
    """The cause of an old flake: when a fused candidate won, inputs generated from the *fused*
    model (whose embedding Gather is gone) differed from the tune's, and so did the outputs."""
    from ortpilot.artifacts.atomic import save_model
    from ortpilot.artifacts.profile import write_profile
    from ortpilot.graph.feeds import make_feeds
    from ortpilot.modelio import file_sha256, load_model
    from ortpilot.passes.fusion import FusionPass
    from ortpilot.session import load
    from ortpilot.tuning.tune import HELDOUT_SEED, feeds_digest

    source = demo_paths["encoder"]
    fused = tmp_path / "model.onnx"
    save_model(FusionPass("bert").run(source).model, fused)
    tuned_inputs = make_feeds(load_model(source), seed=HELDOUT_SEED)
    outputs = load(str(fused)).run(None, tuned_inputs)
    names = [o.name for o in load(str(fused)).get_outputs()]
    path = write_profile(
        tmp_path / "profile.json",
        model_file=fused,
        providers=[{"name": "CPUExecutionProvider", "options": {}}],
        settings={},
        extra={
            "source_model": {"path": str(source), "sha256": file_sha256(source)},
            "shapes": {k: list(v.shape) for k, v in tuned_inputs.items()},
            "reference_outputs": {
                "heldout_seed": HELDOUT_SEED,
                "inputs_sha256": feeds_digest(tuned_inputs),
                "sha256": {n: _digest(o) for n, o in zip(names, outputs)},
            },
        },
    )
    profile = json.loads(path.read_text())
    sess = ortpilot.load_profile(path)
    feeds = reference_feeds(profile)
    assert feeds_digest(feeds) == profile["reference_outputs"]["inputs_sha256"]
    got = {n: _digest(o) for n, o in zip(names, sess.run(None, feeds))}
    assert got == profile["reference_outputs"]["sha256"]
    from_fused = make_feeds(sess.model, seed=HELDOUT_SEED)  # what the old test did
    assert feeds_digest(from_fused) != feeds_digest(feeds)


def test_decoder_gets_gqa_and_weight_only_candidates(tmp_path, monkeypatch):
    """A KV-cache decoder is searched with GQA fusion and MatMulNBits; the gate decides on them."""
    import onnx
    import pytest

    pytest.importorskip("onnxscript")
    monkeypatch.setenv("ORTPILOT_CACHE_DIR", str(tmp_path / "cache"))
    result = ortpilot.tune(
        "demo:decoder", out_dir=str(tmp_path / "out"), budget_s=40, max_error=0.6, session_knobs=False
    )
    by_label = {e.candidate.label: e for e in result.entries}
    assert result.facts.decoder
    assert {"gqa", "int4-weights", "gqa · int4-weights", "int8-weights"} <= set(by_label)
    # A gate loose enough for 4 bits lets them be measured like any candidate.
    for label in ("gqa", "int4-weights", "gqa · int4-weights"):
        assert by_label[label].status == "ok", (label, by_label[label].status, by_label[label].reason)
    built = onnx.load(by_label["gqa · int4-weights"].prepared["model_path"])
    from ortpilot.passes.weight_only import find_targets

    assert {"GroupQueryAttention", "MatMulNBits"} <= {n.op_type for n in built.graph.node}
    assert not [t for t in find_targets(built) if t.op_type != "Gather"]  # no float weight MatMul left
