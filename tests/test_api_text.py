"""ortpilot.embed / rerank / classify / text_model (api.text_model): a text-model folder and a tune of one (the
profile records the folder's task and carries its tokenizer), and bad input refused with one-paragraph messages
before any model loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import ortpilot
from ortpilot.errors import InputError, StampMismatchError, UsageError
from ortpilot.models import text_folder

TEXTS = ["the cat sat on the mat", "a dog runs fast", "where is the nearest train station", "hi"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text-api")
    return {kind: text_folder(root / kind, kind) for kind in ("embed", "rerank", "classify")}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, folders: dict[str, Path]) -> Path:
    """A real tune of the demo sentence-encoder folder (small budget): its OUTDIR."""
    out = tmp_path_factory.mktemp("text-tuned") / "out"
    result = ortpilot.tune(str(folders["embed"]), str(out), 12)
    assert result.files["tokenizer"] == str(out / "tokenizer.json")
    return out


def _copy(folder: Path, dest: Path) -> Path:
    return Path(shutil.copytree(folder, dest))


def test_embed_a_folder(folders) -> None:
    vectors = ortpilot.embed(str(folders["embed"]), TEXTS)
    assert vectors.shape == (4, 128) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    model = ortpilot.text_model(folders["embed"] / "model.onnx")  # the model file inside its folder
    np.testing.assert_allclose(model.embed(TEXTS), vectors, atol=1e-6)
    assert ortpilot.embed(str(folders["embed"]), "one text").shape == (1, 128)


def test_text_model_takes_the_text_models_own_limits(folders) -> None:
    """max_length and run_cost reach the TextModel (docs/concepts/text-models.md's options table)."""
    short = ortpilot.text_model(folders["embed"], max_length=8, run_cost=0)
    run = short(TEXTS)
    assert short.max_length == 8 and max(run.tokens) == 8 and run.truncated == (False, False, True, False)
    assert len(run.batches) == 3  # run_cost 0: a run costs nothing, so no text is padded to another's length
    assert ortpilot.text_model(folders["embed"]).max_length == 128
    with pytest.raises(UsageError, match="run_cost must be a number of tokens"):
        ortpilot.text_model(folders["embed"], run_cost=-1)


def test_a_tune_records_the_task_and_carries_the_tokenizer(tuned: Path, folders) -> None:
    doc = json.loads((tuned / "profile.json").read_text())
    assert doc["text"]["task"]["kind"] == "embed" and doc["text"]["task"]["pooling"] == ["mean_tokens"]
    assert doc["text"]["task"]["normalize"] is True and doc["text"]["task"]["max_seq_length"] == 128
    assert doc["text"]["tokenizer"]["file"] == "tokenizer.json"
    assert (tuned / "tokenizer.json").read_bytes() == (folders["embed"] / "tokenizer.json").read_bytes()


def test_embed_a_tuned_profile_as_its_folder_does(tuned: Path, folders) -> None:
    reference = ortpilot.embed(str(folders["embed"]), TEXTS)
    for target in (tuned / "profile.json", tuned):  # the profile, or the tune's OUTDIR
        vectors = ortpilot.embed(str(target), TEXTS)
        assert vectors.shape == (4, 128)
        assert (np.sum(vectors * reference, axis=1) > 0.99).all()  # the tune's gate: pooled cosine >= 0.99
    model = ortpilot.text_model(str(tuned), max_batch=2, lengths=[16, 64])
    assert model.to_dict()["lengths"] == [16, 64] and model.task.kind == "embed"
    assert "Profile" in model.source


def test_a_changed_or_missing_tokenizer_is_a_stamp_mismatch(tuned: Path, tmp_path: Path) -> None:
    out = _copy(tuned, tmp_path / "out")
    (out / "tokenizer.json").write_text((out / "tokenizer.json").read_text().replace('"cat"', '"kat"'))
    with pytest.raises(StampMismatchError, match="changed since it was tuned"):
        ortpilot.embed(str(out), TEXTS)
    with pytest.raises(StampMismatchError, match="changed since it was tuned"):  # verify checks what serving reads
        ortpilot.verify(str(out))
    (out / "tokenizer.json").unlink()
    with pytest.raises(StampMismatchError, match="is missing. Keep the tokenizer.json"):
        ortpilot.embed(str(out), TEXTS)


def test_a_profile_whose_text_section_was_edited_is_refused(tuned: Path, tmp_path: Path) -> None:
    out = _copy(tuned, tmp_path / "out")
    doc = json.loads((out / "profile.json").read_text())
    doc["text"]["task"]["pooling"] = ["median"]
    (out / "profile.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="text.task: pooling \\['median'\\] is not made of"):
        ortpilot.embed(str(out), TEXTS)
    doc["text"]["tokenizer"]["file"] = "../tokenizer.json"
    (out / "profile.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="text.tokenizer.file"):
        ortpilot.embed(str(out), TEXTS)


def test_a_profile_with_no_text_model(encoder_profile: Path) -> None:
    with pytest.raises(UsageError, match="records no text model"):
        ortpilot.embed(str(encoder_profile), TEXTS)


def test_a_profile_takes_no_folder_options(tuned: Path) -> None:
    with pytest.raises(UsageError, match="is a profile: its providers, pooling and model file are the ones"):
        ortpilot.embed(str(tuned), TEXTS, pooling="cls")


def test_an_option_neither_text_model_nor_the_load_takes_is_named(folders, tuned: Path) -> None:
    # it was a TypeError from inside the load ("load() got an unexpected keyword argument")
    with pytest.raises(UsageError, match=r"unknown option\(s\) colour: .* what load\(\) takes: min_coverage"):
        ortpilot.text_model(str(folders["embed"]), colour="red")
    with pytest.raises(UsageError, match=r"unknown option\(s\) colour: .* what load_profile\(\) takes: accept_machine"):
        ortpilot.text_model(str(tuned), colour="red")
    with pytest.raises(UsageError, match="warm must be True or False, got 'no'"):
        ortpilot.text_model(str(tuned), warm="no")
    assert ortpilot.text_model(str(folders["embed"]), min_coverage=0.5).embed(TEXTS).shape == (4, 128)


def test_rerank_and_classify(folders) -> None:
    scores = ortpilot.rerank(str(folders["rerank"]), "where is the station", ["the train station", "flour", "salt"])
    assert scores.shape == (3,) and ((scores > 0) & (scores < 1)).all()
    labels = ortpilot.classify(str(folders["classify"]), ["i love it", "i hate it"])
    assert len(labels) == 2 and all(label in ("negative", "neutral", "positive") for label, _ in labels)
    assert all(0 < score <= 1 for _, score in labels)


def test_the_wrong_task_names_the_right_one(folders) -> None:
    with pytest.raises(UsageError, match=r"is a cross-encoder: use rerank\(query, documents\); it does not embed"):
        ortpilot.embed(str(folders["rerank"]), TEXTS)
    with pytest.raises(UsageError, match=r"is a sentence encoder: use embed\(texts\); it does not classify"):
        ortpilot.classify(str(folders["embed"]), TEXTS)
    with pytest.raises(UsageError, match="kind must be one of embed, rerank, classify"):
        ortpilot.text_model(str(folders["embed"]), kind="summarize")


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ([], "The texts are an empty list; give at least one string."),
        (["fine", ""], "Item 1 of the texts is empty or only whitespace"),
        (["fine", 7], "Item 1 of the texts is a number, not a string"),
        ({"a": 1}, "The texts must be a list of strings, not dict."),
        ({"a", "b"}, "The texts must be a list of strings, not set."),
    ],
)
def test_bad_texts_are_refused_before_the_model_loads(texts, message: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        ortpilot.embed(str(tmp_path / "no-such-folder"), texts)  # the model is never looked at
    assert "\n" not in str(info.value)


def test_a_folder_without_a_tokenizer_and_a_bare_model_file(folders, tmp_path: Path, demo_paths) -> None:
    folder = _copy(folders["embed"], tmp_path / "st")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(UsageError, match=f"The model folder '{folder}' has no tokenizer.json; embed needs one"):
        ortpilot.embed(str(folder), TEXTS)
    with pytest.raises(UsageError, match="is not a text-model folder or a profile"):
        ortpilot.embed(str(demo_paths["encoder"]), TEXTS)
