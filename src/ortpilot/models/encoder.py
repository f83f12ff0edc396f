"""A small BERT-style encoder in the op pattern of a Hugging Face ``BertModel`` export.

The graph is written node for node the way ``torch.onnx.export`` (opset 14+) emits BERT, so
``onnxruntime.transformers.optimizer`` (model_type "bert") recognises it and fuses
EmbedLayerNormalization, Attention, SkipLayerNormalization and (Bias)Gelu, exactly as on a
real BERT. That makes it a realistic but millisecond-fast target for ``ortpilot tune``.
Pattern details the fusions depend on are noted inline.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from ortpilot.models._graph import FLOAT, INT64, GraphBuilder

LN_EPSILON = 1e-12
TYPE_VOCAB = 2
MASK_FILL = -10000.0  # HF's extended-attention-mask fill value in older exports


def _linear(g: GraphBuilder, x: str, fan_in: int, fan_out: int, prefix: str) -> str:
    """nn.Linear as exported: MatMul by the transposed weight, then Add(bias, ...)."""
    w = g.weight(f"{prefix}.weight", [fan_in, fan_out], 1.0 / math.sqrt(fan_in))
    b = g.weight(f"{prefix}.bias", [fan_out], 0.02)
    y = g.op("MatMul", [x, w], f"{prefix}/MatMul")
    return g.op("Add", [b, y], f"{prefix}/Add")


def _layer_norm(g: GraphBuilder, x: str, hidden: int, prefix: str, out: str | None = None) -> str:
    # The LayerNormalization op (opset 17+): ORT's SkipLayerNormalization and
    # EmbedLayerNormalization fusions start from it (the decomposed form is first fused into
    # it by FusionLayerNormalization, so both work; this one is smaller).
    gamma = g.initializer(f"{prefix}.weight", (1.0 + 0.05 * g.rng.standard_normal(hidden)).astype(np.float32))
    beta = g.weight(f"{prefix}.bias", [hidden], 0.02)
    return g.op(
        "LayerNormalization", [x, gamma, beta], f"{prefix}/LayerNormalization", out=out, axis=-1, epsilon=LN_EPSILON
    )


def _embeddings(g: GraphBuilder, hidden: int, vocab: int, max_positions: int) -> str:
    input_ids, token_type_ids = "input_ids", "token_type_ids"
    word_table = g.weight("embeddings.word_embeddings.weight", [vocab, hidden], 0.5)
    pos_table = g.weight("embeddings.position_embeddings.weight", [max_positions, hidden], 0.1)
    type_table = g.weight("embeddings.token_type_embeddings.weight", [TYPE_VOCAB, hidden], 0.1)
    # Gather on initializers: ortpilot's input generator keeps ids below the table's rows.
    words = g.op("Gather", [word_table, input_ids], "embeddings/word_embeddings/Gather")
    types = g.op("Gather", [type_table, token_type_ids], "embeddings/token_type_embeddings/Gather")
    x = g.op("Add", [words, types], "embeddings/Add")
    # position_ids = self.position_ids[:, :seq_len], with the registered buffer as an
    # initializer: Shape -> Gather(1) -> Unsqueeze(0) -> Slice. EmbedLayerNormalization
    # fusion matches exactly this chain (FusionEmbedLayerNoMask.match_position_embedding_bert).
    pos_buffer = g.initializer("embeddings.position_ids", np.arange(max_positions, dtype=np.int64)[None, :])
    shape = g.op("Shape", [input_ids], "embeddings/Shape")
    seq_len = g.op("Gather", [shape, g.i64(1)], "embeddings/Gather", axis=0)
    seq_len_1d = g.op("Unsqueeze", [seq_len, g.i64([0])], "embeddings/Unsqueeze")
    position_ids = g.op("Slice", [pos_buffer, g.i64([0]), seq_len_1d, g.i64([1]), g.i64([1])], "embeddings/Slice")
    positions = g.op("Gather", [pos_table, position_ids], "embeddings/position_embeddings/Gather")
    x = g.op("Add", [x, positions], "embeddings/Add")
    return _layer_norm(g, x, hidden, "embeddings.LayerNorm")


def _attention_mask(g: GraphBuilder) -> str:
    """(1 - mask[:, None, None, :]) * -10000, the HF ``get_extended_attention_mask`` export."""
    m = g.op("Unsqueeze", ["attention_mask", g.i64([1])], "mask/Unsqueeze")
    m = g.op("Unsqueeze", [m, g.i64([2])], "mask/Unsqueeze")
    m = g.op("Cast", [m], "mask/Cast", to=onnx.TensorProto.FLOAT)
    m = g.op("Sub", [g.const(1.0), m], "mask/Sub")
    return g.op("Mul", [m, g.const(MASK_FILL)], "mask/Mul")


def _self_attention(g: GraphBuilder, x: str, mask: str | None, hidden: int, heads: int, prefix: str) -> str:
    head_dim = hidden // heads
    split = g.i64([0, 0, heads, head_dim])

    def project(name: str, perm: list[int]) -> str:
        y = _linear(g, x, hidden, hidden, f"{prefix}.self.{name}")
        y = g.op("Reshape", [y, split], f"{prefix}/self/{name}/Reshape")
        return g.op("Transpose", [y], f"{prefix}/self/{name}/Transpose", perm=perm)

    q = project("query", [0, 2, 1, 3])
    k = project("key", [0, 2, 3, 1])  # K^T directly, as the exporter folds the two transposes
    v = project("value", [0, 2, 1, 3])
    scores = g.op("MatMul", [q, k], f"{prefix}/self/MatMul")
    scores = g.op("Div", [scores, g.const(math.sqrt(head_dim))], f"{prefix}/self/Div")
    if mask is not None:  # without it every token attends to the padding too (a model whose padding leaks)
        scores = g.op("Add", [scores, mask], f"{prefix}/self/Add")
    probs = g.op("Softmax", [scores], f"{prefix}/self/Softmax", axis=-1)
    ctx = g.op("MatMul", [probs, v], f"{prefix}/self/MatMul")
    ctx = g.op("Transpose", [ctx], f"{prefix}/self/Transpose", perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.i64([0, 0, hidden])], f"{prefix}/self/Reshape")
    out = _linear(g, ctx, hidden, hidden, f"{prefix}.output.dense")
    out = g.op("Add", [out, x], f"{prefix}/output/Add")
    return _layer_norm(g, out, hidden, f"{prefix}.output.LayerNorm")


def _gelu(g: GraphBuilder, x: str, prefix: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt(2))), the Erf form ORT fuses into Gelu/BiasGelu."""
    y = g.op("Div", [x, g.const(math.sqrt(2.0))], f"{prefix}/Div")
    y = g.op("Erf", [y], f"{prefix}/Erf")
    y = g.op("Add", [y, g.const(1.0)], f"{prefix}/Add")
    y = g.op("Mul", [x, y], f"{prefix}/Mul")
    return g.op("Mul", [y, g.const(0.5)], f"{prefix}/Mul")


def _feed_forward(g: GraphBuilder, x: str, hidden: int, intermediate: int, prefix: str, out: str | None) -> str:
    y = _linear(g, x, hidden, intermediate, f"{prefix}.intermediate.dense")
    y = _gelu(g, y, f"{prefix}/intermediate/gelu")
    y = _linear(g, y, intermediate, hidden, f"{prefix}.output.dense")
    y = g.op("Add", [y, x], f"{prefix}/output/Add")
    return _layer_norm(g, y, hidden, f"{prefix}.output.LayerNorm", out=out)


def _classifier_head(g: GraphBuilder, x: str, hidden: int, labels: int) -> str:
    """BertForSequenceClassification's head: the pooler (dense + tanh on the first token), then the classifier."""
    first = g.op("Gather", [x, g.i64(0)], "pooler/Gather", axis=1)
    pooled = g.op("Tanh", [_linear(g, first, hidden, hidden, "pooler.dense")], "pooler/Tanh")
    w = g.weight("classifier.weight", [hidden, labels], 1.0 / math.sqrt(hidden))
    b = g.weight("classifier.bias", [labels], 0.02)
    return g.op("Add", [g.op("MatMul", [pooled, w], "classifier/MatMul"), b], "classifier/Add", out="logits")


def make_encoder(
    seed: int = 0,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    vocab: int = 1000,
    max_positions: int = 512,
    *,
    mask_attention: bool = True,
    labels: int = 0,
) -> onnx.ModelProto:
    """BERT-style encoder: ``input_ids``/``attention_mask``/``token_type_ids`` int64
    [batch, sequence] -> ``last_hidden_state`` float32 [batch, sequence, hidden].

    ``labels`` > 0 adds a sequence-classification head (``logits`` [batch, labels] instead: a
    cross-encoder with one label, a classifier with several). ``mask_attention=False`` leaves the
    attention mask out of the attention, so padded positions change the real tokens' vectors: the
    mistake a shape plan's gate must catch (the input stays declared, as in a faulty export).
    """
    if layers < 1 or hidden % heads:
        raise ValueError(f"need layers >= 1 and hidden ({hidden}) a multiple of heads ({heads})")
    if labels < 0:
        raise ValueError(f"labels must be 0 (no head) or more, got {labels}")
    g = GraphBuilder("demo_encoder", seed)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        g.input(name, INT64, ["batch", "sequence"])
    x = _embeddings(g, hidden, vocab, max_positions)
    mask = _attention_mask(g) if mask_attention else None
    for i in range(layers):
        prefix = f"encoder.layer.{i}"
        last = i == layers - 1 and not labels
        x = _self_attention(g, x, mask, hidden, heads, f"{prefix}.attention")
        x = _feed_forward(g, x, hidden, 4 * hidden, prefix, out="last_hidden_state" if last else None)
    if labels:
        g.output(_classifier_head(g, x, hidden, labels), FLOAT, ["batch", labels])
    else:
        g.output("last_hidden_state", FLOAT, ["batch", "sequence", hidden])
    meta = {
        "model_type": "bert",
        "num_layers": str(layers),
        "hidden_size": str(hidden),
        "num_heads": str(heads),
        "vocab_size": str(vocab),
        "max_positions": str(max_positions),
    }
    return g.build(
        f"ortpilot demo BERT-style encoder ({layers} layers, hidden {hidden}, {heads} heads).", metadata=meta
    )
