"""models.textfolder: the demo text folders (sentence encoder, cross-encoder, classifier), byte-identical on every
build, their WordPiece tokenizer, and the encoder whose padding leaks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from ortpilot.errors import UsageError
from ortpilot.models import TEXT_KINDS, text_folder, write_demo_text_folders
from ortpilot.models.textfolder import CLASS_LABELS, VOCAB, WORDS, make_text_tokenizer


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_kind_is_the_same_bytes_on_every_build(tmp_path: Path) -> None:
    for kind in TEXT_KINDS:
        first, second = text_folder(tmp_path / "a" / kind, kind), text_folder(tmp_path / "b" / kind, kind)
        assert _files(first) == _files(second)
    assert not list(tmp_path.rglob(".*"))  # no temp files left


def test_the_folders_hold_what_sentence_transformers_and_transformers_write(tmp_path: Path) -> None:
    folders = write_demo_text_folders(tmp_path)
    assert sorted(folders) == ["text-classify", "text-embed", "text-rerank"]
    embed = folders["text-embed"]
    assert set(_files(embed)) == {
        "1_Pooling/config.json",
        "config.json",
        "model.onnx",
        "modules.json",
        "sentence_bert_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    types = [m["type"].rsplit(".", 1)[1] for m in json.loads((embed / "modules.json").read_text())]
    assert types == ["Transformer", "Pooling", "Normalize"]
    rerank = json.loads((folders["text-rerank"] / "config.json").read_text())
    assert rerank["architectures"] == ["BertForSequenceClassification"] and rerank["id2label"] == {"0": "LABEL_0"}
    classify = json.loads((folders["text-classify"] / "config.json").read_text())
    assert list(classify["id2label"].values()) == list(CLASS_LABELS)
    for name, outputs in (("text-embed", [(1, 5, 128)]), ("text-rerank", [(1, 1)]), ("text-classify", [(1, 3)])):
        session = ort.InferenceSession(str(folders[name] / "model.onnx"), providers=["CPUExecutionProvider"])
        feeds = {i.name: np.ones((1, 5), np.int64) for i in session.get_inputs()}
        assert [o.shape for o in session.run(None, feeds)] == outputs


def test_the_tokenizer_is_wordpiece_within_the_encoders_vocabulary() -> None:
    tok = make_text_tokenizer()
    assert tok.get_vocab_size() <= VOCAB
    assert tok.encode("The cat sat on the MAT").tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    assert tok.encode("quickly").tokens == ["[CLS]", "quick", "##ly", "[SEP]"]
    assert tok.encode("zyx").tokens == ["[CLS]", "z", "##y", "##x", "[SEP]"]  # any ASCII word is spelled
    pair = tok.encode("a dog", "the cat")
    assert pair.type_ids == [0, 0, 0, 0, 1, 1, 1]
    assert len(set(WORDS)) == len(WORDS)


def test_the_leaking_encoder_lets_padding_change_the_real_tokens(tmp_path: Path) -> None:
    def vectors(folder: Path, pad: int) -> np.ndarray:
        session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        ids = np.array([[2, 30, 40, 3] + [0] * pad], np.int64)
        mask = np.array([[1] * 4 + [0] * pad], np.int64)
        out = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        return out[0, :4]

    masked, leaky = text_folder(tmp_path / "m"), text_folder(tmp_path / "l", leak=True)
    np.testing.assert_allclose(vectors(masked, 0), vectors(masked, 12), atol=1e-4)
    assert np.abs(vectors(leaky, 0) - vectors(leaky, 12)).max() > 0.1


def test_an_unknown_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="Unknown text folder kind 'summarize'. Valid kinds: embed, rerank, classify"):
        text_folder(tmp_path, "summarize")
