"""The generation gate on real decoders (``decode.gate``): next-token agreement, KL, divergence position, and the
auto-exclude loop; the measures alone are checked in tests/gate/test_gate_generation.py."""

from __future__ import annotations

import onnx
import pytest

from ortpilot.decode.gate import auto_exclude, compare_decoders, make_prompts, reference_run
from ortpilot.errors import AccuracyGateError, UsageError
from ortpilot.gate.generation import GenerationGate
from ortpilot.models import make_decoder
from ortpilot.passes.decoder_fusion import DecoderFusionPass
from ortpilot.passes.weight_only import WeightOnlyPass

NEW = 12


@pytest.fixture(scope="module")
def fused() -> onnx.ModelProto:
    return DecoderFusionPass().run(make_decoder()).model


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts(256, count=6, length=10, seed=3)


def test_model_against_itself_is_perfect(fused: onnx.ModelProto, prompts: list[list[int]]) -> None:
    result = compare_decoders(fused, fused, prompts, new_tokens=NEW)
    assert result.passed and result.top1_agreement == 1.0
    assert result.kl_max < 1e-9
    assert result.min_identical == NEW and all(p.divergence is None for p in result.prompts)


def test_unfused_reference_and_int8_candidate_are_sane(fused: onnx.ModelProto, prompts: list[list[int]]) -> None:
    # The unfused float decoder is the reference; the fused int8-weights one must track it closely.
    candidate = WeightOnlyPass("int8-weights").run(fused).model
    result = compare_decoders(make_decoder(), candidate, prompts, new_tokens=NEW)
    assert 0.9 <= result.top1_agreement <= 1.0
    assert 0.0 <= result.kl_mean <= result.kl_max < 0.01
    for row in result.prompts:
        assert len(row.reference_tokens) == len(row.candidate_top1) == NEW
        assert row.identical_tokens == (NEW if row.divergence is None else row.divergence)
        assert row.reference_tokens[: row.identical_tokens] == row.candidate_top1[: row.identical_tokens]
    doc = result.to_dict()
    assert doc["passed"] is True and len(doc["prompts"]) == len(prompts)


def test_int4_of_random_weights_fails_with_reasons(fused: onnx.ModelProto, prompts: list[list[int]]) -> None:
    # Random demo weights have small logit margins: 4 bits flips many next tokens.
    candidate = WeightOnlyPass("int4").run(fused).model
    ref = reference_run(fused, prompts, NEW)
    strict = compare_decoders(
        fused, candidate, reference=ref, gate=GenerationGate(min_top1=0.99, max_kl=1e-4, min_identical=NEW)
    )
    assert not strict.passed and len(strict.failures) == 3
    assert "top-1" in strict.failures[0] and "KL" in strict.failures[1] and "diverges" in strict.failures[2]
    assert strict.top1_agreement < 0.99 and strict.kl_mean > 1e-4
    loose = compare_decoders(fused, candidate, reference=ref, gate=GenerationGate(min_top1=None))
    assert loose.passed and loose.kl_mean == strict.kl_mean  # same reference, same numbers


def test_auto_exclude_leaves_layers_in_float_until_the_gate_passes(
    fused: onnx.ModelProto, prompts: list[list[int]]
) -> None:
    gate = GenerationGate(min_top1=0.8)
    first = compare_decoders(fused, WeightOnlyPass("int4").run(fused).model, prompts, new_tokens=NEW, gate=gate)
    assert not first.passed
    result = auto_exclude(fused, prompts, mode="int4", gate=gate, new_tokens=NEW)
    assert result.passed and result.comparison.top1_agreement >= 0.8
    assert result.excluded_groups and set(result.sensitivity) == {
        "layer 0",
        "layer 1",
        "lm_head.weight",
        "model.embed_tokens.weight",
    }
    assert result.attempts[0]["passed"] is False and result.attempts[-1]["passed"] is True
    # The default fallback keeps the sensitive layers in 8 bits (an embedding among them stays float).
    assert result.fallback == "int8"
    bits = {
        n.name.rsplit("_Q", 1)[0]: next(a.i for a in n.attribute if a.name == "bits")
        for n in result.model.graph.node
        if n.op_type == "MatMulNBits"
    }
    assert {n for n, b in bits.items() if b == 8} <= set(result.excluded_nodes)
    assert 8 in bits.values()
    assert 4 in bits.values()


def test_auto_exclude_float_fallback(fused: onnx.ModelProto, prompts: list[list[int]]) -> None:
    result = auto_exclude(fused, prompts, gate=GenerationGate(min_top1=0.8), new_tokens=NEW, fallback="float")
    assert result.passed and result.fallback == "float" and result.excluded_groups
    float_ops = {n.name for n in result.model.graph.node if n.op_type in ("MatMul", "Gather")}
    assert set(result.excluded_nodes) <= float_ops


def test_auto_exclude_gives_up_with_an_accuracy_error(fused: onnx.ModelProto, prompts: list[list[int]]) -> None:
    with pytest.raises(AccuracyGateError, match="fails the generation gate"):
        auto_exclude(fused, prompts[:2], gate=GenerationGate(min_top1=1.0, max_kl=0.0), new_tokens=4, max_excluded=1)


def test_bad_prompts(fused: onnx.ModelProto) -> None:
    with pytest.raises(UsageError, match="non-empty prompt"):
        compare_decoders(fused, fused, [[]])
    with pytest.raises(UsageError, match="at least 1"):
        compare_decoders(fused, fused, [[1, 2]], new_tokens=0)


def test_quantize_weight_only_gated_writes_only_what_passes(tmp_path, prompts: list[list[int]]) -> None:
    from ortpilot.decode.gate import quantize_weight_only_gated

    out = tmp_path / "int8.onnx"
    report = quantize_weight_only_gated(
        make_decoder(),
        out,
        "int8-weights",
        fuse=True,
        prompts=prompts,
        new_tokens=NEW,
        gate=GenerationGate(min_top1=0.8),
    )
    assert out.exists() and report["gate"]["passed"] and report["weights"]["compression"] > 2
    refused = tmp_path / "int4.onnx"
    with pytest.raises(AccuracyGateError, match="Nothing was written"):
        quantize_weight_only_gated(
            make_decoder(), refused, "int4", prompts=prompts, new_tokens=NEW, gate=GenerationGate(min_top1=0.99)
        )
    assert not refused.exists()


def test_text_prompts_from_a_tokenizer_json(tmp_path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from ortpilot.decode.gate import HELD_OUT_TEXTS, text_prompts

    words = sorted({w for t in HELD_OUT_TEXTS for w in t.split()})
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    prompts = text_prompts(tmp_path)
    assert len(prompts) == len(HELD_OUT_TEXTS)
    assert prompts[0] == [vocab[w] for w in HELD_OUT_TEXTS[0].split()]
