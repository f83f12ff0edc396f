"""serve.textfacts and the resolution of text-model folders: what a served model does with text, read before
Ray starts (a folder's task, a profile's recorded one, what a model file lacks), and how serve tells a text
folder from a decoder's folder (both have a tokenizer.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ortpilot.errors import UsageError
from ortpilot.models import text_folder
from ortpilot.serve.openai.spec import is_decoder_target
from ortpilot.serve.options import ModelSpec, resolve_models
from ortpilot.serve.textfacts import TextFacts, text_facts


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("textfacts")
    return {kind: text_folder(root / kind, kind) for kind in ("embed", "rerank", "classify")}


def test_a_text_folder_is_served_as_its_model_file_with_its_task(folders):
    for kind, folder in folders.items():
        assert not is_decoder_target(str(folder))  # a tokenizer.json beside an encoder is no decoder
        (spec,) = resolve_models([str(folder)])
        assert spec.kind == "model" and spec.path.endswith("model.onnx") and spec.folder == str(folder.resolve())
        facts = text_facts(spec)
        assert facts.kind == kind and facts.tokenizer.endswith("tokenizer.json") and not facts.missing
        assert TextFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts
    from ortpilot.modelio import load_model

    (spec,) = resolve_models([str(folders["embed"])])
    assert text_facts(spec, load_model(spec.path)).dim == 128
    public = text_facts(resolve_models([str(folders["classify"])])[0]).public_dict()
    assert public["labels"] == ["negative", "neutral", "positive"] and public["outputs"][0]["shape"] == [-1, 3]


def test_a_model_without_a_tokenizer_says_what_is_missing(demo_paths, tmp_path):
    facts = text_facts(ModelSpec("mlp", "model", str(demo_paths["mlp"]), "demo:mlp"))
    assert (
        not facts.text
        and "served from a model file, which has no tokenizer" in facts.missing
        and "demo:mlp" not in facts.missing
    )
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(demo_paths["mlp"], bare / "model.onnx")
    with pytest.raises(UsageError, match="is a folder without profile.json or bundle.json"):
        resolve_models([str(bare)])  # as before: a folder with no tokenizer is not served


def test_a_text_folder_that_does_not_say_its_task_is_refused_before_anything_starts(folders, tmp_path):
    folder = Path(shutil.copytree(folders["embed"], tmp_path / "nopool"))
    for name in ("modules.json", "sentence_bert_config.json"):
        (folder / name).unlink()
    shutil.rmtree(folder / "1_Pooling")
    with pytest.raises(UsageError, match="does not say what its text model does"):
        resolve_models([str(folder)])
