"""Small models built in code whose outputs a gate must judge differently (tests of metric choice and masks).

- ``three_outputs``: a float vector ``embedding [batch, 384]`` (no evidence of class scores), a
  Softmax output ``p [batch, 384]`` of the same shape, and an int64 passthrough ``ids_out``;
- ``token_model``: ``input_ids``/``attention_mask`` -> ``last_hidden_state [batch, sequence, hidden]``,
  optionally with noise added only at padding positions (mask 0) or only at real ones (mask 1);
- ``sentence_folder`` / ``classifier_folder``: those models in folders whose configs say what they are;
- ``byte_classifier``: a byte-feature classifier MLP whose softmax is built from Exp / ReduceSum / Div (with
  ReduceMax / Sub first when stable), and ``byte_samples`` to feed it;
- ``ctc_recognizer``: a CTC-style text recognizer that declares ``[1, seqlen]`` and returns ``[steps, 1, 40]``
  class scores, and ``text_images`` to feed it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortpilot.artifacts.atomic import save_model
from ortpilot.modelio import DEFAULT_OPSET, SAFE_IR_VERSION

VOCAB = 50
HIDDEN = 16


def _model(nodes, inputs, outputs, inits, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
    model.ir_version = SAFE_IR_VERSION
    onnx.checker.check_model(model)
    return model


def three_outputs(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = {
        "W1": rng.standard_normal((64, 384)).astype(np.float32) * 0.1,
        "W2": rng.standard_normal((64, 384)).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["embedding"]),
        helper.make_node("MatMul", ["x", "W2"], ["scores_raw"]),
        helper.make_node("Softmax", ["scores_raw"], ["soft"], axis=-1),
        helper.make_node("Identity", ["soft"], ["p"]),
        helper.make_node("Identity", ["ids"], ["ids_out"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64]),
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8]),
    ]
    outputs = [
        helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", 384]),
        helper.make_tensor_value_info("p", TensorProto.FLOAT, ["batch", 384]),
        helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["batch", 8]),
    ]
    return _model(nodes, inputs, outputs, inits, "three_outputs")


def token_model(noise_at: str | None = None, scale: float = 1.0, seed: int = 0) -> onnx.ModelProto:
    """Token vectors = embedding rows, plus ``scale`` x noise where the mask is 0 (``"padding"``) or 1 (``"real"``)."""
    rng = np.random.default_rng(seed)
    embeddings = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    noise = rng.standard_normal(HIDDEN).astype(np.float32) * (scale if noise_at else 0.0)
    inits = {
        "E": embeddings,
        "N": noise,
        "one": np.array(1.0, np.float32),
        "last": np.array([-1], np.int64),
    }
    where = "keep" if noise_at == "real" else "pad"
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["keep"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "keep"], ["pad"]),
        helper.make_node("Unsqueeze", [where, "last"], ["where3"]),
        helper.make_node("Mul", ["where3", "N"], ["delta"]),
        helper.make_node("Add", ["emb", "delta"], ["last_hidden_state"]),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
    ]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])]
    return _model(nodes, inputs, outputs, inits, "token_model")


def padded_samples(count: int = 4, seq: int = 12, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Token samples whose last positions are padding (mask 0), a different number per sample."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(count):
        mask = np.ones((1, seq), np.int64)
        mask[0, seq - 2 - i % 4 :] = 0
        samples.append({"input_ids": rng.integers(0, VOCAB, (1, seq)).astype(np.int64), "attention_mask": mask})
    return samples


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_model(model, path)


WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "runs",
    "fast",
    "slow",
    "model",
    "onnx",
    "graph",
    "layer",
    "vector",
    "sentence",
    "meaning",
    "rain",
    "day",
]
SENTENCES = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(2 + i % 9)) for i in range(24)]  # 2-10 words


def word_tokenizer(path: Path) -> Path:
    """A WordLevel tokenizer.json over ``WORDS`` ([CLS] text [SEP]); every id stays below ``VOCAB``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(path))
    return path


def sentence_folder(root: Path, model: onnx.ModelProto | None = None) -> Path:
    """A sentence-transformers export: model.onnx, config.json, tokenizer.json and 1_Pooling/config.json
    (mean pooling)."""
    save(model or token_model(), root / "model.onnx")
    word_tokenizer(root / "tokenizer.json")
    (root / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": HIDDEN}))
    (root / "1_Pooling").mkdir(parents=True, exist_ok=True)
    (root / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": HIDDEN, "pooling_mode_mean_tokens": True})
    )
    return root


def classifier(classes: int = 3, seed: int = 0) -> onnx.ModelProto:
    """x [batch, 64] -> y [batch, classes] (plain MatMul: nothing in the graph says class scores)."""
    w = np.random.default_rng(seed).standard_normal((64, classes)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", classes])]
    return _model(nodes, inputs, outputs, {"W": w}, "classifier")


def byte_classifier(
    stable: bool = True, classes: int = 12, axis: int = -1, opset: int = DEFAULT_OPSET, seed: int = 0
) -> onnx.ModelProto:
    """A byte-feature file-type classifier MLP whose softmax is built from separate ops, as exporters trace a
    framework's softmax: ``bytes [batch, 256]`` -> MatMul/Add/Relu -> MatMul/Add -> (``x - ReduceMax(x)`` when
    ``stable``) -> Exp -> ``/ ReduceSum(axes=[axis], keepdims=1)`` -> ``file_type [batch, classes]``. No Softmax
    node and no class-like name: only the pattern says class probabilities. ``opset`` below 13 puts the axes in
    an attribute."""
    rng = np.random.default_rng(seed)
    inits = {
        "W1": rng.standard_normal((256, 64)).astype(np.float32) * 0.1,
        "b1": rng.standard_normal(64).astype(np.float32) * 0.1,
        "W2": rng.standard_normal((64, classes)).astype(np.float32) * 0.5,
        "b2": rng.standard_normal(classes).astype(np.float32) * 0.1,
    }
    in_attr = opset < 13
    if not in_attr:
        inits["axes"] = np.array([axis], np.int64)
    axes_in = [] if in_attr else ["axes"]
    axes_attr = {"axes": [axis]} if in_attr else {}
    nodes = [
        helper.make_node("MatMul", ["bytes", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["z0"]),
        helper.make_node("Add", ["z0", "b2"], ["z"]),
    ]
    if stable:
        max_in = ["z", *axes_in] if opset >= 18 else ["z"]
        max_attr = {} if opset >= 18 else {"axes": [axis]}
        nodes += [
            helper.make_node("ReduceMax", max_in, ["peak"], keepdims=1, **max_attr),
            helper.make_node("Sub", ["z", "peak"], ["shifted"]),
            helper.make_node("Exp", ["shifted"], ["e"]),
        ]
    else:
        nodes.append(helper.make_node("Exp", ["z"], ["e"]))
    nodes += [
        helper.make_node("ReduceSum", ["e", *axes_in], ["total"], keepdims=1, **axes_attr),
        helper.make_node("Div", ["e", "total"], ["file_type"]),
    ]
    inputs = [helper.make_tensor_value_info("bytes", TensorProto.FLOAT, ["batch", 256])]
    outputs = [helper.make_tensor_value_info("file_type", TensorProto.FLOAT, ["batch", classes])]
    graph = helper.make_graph(
        nodes, "byte_classifier", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits.items()]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = SAFE_IR_VERSION
    onnx.checker.check_model(model)
    return model


def byte_samples(count: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Byte histograms of random 'files' (each a sample of batch 1), the classifier's input: each file's bytes
    drawn from a range of its own (text, binary, mostly zeros...), so the classifier's top class varies."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        low = int(rng.integers(0, 240))
        data = rng.integers(low, int(rng.integers(low + 8, 257)), int(rng.integers(64, 4096)))
        hist = np.bincount(data, minlength=256).astype(np.float32)
        out.append({"bytes": (hist / hist.sum())[None, :] * 16.0})
    return out


def classifier_folder(root: Path, labels: int = 3, classes: int = 3) -> Path:
    save(classifier(classes), root / "model.onnx")
    config = {
        "model_type": "bert",
        "architectures": ["BertForSequenceClassification"],
        "id2label": {str(i): f"label{i}" for i in range(labels)},
    }
    (root / "config.json").write_text(json.dumps(config))
    return root


def ctc_recognizer(blank_bias: float = 9.0, seed: int = 0) -> onnx.ModelProto:
    """A small CTC-style text recognizer built in code: a 1x3x8xW image, a Conv that cuts it into W/8
    columns (steps), a MatMul to 40 classes, a Softmax and a Transpose to time-major ``[steps, 1, 40]``,
    while the graph declares ``[1, seqlen]`` (nothing in the graph says class scores). Class 0 is the blank (a
    bias keeps it the top class on most steps); its dynamic INT8 flips close calls between characters."""
    rng = np.random.default_rng(seed)
    channels, height, stride, features, classes = 3, 8, 8, 32, 40
    conv = rng.standard_normal((features, channels, height, stride)) / np.sqrt(channels * height * stride)
    proj = rng.standard_normal((features, classes)) * 1.5
    bias = np.zeros(classes)
    bias[0] = blank_bias
    inits = [
        numpy_helper.from_array(conv.astype(np.float32), "conv_w"),
        numpy_helper.from_array(proj.astype(np.float32), "proj"),
        numpy_helper.from_array(bias.astype(np.float32), "bias"),
        numpy_helper.from_array(np.array([features, -1], np.int64), "columns"),
        numpy_helper.from_array(np.array([0], np.int64), "batch_axis"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w"], ["feat"], kernel_shape=[height, stride], strides=[height, stride]),
        helper.make_node("Relu", ["feat"], ["act"]),
        helper.make_node("Reshape", ["act", "columns"], ["by_feature"]),  # [features, steps]
        helper.make_node("Transpose", ["by_feature"], ["by_step"], perm=[1, 0]),  # [steps, features]
        helper.make_node("Unsqueeze", ["by_step", "batch_axis"], ["batch_major"]),  # [1, steps, features]
        helper.make_node("MatMul", ["batch_major", "proj"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["logits_"]),
        helper.make_node("Softmax", ["logits_"], ["probs"], axis=2),
        helper.make_node("Transpose", ["probs"], ["387"], perm=[1, 0, 2]),  # [steps, 1, classes]
    ]
    graph = helper.make_graph(
        nodes,
        "ctc_recognizer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, height, "width"])],
        [helper.make_tensor_value_info("387", TensorProto.FLOAT, [1, "seqlen"])],  # wrong, like the issue's
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def text_images(count: int, width: int = 160, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.random((1, 3, 8, width), dtype=np.float32)} for _ in range(count)]
