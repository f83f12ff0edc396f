"""The built-in demo models: they load and run in ORT, fuse the way real exports fuse, are
deterministic, and the decoder's KV cache, causal mask and padding are right."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from ortpilot.errors import UsageError
from ortpilot.modelio import SAFE_IR_VERSION
from ortpilot.models import (
    DEMO_MODELS,
    DEMO_SPECS,
    demo_model_path,
    make_cnn,
    make_decoder,
    make_encoder,
    make_mlp,
    write_demo_models,
)

CPU = ["CPUExecutionProvider"]


def _session(
    model: onnx.ModelProto | str | Path,
    level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    optimized_path: Path | None = None,
) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 1
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, so, providers=CPU)


@pytest.fixture(scope="module")
def decoder() -> onnx.ModelProto:
    return make_decoder()


@pytest.fixture(scope="module")
def decoder_session(decoder: onnx.ModelProto) -> ort.InferenceSession:
    return _session(decoder)


# -- every model ---------------------------------------------------------------------------


def _encoder_feeds(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2 :] = 0
    return {
        "input_ids": rng.integers(0, 1000, (batch, seq), dtype=np.int64),
        "attention_mask": mask,
        "token_type_ids": np.zeros((batch, seq), np.int64),
    }


@pytest.mark.parametrize("name", sorted(DEMO_MODELS))
def test_model_is_valid_and_stamped(name: str) -> None:
    model = DEMO_MODELS[name]()
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == SAFE_IR_VERSION
    opsets = {o.domain: o.version for o in model.opset_import}
    assert opsets == {"": 18}  # no com.microsoft op in the unfused models
    assert set(DEMO_SPECS) == set(DEMO_MODELS)
    assert DEMO_SPECS[name].name == name


def test_mlp_runs_and_matmul_add_fuses(tmp_path: Path) -> None:
    out = tmp_path / "mlp_basic.onnx"
    sess = _session(make_mlp(), ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, out)
    (y,) = sess.run(None, {"x": np.random.default_rng(0).standard_normal((3, 64), np.float32)})
    assert y.shape == (3, 10) and np.isfinite(y).all()
    ops = collections.Counter(n.op_type for n in onnx.load(str(out)).graph.node)
    assert ops["Gemm"] == 3 and ops["MatMul"] == 0  # MatMul+Add -> Gemm at basic level


def test_cnn_runs_and_conv_bn_fuses(tmp_path: Path) -> None:
    model = make_cnn()
    image = np.random.default_rng(0).standard_normal((2, 3, 32, 32), np.float32)
    (ref,) = _session(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, {"image": image})
    out = tmp_path / "cnn_basic.onnx"
    (y,) = _session(model, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, out).run(None, {"image": image})
    assert y.shape == (2, 10)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    ops = collections.Counter(n.op_type for n in onnx.load(str(out)).graph.node)
    assert ops["BatchNormalization"] == 0 and ops["Conv"] == 3


def test_encoder_runs_and_honours_mask() -> None:
    rng = np.random.default_rng(1)
    feeds = _encoder_feeds(2, 32, rng)
    sess = _session(make_encoder())
    (h,) = sess.run(None, feeds)
    assert h.shape == (2, 32, 128) and np.isfinite(h).all()
    # Changing tokens under mask 0 must not change the unmasked positions.
    feeds2 = {k: v.copy() for k, v in feeds.items()}
    feeds2["input_ids"][1, 16:] = (feeds2["input_ids"][1, 16:] + 1) % 1000
    (h2,) = sess.run(None, feeds2)
    np.testing.assert_allclose(h2[1, :16], h[1, :16], atol=1e-5)


# -- encoder fusion (the main acceptance criterion) ---------------------------------------


def test_encoder_fuses_with_ort_transformers_optimizer(tmp_path: Path) -> None:
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    path = tmp_path / "encoder.onnx"
    onnx.save(make_encoder(), str(path))
    opt = optimizer.optimize_model(str(path), model_type="bert", num_heads=4, hidden_size=128, opt_level=0)
    stats = opt.get_fused_operator_statistics()
    assert stats["Attention"] == 2
    assert stats["SkipLayerNormalization"] == 4
    assert stats["BiasGelu"] == 2
    assert stats["EmbedLayerNormalization"] == 1
    fused = tmp_path / "encoder_fused.onnx"
    opt.save_model_to_file(str(fused))
    feeds = _encoder_feeds(2, 64, np.random.default_rng(2))
    (ref,) = _session(path).run(None, feeds)
    (got,) = _session(fused).run(None, feeds)
    np.testing.assert_allclose(got, ref, atol=1e-4)


# -- decoder: numpy reference, cache, mask ---------------------------------------------------


class _RefDecoder:
    """Independent numpy implementation of the Llama-style decoder, from the initializers."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
        meta = {p.key: p.value for p in model.metadata_props}
        self.layers = int(meta["num_layers"])
        self.heads = int(meta["num_heads"])
        self.kv_heads = int(meta["num_kv_heads"])
        self.head_dim = int(meta["head_dim"])
        self.eps = float(meta["rms_epsilon"])

    def _rms(self, x: np.ndarray, name: str) -> np.ndarray:
        return self.w[f"{name}.weight"] * x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps)

    @staticmethod
    def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def __call__(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        attention_mask: np.ndarray,
        past: list[tuple[np.ndarray, np.ndarray]],
    ) -> tuple[np.ndarray, list]:
        b, s = input_ids.shape
        hd, h, hkv = self.head_dim, self.heads, self.kv_heads
        x = self.w["model.embed_tokens.weight"][input_ids]
        inv_freq = self.w["model.rotary_emb.inv_freq"].ravel()
        freqs = position_ids[..., None].astype(np.float64) * inv_freq
        emb = np.concatenate([freqs, freqs], axis=-1)[:, None]  # [B, 1, S, Dh]
        cos, sin = np.cos(emb), np.sin(emb)
        p = past[0][0].shape[2]
        allowed = (np.arange(p + s)[None, :] <= (p + np.arange(s))[:, None])[None, None]
        allowed = allowed & (attention_mask[:, None, None, :] == 1)
        presents = []
        for i in range(self.layers):
            pre = f"model.layers.{i}"
            a = self._rms(x, f"{pre}.input_layernorm")

            def heads_of(proj: str, n: int) -> np.ndarray:
                y = a @ self.w[f"{pre}.self_attn.{proj}.weight"]  # noqa: B023 - called in this iteration only
                return y.reshape(b, s, n, hd).transpose(0, 2, 1, 3)

            q, k, v = heads_of("q_proj", h), heads_of("k_proj", hkv), heads_of("v_proj", hkv)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            k = np.concatenate([past[i][0], k], axis=2)
            v = np.concatenate([past[i][1], v], axis=2)
            presents.append((k, v))
            kr, vr = np.repeat(k, h // hkv, axis=1), np.repeat(v, h // hkv, axis=1)
            scores = q @ kr.transpose(0, 1, 3, 2) / np.sqrt(hd)
            scores = np.where(allowed, scores, -np.inf)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            ctx = (scores / scores.sum(-1, keepdims=True)) @ vr
            ctx = ctx.transpose(0, 2, 1, 3).reshape(b, s, h * hd)
            x = x + ctx @ self.w[f"{pre}.self_attn.o_proj.weight"]
            m = self._rms(x, f"{pre}.post_attention_layernorm")
            gate = m @ self.w[f"{pre}.mlp.gate_proj.weight"]
            up = m @ self.w[f"{pre}.mlp.up_proj.weight"]
            x = x + (gate / (1 + np.exp(-gate)) * up) @ self.w[f"{pre}.mlp.down_proj.weight"]
        logits = self._rms(x, "model.norm") @ self.w["lm_head.weight"]
        return logits, presents


def _empty_past(batch: int, layers: int = 2, kv_heads: int = 2, head_dim: int = 16) -> list:
    z = np.zeros((batch, kv_heads, 0, head_dim), np.float32)
    return [(z, z) for _ in range(layers)]


def _run_decoder(
    sess: ort.InferenceSession, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, past: list
) -> tuple[np.ndarray, list]:
    feeds = {"input_ids": ids, "position_ids": positions, "attention_mask": mask}
    for i, (k, v) in enumerate(past):
        feeds[f"past_key_values.{i}.key"] = k
        feeds[f"past_key_values.{i}.value"] = v
    logits, *flat = sess.run(None, feeds)
    return logits, [(flat[2 * i], flat[2 * i + 1]) for i in range(len(past))]


def test_decoder_matches_numpy_reference_with_past(
    decoder: onnx.ModelProto, decoder_session: ort.InferenceSession
) -> None:
    ref = _RefDecoder(decoder)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 256, (2, 12), dtype=np.int64)
    pos = np.broadcast_to(np.arange(12, dtype=np.int64), (2, 12)).copy()
    mask = np.ones((2, 12), np.int64)
    want, want_presents = ref(ids, pos, mask, _empty_past(2))
    got, presents = _run_decoder(decoder_session, ids, pos, mask, _empty_past(2))
    assert got.shape == (2, 12, 256)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for (k, v), (wk, wv) in zip(presents, want_presents):
        assert k.shape == (2, 2, 12, 16)
        np.testing.assert_allclose(k, wk, atol=1e-4)
        np.testing.assert_allclose(v, wv, atol=1e-4)
    # Prefill of 7 tokens on top of a 5-token cache: the causal mask must be offset by past.
    _, past5 = _run_decoder(decoder_session, ids[:, :5], pos[:, :5], mask[:, :5], _empty_past(2))
    got7, _ = _run_decoder(decoder_session, ids[:, 5:], pos[:, 5:], mask, past5)
    np.testing.assert_allclose(got7, want[:, 5:], rtol=1e-4, atol=1e-4)


def _greedy(sess: ort.InferenceSession, prompt: list[int], steps: int, cache: bool) -> tuple[list[int], list]:
    """Greedy tokens and their logits, with the KV cache fed back or recomputing everything."""
    tokens = list(prompt)
    past = _empty_past(1)
    new_logits = []
    for _ in range(steps):
        if cache:
            n_past = past[0][0].shape[2]
            ids = np.array([tokens[n_past:]], np.int64)
            pos = np.arange(n_past, len(tokens), dtype=np.int64)[None]
            logits, past = _run_decoder(sess, ids, pos, np.ones((1, len(tokens)), np.int64), past)
        else:
            ids = np.array([tokens], np.int64)
            pos = np.arange(len(tokens), dtype=np.int64)[None]
            logits, _ = _run_decoder(sess, ids, pos, np.ones((1, len(tokens)), np.int64), _empty_past(1))
        new_logits.append(logits[0, -1])
        tokens.append(int(np.argmax(logits[0, -1])))
    return tokens[len(prompt) :], new_logits


@pytest.mark.parametrize("prompt_len", [1, 7, 64])
def test_decoder_greedy_with_cache_equals_without(decoder_session: ort.InferenceSession, prompt_len: int) -> None:
    prompt = np.random.default_rng(prompt_len).integers(0, 256, prompt_len).tolist()
    cached, cached_logits = _greedy(decoder_session, prompt, 8, cache=True)
    full, full_logits = _greedy(decoder_session, prompt, 8, cache=False)
    assert cached == full
    np.testing.assert_allclose(np.stack(cached_logits), np.stack(full_logits), atol=1e-4)


def test_decoder_honours_left_padding(decoder_session: ort.InferenceSession) -> None:
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, 7, dtype=np.int64)
    b = rng.integers(0, 256, 4, dtype=np.int64)
    pad = 3
    ids = np.stack([a, np.concatenate([np.zeros(pad, np.int64), b])])
    mask = np.ones((2, 7), np.int64)
    mask[1, :pad] = 0
    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    batch_logits, past = _run_decoder(decoder_session, ids, pos, mask, _empty_past(2))
    alone, alone_past = _run_decoder(
        decoder_session, b[None], np.arange(4)[None], np.ones((1, 4), np.int64), _empty_past(1)
    )
    np.testing.assert_allclose(batch_logits[1, pad:], alone[0], atol=1e-4)
    # One cached decode step with the extended mask still ignores the padding.
    nxt = np.array([[5], [9]], np.int64)
    mask2 = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
    step, _ = _run_decoder(decoder_session, nxt, pos[:, -1:] + 1, mask2, past)
    step_alone, _ = _run_decoder(decoder_session, nxt[1:], np.array([[4]]), np.ones((1, 5), np.int64), alone_past)
    np.testing.assert_allclose(step[1], step_alone[0], atol=1e-4)


def test_decoder_fuses_into_group_query_attention(
    decoder: onnx.ModelProto, decoder_session: ort.InferenceSession
) -> None:
    pytest.importorskip("onnxscript")
    ir = pytest.importorskip("onnx_ir")
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    fused_ir, counts = optimize_for_ort(ir.serde.deserialize_model(decoder))
    assert counts["gqa"] == 2
    assert counts["rms_normalization"] == 5 and counts["skip_rms_normalization"] == 4
    assert counts["rotary_embedding"] == 4
    fused = ir.serde.serialize_model(fused_ir)
    ops = collections.Counter(n.op_type for n in fused.graph.node)
    assert ops["GroupQueryAttention"] == 2 and ops["Softmax"] == 0
    # The fused model (batch 1, no padding: GQA derives lengths from position_ids) agrees.
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 256, (1, 9), dtype=np.int64)
    pos, mask = np.arange(9)[None], np.ones((1, 9), np.int64)
    want, want_past = _run_decoder(decoder_session, ids[:, :6], pos[:, :6], mask[:, :6], _empty_past(1))
    fused_sess = _session(fused)
    got, got_past = _run_decoder(fused_sess, ids[:, :6], pos[:, :6], mask[:, :6], _empty_past(1))
    np.testing.assert_allclose(got, want, atol=1e-4)
    want2, _ = _run_decoder(decoder_session, ids[:, 6:], pos[:, 6:], mask, want_past)
    got2, _ = _run_decoder(fused_sess, ids[:, 6:], pos[:, 6:], mask, got_past)
    np.testing.assert_allclose(got2, want2, atol=1e-4)


# -- determinism, files, cache ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DEMO_MODELS))
def test_same_seed_same_bytes(name: str) -> None:
    build = DEMO_MODELS[name]
    first = build(seed=0).SerializeToString()
    assert build(seed=0).SerializeToString() == first
    assert build(seed=1).SerializeToString() != first


def test_specs_match_builders() -> None:
    for name in ("encoder", "decoder"):
        meta = {p.key: p.value for p in DEMO_MODELS[name]().metadata_props}
        for key, value in DEMO_SPECS[name].config.items():
            if key in meta:
                assert float(meta[key]) == value, (name, key)
    assert DEMO_SPECS["decoder"].dims["total_sequence"] == (
        DEMO_SPECS["decoder"].dims["past_sequence"] + DEMO_SPECS["decoder"].dims["sequence"]
    )


def test_write_demo_models(tmp_path: Path) -> None:
    paths = write_demo_models(tmp_path / "out")
    assert set(paths) == {"mlp", "cnn", "encoder", "decoder"}
    for name, path in paths.items():
        assert path == tmp_path / "out" / f"{name}.onnx"
        assert onnx.load(str(path)).SerializeToString() == DEMO_MODELS[name]().SerializeToString()
    assert not list((tmp_path / "out").glob(".*"))  # no temp files left


def test_demo_model_path_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTPILOT_CACHE_DIR", str(tmp_path / "cache"))
    path = demo_model_path("mlp")
    assert path.is_file() and path.is_relative_to(tmp_path / "cache")
    mtime = path.stat().st_mtime_ns
    assert demo_model_path("mlp") == path
    assert path.stat().st_mtime_ns == mtime  # not rebuilt
    _session(path).run(None, {"x": np.zeros((1, 64), np.float32)})


def test_unknown_demo_model_lists_valid_names() -> None:
    with pytest.raises(UsageError) as info:
        demo_model_path("resnet")
    for name in ("mlp", "cnn", "encoder", "decoder"):
        assert name in str(info.value)
