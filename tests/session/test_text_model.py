"""session.text.TextModel on real ORT sessions of the demo text folders: padding invisible on the masked encoder and
visible on the leaking one, buckets, order kept, truncation said, pooled outputs used as is, static shapes, the
three tasks, and inputs text cannot fill."""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortpilot.data import resolve_model_folder
from ortpilot.errors import InputError, UsageError
from ortpilot.models import text_folder
from ortpilot.session import load
from ortpilot.session.text import TextModel, session_outputs, task_of_folder

SHORT = "a dog runs in the park"
LONG = "onnx runtime runs the model fast on the cpu and the gpu while the server answers every request " * 4
TEXTS = ["the cat", LONG, "where is the nearest train station today", "hi", "rain all day and the match was on monday"]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _model(folder: Path, session=None, **options) -> TextModel:
    info = resolve_model_folder(folder)
    session = session or load(str(info.model_file), ["cpu"], "strict")
    return TextModel(session, task_of_folder(info, session), info.tokenizer_file, **options)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text")
    built = {kind: text_folder(root / kind, kind) for kind in ("embed", "rerank", "classify")}
    built["leak"] = text_folder(root / "leak", "embed", leak=True)
    return built


def test_padding_is_invisible_on_the_masked_encoder_and_visible_on_the_leaking_one(folders) -> None:
    # runs cost nothing less than padding here: the short text is padded to the long one's length
    masked, leaky = _model(folders["embed"], run_cost=math.inf), _model(folders["leak"], run_cost=math.inf)
    for text in (masked, leaky):
        run = text([SHORT, LONG])
        assert run.batches[0].rows == 2 and run.tokens[0] < run.batches[0].length  # the short one was padded
    alone, batched = masked.embed([SHORT])[0], masked.embed([SHORT, LONG])[0]
    assert _cos(alone, batched) > 0.9999
    leaked_alone, leaked_batched = leaky.embed([SHORT])[0], leaky.embed([SHORT, LONG])[0]
    assert _cos(leaked_alone, leaked_batched) < 0.99


def test_results_come_back_in_the_callers_order_whatever_the_batches(folders) -> None:
    text = _model(folders["embed"], max_batch=2, run_cost=math.inf)
    run = text(TEXTS)
    assert [b.items for b in run.batches] == [(1, 2), (4, 0), (3,)]  # longest first: 4 and 0 come back swapped
    one_by_one = np.stack([text.embed([t])[0] for t in TEXTS])
    assert run.values.shape == (5, 128) and run.values.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(run.values, axis=1), 1.0, rtol=1e-5)  # modules.json: Normalize
    for got, alone in zip(run.values, one_by_one):
        assert _cos(got, alone) > 0.9999
    assert run.tokens == tuple(len(text.tokenizer.encode(t).ids) for t in TEXTS)


def test_the_pooled_vector_is_the_mean_of_the_real_token_vectors(folders) -> None:
    info = resolve_model_folder(folders["embed"])
    session = ort.InferenceSession(str(info.model_file), providers=["CPUExecutionProvider"])  # any ORT session
    text = _model(folders["embed"], session=session)
    ids = np.array([text.tokenizer.encode(SHORT).ids], np.int64)
    tokens = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": 0 * ids})[0]
    mean = tokens[0].mean(axis=0)
    np.testing.assert_allclose(text.embed([SHORT, LONG])[0], mean / np.linalg.norm(mean), atol=1e-5)


def test_length_buckets_pad_up_to_the_bucket_and_change_nothing_on_a_masked_model(folders) -> None:
    plain, bucketed = _model(folders["embed"]), _model(folders["embed"], lengths=[64, 16, 32])
    run = bucketed(TEXTS)
    assert {b.length for b in run.batches} <= {16, 32, 64, max(run.tokens)}
    assert bucketed(["hi"]).batches[0].length == 16
    assert bucketed([LONG]).batches[0].length == max(64, bucketed([LONG]).tokens[0])
    for a, b in zip(plain(TEXTS).values, run.values):
        assert _cos(a, b) > 0.9999
    with pytest.raises(UsageError, match="lengths: length buckets must be positive integers"):
        _model(folders["embed"], lengths=[0])
    with pytest.raises(UsageError, match="max_batch must be a positive integer"):
        _model(folders["embed"], max_batch=0)
    for bad in (-1, float("nan"), "12", True):
        with pytest.raises(UsageError, match="run_cost must be a number of tokens"):
            _model(folders["embed"], run_cost=bad)


def test_truncation_is_reported_per_item_logged_by_embed_and_refused_on_request(folders, caplog) -> None:
    text = _model(folders["embed"])
    huge = "the cat sat on the mat " * 40  # 240 words, over max_seq_length 128
    run = text([SHORT, huge])
    assert run.truncated == (False, True) and run.tokens[1] == 128 == text.max_length
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        text.embed([SHORT, huge])
    assert "1 of 2 text(s) were longer than 128 tokens and were truncated" in caplog.text
    with pytest.raises(InputError, match="Item 1 is longer than the model's limit of 128 tokens"):
        text.embed([SHORT, huge], truncate=False)
    strict = _model(folders["embed"], truncate=False)
    with pytest.raises(InputError, match="longer than the model's limit"):
        strict([huge])
    assert strict([huge], truncate=True).truncated == (True,)


def test_the_cross_encoder_scores_pairs_as_one_encoded_pair(folders) -> None:
    text = _model(folders["rerank"])
    query, docs = "where is the station", ["the train station is near", "flour and salt", LONG]
    scores = text.rerank(query, docs)
    assert scores.shape == (3,) and scores.dtype == np.float32 and ((scores > 0) & (scores < 1)).all()
    session = ort.InferenceSession(str(folders["rerank"] / "model.onnx"), providers=["CPUExecutionProvider"])
    enc = text.tokenizer.encode(query, docs[1])
    ids, types = np.array([enc.ids], np.int64), np.array([enc.type_ids], np.int64)
    assert types.max() == 1
    logit = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": types})[0]
    np.testing.assert_allclose(scores[1], 1 / (1 + np.exp(-logit[0, 0])), rtol=1e-5)
    with pytest.raises(InputError, match="is a cross-encoder: it scores \\(query, document\\) pairs, and item 0"):
        text(["not a pair"])
    with pytest.raises(InputError, match="Item 0 of the query is empty"):
        text.rerank(" ", docs)
    with pytest.raises(UsageError, match="is a cross-encoder: use rerank\\(query, documents\\); it does not embed"):
        text.embed(docs)


def test_the_classifier_names_its_labels(folders) -> None:
    text = _model(folders["classify"])
    got = text.classify(["i love this", "i hate this", "the cat"])
    assert [label in ("negative", "neutral", "positive") for label, _ in got] == [True] * 3
    probs = text(["i love this"]).values
    assert probs.shape == (1, 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    assert got[0] == (text.task.labels[int(probs[0].argmax())], pytest.approx(float(probs[0].max())))
    with pytest.raises(UsageError, match="is a sequence classifier: use classify\\(texts\\); it does not rerank"):
        text.rerank("q", ["d"])


def _with_pooled_output(source: Path, dest: Path) -> Path:
    """The encoder with mean pooling under the mask inside the graph, as output sentence_embedding [batch, 128]."""
    model = onnx.load(str(source))
    g = model.graph
    g.node.extend(
        [
            helper.make_node("Cast", ["attention_mask"], ["m_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["m_f", "axis_last"], ["m_3d"]),
            helper.make_node("Mul", ["last_hidden_state", "m_3d"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "axis_seq"], ["total"], keepdims=0),
            helper.make_node("ReduceSum", ["m_3d", "axis_seq"], ["count"], keepdims=0),
            helper.make_node("Div", ["total", "count"], ["sentence_embedding"]),
        ]
    )
    g.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.array([2], np.int64), "axis_last"),
            onnx.numpy_helper.from_array(np.array([1], np.int64), "axis_seq"),
        ]
    )
    g.output.append(helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", 128]))
    shutil.copytree(source.parent, dest)
    onnx.save(model, str(dest / "model.onnx"))
    return dest


def test_a_model_that_outputs_the_pooled_vector_is_used_as_is(folders, tmp_path: Path) -> None:
    folder = _with_pooled_output(folders["embed"] / "model.onnx", tmp_path / "pooled")
    text = _model(folder)
    assert (text.task.output, text.task.pooled) == ("sentence_embedding", True)
    for a, b in zip(text.embed(TEXTS), _model(folders["embed"]).embed(TEXTS)):
        assert _cos(a, b) > 0.9999


def _static(source: Path, dest: Path, batch: int | None, length: int) -> Path:
    model = onnx.load(str(source / "model.onnx"))
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if batch is not None:
            dims[0].dim_value = batch
        dims[1].dim_value = length
    shutil.copytree(source, dest)
    onnx.save(model, str(dest / "model.onnx"))
    return dest


def test_a_model_exported_at_one_length_and_batch_gets_exactly_that(folders, tmp_path: Path) -> None:
    text = _model(_static(folders["embed"], tmp_path / "static", 2, 32))
    assert (text.max_length, text.lengths, text.max_batch) == (32, (32,), 2)
    run = text(TEXTS)
    assert {b.length for b in run.batches} == {32} and [b.rows for b in run.batches] == [2, 2, 1]
    assert run.truncated[1] and run.tokens[1] == 32
    dynamic = _model(folders["embed"], truncate=True)
    for a, b, cut in zip(run.values, dynamic(TEXTS).values, run.truncated):
        if not cut:
            assert _cos(a, b) > 0.9999


def test_a_model_without_an_attention_mask_runs_each_text_alone(folders, tmp_path: Path) -> None:
    model = onnx.load(str(folders["leak"] / "model.onnx"))  # the leaking encoder never reads its mask
    kept = [i for i in model.graph.input if i.name != "attention_mask"]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    dest = shutil.copytree(folders["leak"], tmp_path / "nomask")
    onnx.save(model, str(dest / "model.onnx"))
    text = _model(dest)
    assert text.max_batch == 1
    run = text([SHORT, LONG])
    assert [b.rows for b in run.batches] == [1, 1] and run.fill == 1.0
    assert _cos(run.values[0], text.embed([SHORT])[0]) > 0.9999


def test_inputs_text_cannot_fill_and_outputs_the_task_lacks_are_refused(folders, demo_paths) -> None:
    info = resolve_model_folder(folders["embed"])
    session = load(str(demo_paths["mlp"]), ["cpu"], "strict")
    with pytest.raises(UsageError, match=r"takes x \(tensor\(float\)\), which text cannot fill"):
        TextModel(session, task_of_folder(info, load(str(info.model_file), ["cpu"])), info.tokenizer_file)
    classify = resolve_model_folder(folders["classify"])
    task = task_of_folder(classify, load(str(classify.model_file), ["cpu"]))
    with pytest.raises(UsageError, match="reads output 'logits', but the model returns last_hidden_state"):
        TextModel(load(str(info.model_file), ["cpu"]), task, info.tokenizer_file)


def test_session_outputs_reads_ort_output_facts(folders) -> None:
    session = ort.InferenceSession(str(folders["classify"] / "model.onnx"), providers=["CPUExecutionProvider"])
    (facts,) = session_outputs(session)
    assert (facts.name, facts.dtype, facts.dims) == ("logits", np.dtype("float32"), ("batch", 3))


def test_encode_then_run_is_the_call_and_a_lower_max_length_cuts_sooner(folders) -> None:
    text = _model(folders["embed"], max_batch=2)
    tokens = text.encode(TEXTS)
    assert tokens.lengths == list(text(TEXTS).tokens)
    np.testing.assert_array_equal(text.run(tokens).values, text(TEXTS).values)
    short = _model(folders["embed"], max_length=8)
    assert short.max_length == 8 and max(short.encode(TEXTS).lengths) == 8
    assert _model(folders["embed"], max_length=10_000).max_length == 128  # never above the folder's limit
    with pytest.raises(UsageError, match="max_length must be an integer of at least 2"):
        _model(folders["embed"], max_length=1)
