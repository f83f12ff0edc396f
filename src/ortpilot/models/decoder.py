"""A small Llama-style decoder with a KV cache, in the op pattern of a Hugging Face export.

It exists so that ``ortpilot generate``/``decode`` and the tuner have a decoder to work on
without downloads: RMSNorm, rotary embeddings, grouped-query attention (repeat_kv), SiLU
MLP, and past/present KV tensors ``[batch, kv_heads, seq, head_dim]`` with present =
Concat(past, new) along the sequence axis.

The graph follows the Llama export closely enough that ``onnxscript.rewriter.ort_fusions``
fuses every layer into ``com.microsoft::GroupQueryAttention`` (plus RMSNorm, SkipRMSNorm,
RotaryEmbedding): the causal mask is built from ``input_ids``/``past_key_values.0.key``
shapes and the ``attention_mask`` input exactly as ``onnxscript``'s causal-mask pattern
expects, and the rotary cos/sin come from ``position_ids`` through ``inv_freq`` (the
CosSinCache pattern). Pattern details the fusions depend on are noted inline.

Semantics (what the numpy reference in the tests implements): ``attention_mask``
[batch, past + sequence] is 1 for real tokens and 0 for padding; key ``j`` is visible to
query ``i`` (absolute position ``past + i``) iff ``j <= past + i`` and the mask is 1 there.
``position_ids`` are given by the caller (for left padding: cumsum(mask) - 1).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from ortpilot.models._graph import FLOAT, INT64, GraphBuilder

RMS_EPSILON = 1e-5
ROPE_THETA = 10000.0
INT64_MAX = np.iinfo(np.int64).max


def _rms_norm(g: GraphBuilder, x: str, hidden: int, prefix: str) -> str:
    """LlamaRMSNorm: weight * (x * 1/sqrt(mean(x^2) + eps)) (the RmsNormFusion pattern)."""
    weight = g.initializer(f"{prefix}.weight", (1.0 + 0.05 * g.rng.standard_normal(hidden)).astype(np.float32))
    sq = g.op("Pow", [x, g.const(2.0)], f"{prefix}/Pow")
    mean = g.op("ReduceMean", [sq, g.i64([-1])], f"{prefix}/ReduceMean", keepdims=1, noop_with_empty_axes=0)
    var = g.op("Add", [mean, g.const(RMS_EPSILON)], f"{prefix}/Add")
    rms = g.op("Sqrt", [var], f"{prefix}/Sqrt")
    inv = g.op("Reciprocal", [rms], f"{prefix}/Reciprocal")
    normed = g.op("Mul", [x, inv], f"{prefix}/Mul")
    return g.op("Mul", [weight, normed], f"{prefix}/Mul")


def _linear(g: GraphBuilder, x: str, fan_in: int, fan_out: int, prefix: str) -> str:
    """Bias-free projection; the weight is stored [in, out] (already transposed)."""
    w = g.weight(f"{prefix}.weight", [fan_in, fan_out], 1.0 / math.sqrt(fan_in))
    return g.op("MatMul", [x, w], f"{prefix}/MatMul")


def _rotary_cos_sin(g: GraphBuilder, head_dim: int) -> tuple[str, str]:
    """LlamaRotaryEmbedding: freqs = inv_freq @ position_ids, emb = cat(freqs, freqs)."""
    inv_freq = 1.0 / ROPE_THETA ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    inv_freq_t = g.initializer("model.rotary_emb.inv_freq", inv_freq.astype(np.float32).reshape(1, -1, 1))  # [1, E, 1]
    pos = g.op("Unsqueeze", ["position_ids", g.i64([1])], "rotary/Unsqueeze")  # [B, 1, S]
    pos = g.op("Cast", [pos], "rotary/Cast", to=FLOAT)
    freqs = g.op("MatMul", [inv_freq_t, pos], "rotary/MatMul")  # [B, E, S]
    freqs = g.op("Transpose", [freqs], "rotary/Transpose", perm=[0, 2, 1])  # [B, S, E]
    emb = g.op("Concat", [freqs, freqs], "rotary/Concat", axis=-1)
    cos = g.op("Cos", [emb], "rotary/Cos")
    sin = g.op("Sin", [emb], "rotary/Sin")
    cos = g.op("Unsqueeze", [cos, g.i64([1])], "rotary/Unsqueeze")  # [B, 1, S, Dh]
    sin = g.op("Unsqueeze", [sin, g.i64([1])], "rotary/Unsqueeze")
    return cos, sin


def _apply_rotary(g: GraphBuilder, x: str, cos: str, sin: str, head_dim: int, prefix: str) -> str:
    """x * cos + rotate_half(x) * sin, with Slice on axis 3 (RotaryEmbeddingFusion)."""
    half = head_dim // 2
    x1 = g.op("Slice", [x, g.i64([0]), g.i64([half]), g.i64([3]), g.i64([1])], f"{prefix}/Slice")
    x2 = g.op("Slice", [x, g.i64([half]), g.i64([INT64_MAX]), g.i64([3]), g.i64([1])], f"{prefix}/Slice")
    rotated = g.op("Concat", [g.op("Neg", [x2], f"{prefix}/Neg"), x1], f"{prefix}/Concat", axis=-1)
    a = g.op("Mul", [x, cos], f"{prefix}/Mul")
    b = g.op("Mul", [rotated, sin], f"{prefix}/Mul")
    return g.op("Add", [a, b], f"{prefix}/Add")


def _causal_mask(g: GraphBuilder, min_val: str) -> str:
    """The 4D additive mask [B, 1, S, past + S] of a transformers Llama export.

    causal[i, j] = min where j > past + i, else 0; then positions where attention_mask is 0
    (padding) are set to min as well. Built from Shape(input_ids) and
    Shape(past_key_values.0.key) node for node as onnxscript's _CausalMaskPattern expects.
    """
    seq_len = g.op("Shape", ["input_ids"], "mask/Shape", start=1, end=2)
    seq_len_0d = g.op("Squeeze", [seq_len], "mask/Squeeze")
    past_len = g.op("Shape", ["past_key_values.0.key"], "mask/Shape", start=2, end=3)
    past_len_0d = g.op("Squeeze", [past_len], "mask/Squeeze")
    total_0d = g.op("Add", [past_len_0d, seq_len_0d], "mask/Add")
    total = g.op("Reshape", [total_0d, g.i64([-1])], "mask/Reshape")
    current = g.op("Range", [past_len_0d, total_0d, g.i64(1)], "mask/Range")
    mask_shape = g.op("Concat", [seq_len, total], "mask/Concat", axis=0)
    all_min = g.op("Expand", [min_val, mask_shape], "mask/Expand")
    all_min = g.op("Trilu", [all_min, g.i64(1)], "mask/Trilu", upper=1)
    row = g.op("Range", [g.i64(0), total_0d, g.i64(1)], "mask/Range")
    col = g.op("Reshape", [current, g.i64([-1, 1])], "mask/Reshape")
    non_causal = g.op("Greater", [row, col], "mask/Greater")
    non_causal = g.op("Cast", [non_causal], "mask/Cast", to=FLOAT)
    causal = g.op("Mul", [all_min, non_causal], "mask/Mul")
    causal = g.op("Unsqueeze", [causal, g.i64([0, 1])], "mask/Unsqueeze")
    batch = g.op("Shape", ["input_ids"], "mask/Shape", start=0, end=1)
    one = g.i64([1])
    shape_b111 = g.op("Concat", [batch, one, one, one], "mask/Concat", axis=0)
    causal = g.op("Expand", [causal, shape_b111], "mask/Expand")
    padding = g.op("Unsqueeze", ["attention_mask", g.i64([1, 2])], "mask/Unsqueeze")
    padding = g.op("Cast", [padding], "mask/Cast", to=FLOAT)
    total_mask = g.op("Add", [causal, padding], "mask/Add")
    is_zero = g.op("Equal", [total_mask, g.const(0.0)], "mask/Equal")
    mask = g.op("Where", [is_zero, min_val, causal], "mask/Where")
    # Shapes computed from Shape() values are not named by ONNX shape inference; record
    # them (as a dynamo export does) so the attention output keeps [batch, sequence, hidden]
    # and the residual Add + RMSNorm fuse into SkipSimplifiedLayerNormalization.
    g.annotate(mask, FLOAT, ["batch", 1, "sequence", "total_sequence"])
    return mask


def _repeat_kv(g: GraphBuilder, x: str, heads: int, kv_heads: int, head_dim: int, prefix: str) -> str:
    """[B, Hkv, T, Dh] -> [B, H, T, Dh] via Unsqueeze/Expand/Reshape (HF repeat_kv)."""
    groups = heads // kv_heads
    y = g.op("Unsqueeze", [x, g.i64([2])], f"{prefix}/Unsqueeze")
    y = g.op("Expand", [y, g.i64([1, 1, groups, 1, 1])], f"{prefix}/Expand")
    y = g.op("Reshape", [y, g.i64([0, heads, -1, head_dim])], f"{prefix}/Reshape")
    # ONNX shape inference cannot name the -1 dim; record it as a dynamo export would, so
    # the SDPA fusion sees key and value with the same total sequence length.
    g.annotate(y, FLOAT, ["batch", heads, "total_sequence", head_dim])
    return y


def _attention(
    g: GraphBuilder, x: str, layer: int, cos: str, sin: str, mask: str, hidden: int, heads: int, kv_heads: int
) -> str:
    prefix = f"model.layers.{layer}.self_attn"
    head_dim = hidden // heads
    q = _linear(g, x, hidden, heads * head_dim, f"{prefix}.q_proj")
    k = _linear(g, x, hidden, kv_heads * head_dim, f"{prefix}.k_proj")
    v = _linear(g, x, hidden, kv_heads * head_dim, f"{prefix}.v_proj")
    # Reshape with constant [0, 0, H, Dh] so shape inference knows the head counts (GQA
    # fusion reads num_heads / kv_num_heads from these shapes).
    q = g.op("Reshape", [q, g.i64([0, 0, heads, head_dim])], f"{prefix}/q/Reshape")
    k = g.op("Reshape", [k, g.i64([0, 0, kv_heads, head_dim])], f"{prefix}/k/Reshape")
    v = g.op("Reshape", [v, g.i64([0, 0, kv_heads, head_dim])], f"{prefix}/v/Reshape")
    q = g.op("Transpose", [q], f"{prefix}/q/Transpose", perm=[0, 2, 1, 3])
    k = g.op("Transpose", [k], f"{prefix}/k/Transpose", perm=[0, 2, 1, 3])
    v = g.op("Transpose", [v], f"{prefix}/v/Transpose", perm=[0, 2, 1, 3])
    q = _apply_rotary(g, q, cos, sin, head_dim, f"{prefix}/q/rotary")
    k = _apply_rotary(g, k, cos, sin, head_dim, f"{prefix}/k/rotary")
    # The cache: present = Concat(past, new) on the sequence axis (axis -2, as exported).
    k = g.op("Concat", [f"past_key_values.{layer}.key", k], f"{prefix}/k/Concat", out=f"present.{layer}.key", axis=-2)
    v = g.op(
        "Concat", [f"past_key_values.{layer}.value", v], f"{prefix}/v/Concat", out=f"present.{layer}.value", axis=-2
    )
    k = _repeat_kv(g, k, heads, kv_heads, head_dim, f"{prefix}/k/repeat_kv")
    v = _repeat_kv(g, v, heads, kv_heads, head_dim, f"{prefix}/v/repeat_kv")
    kt = g.op("Transpose", [k], f"{prefix}/k/Transpose", perm=[0, 1, 3, 2])
    scores = g.op("MatMul", [q, kt], f"{prefix}/MatMul")
    scores = g.op("Mul", [scores, g.const(1.0 / math.sqrt(head_dim))], f"{prefix}/Mul")
    scores = g.op("Add", [scores, mask], f"{prefix}/Add")
    probs = g.op("Softmax", [scores], f"{prefix}/Softmax", axis=-1)
    ctx = g.op("MatMul", [probs, v], f"{prefix}/MatMul")
    ctx = g.op("Transpose", [ctx], f"{prefix}/Transpose", perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.i64([0, 0, heads * head_dim])], f"{prefix}/Reshape")
    return _linear(g, ctx, heads * head_dim, hidden, f"{prefix}.o_proj")


def _mlp(g: GraphBuilder, x: str, layer: int, hidden: int, intermediate: int) -> str:
    prefix = f"model.layers.{layer}.mlp"
    gate = _linear(g, x, hidden, intermediate, f"{prefix}.gate_proj")
    up = _linear(g, x, hidden, intermediate, f"{prefix}.up_proj")
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{prefix}/Sigmoid")], f"{prefix}/Mul")
    y = g.op("Mul", [silu, up], f"{prefix}/Mul")
    return _linear(g, y, intermediate, hidden, f"{prefix}.down_proj")


def make_decoder(
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 256,
    max_positions: int = 2048,
) -> onnx.ModelProto:
    """Llama-style decoder with KV cache (see the module docstring for inputs/outputs).

    ``max_positions`` is recorded in the metadata (rotary embeddings have no table); callers
    should not generate past it.
    """
    if layers < 1 or hidden % heads or heads % kv_heads or (hidden // heads) % 2:
        raise ValueError("need layers >= 1, hidden % heads == 0, heads % kv_heads == 0 and an even head_dim")
    head_dim = hidden // heads
    intermediate = 4 * hidden
    g = GraphBuilder("demo_decoder", seed)
    g.input("input_ids", INT64, ["batch", "sequence"])
    g.input("attention_mask", INT64, ["batch", "total_sequence"])
    g.input("position_ids", INT64, ["batch", "sequence"])
    for i in range(layers):
        for kind in ("key", "value"):
            g.input(f"past_key_values.{i}.{kind}", FLOAT, ["batch", kv_heads, "past_sequence", head_dim])

    table = g.weight("model.embed_tokens.weight", [vocab, hidden], 1.0)
    x = g.op("Gather", [table, "input_ids"], "model.embed_tokens/Gather")
    # One shared min constant: the mask pattern requires the same value in Expand and Where.
    min_val = g.initializer("mask.min", np.array(np.finfo(np.float32).min, dtype=np.float32))
    mask = _causal_mask(g, min_val)
    cos, sin = _rotary_cos_sin(g, head_dim)
    for i in range(layers):
        h = _rms_norm(g, x, hidden, f"model.layers.{i}.input_layernorm")
        h = _attention(g, h, i, cos, sin, mask, hidden, heads, kv_heads)
        x = g.op("Add", [x, h], f"model.layers.{i}/Add")
        h = _rms_norm(g, x, hidden, f"model.layers.{i}.post_attention_layernorm")
        h = _mlp(g, h, i, hidden, intermediate)
        x = g.op("Add", [x, h], f"model.layers.{i}/Add")
    x = _rms_norm(g, x, hidden, "model.norm")
    head = g.weight("lm_head.weight", [hidden, vocab], 1.0 / math.sqrt(hidden))
    g.op("MatMul", [x, head], "lm_head/MatMul", out="logits")

    g.output("logits", FLOAT, ["batch", "sequence", vocab])
    for i in range(layers):
        for kind in ("key", "value"):
            g.output(f"present.{i}.{kind}", FLOAT, ["batch", kv_heads, "total_sequence", head_dim])
    meta = {
        "model_type": "llama",
        "num_layers": str(layers),
        "hidden_size": str(hidden),
        "num_heads": str(heads),
        "num_kv_heads": str(kv_heads),
        "head_dim": str(head_dim),
        "vocab_size": str(vocab),
        "max_positions": str(max_positions),
        "rope_theta": str(ROPE_THETA),
        "rms_epsilon": str(RMS_EPSILON),
    }
    return g.build(
        f"ortpilot demo Llama-style decoder ({layers} layers, hidden {hidden}, "
        f"{heads} heads, {kv_heads} kv heads) with KV cache.",
        metadata=meta,
    )
