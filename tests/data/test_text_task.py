"""data.texttask (and what data.folder reads for it): a text-model folder's task, output, pooling, normalization,
length limit and labels, each from the file that says it; folders that cannot be followed exactly are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ortpilot.data import resolve_model_folder
from ortpilot.data.texttask import TextTask, text_task
from ortpilot.errors import UsageError
from ortpilot.graph.outputs import OutputFacts
from ortpilot.models import text_folder

F32 = np.dtype("float32")
TOKENS = [OutputFacts("last_hidden_state", F32, ("batch", "sequence", 128))]


def _edit(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text-folders")
    return {kind: text_folder(root / kind, kind) for kind in ("embed", "rerank", "classify")}


def _copy(folder: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(folder, tmp_path / folder.name))


def test_the_folder_values_a_sentence_encoder_has(folders: dict[str, Path]) -> None:
    folder = resolve_model_folder(folders["embed"])
    assert folder.values["modules"].to_dict() == {
        "value": ["Transformer", "Pooling", "Normalize"],
        "source": "modules.json",
    }
    assert folder.values["pooling_modes"].to_dict() == {"value": ["mean_tokens"], "source": "1_Pooling/config.json"}
    assert folder.values["pooling"].value == "mean_tokens"  # what the gate's metric choice reads
    assert folder.values["max_seq_length"].to_dict() == {"value": 128, "source": "sentence_bert_config.json"}
    assert folder.get("lowercase") is False
    assert folder.get("model_max_length") == 512


def test_a_sentence_encoder_pools_and_normalizes_as_its_files_say(folders: dict[str, Path]) -> None:
    task = text_task(resolve_model_folder(folders["embed"]), TOKENS)
    assert task == TextTask(
        "embed",
        "last_hidden_state",
        pooling=("mean_tokens",),
        normalize=True,
        max_seq_length=128,
        sources=(
            ("lowercase", "sentence_bert_config.json"),
            ("max_seq_length", "sentence_bert_config.json"),
            ("normalize", "modules.json"),
            ("pooling", "1_Pooling/config.json"),
        ),
    )
    assert "mean_tokens pooling" in task.describe() and "normalized" in task.describe()
    assert TextTask.from_dict(json.loads(json.dumps(task.to_dict()))) == task


def test_a_pooled_output_is_used_as_is(folders: dict[str, Path]) -> None:
    outputs = [*TOKENS, OutputFacts("sentence_embedding", F32, ("batch", 128))]
    task = text_task(resolve_model_folder(folders["embed"]), outputs)
    assert (task.output, task.pooled, task.pooling, task.normalize) == ("sentence_embedding", True, (), True)
    pooler = [*TOKENS, OutputFacts("pooler_output", F32, ("batch", 128))]  # BERT's pooler is no sentence vector
    assert text_task(resolve_model_folder(folders["embed"]), pooler).output == "last_hidden_state"


def test_several_pooling_modes_and_a_pooling_folder_named_by_modules_json(folders, tmp_path: Path) -> None:
    root = _copy(folders["embed"], tmp_path)
    (root / "1_Pooling").rename(root / "pool")
    modules = json.loads((root / "modules.json").read_text())
    modules[1]["path"] = "pool"
    (root / "modules.json").write_text(json.dumps(modules))
    _edit(root / "pool" / "config.json", pooling_mode_cls_token=True, pooling_mode_max_tokens=True)
    task = text_task(resolve_model_folder(root), TOKENS)
    assert task.pooling == ("cls_token", "max_tokens", "mean_tokens")
    assert task.source_of["pooling"] == "pool/config.json"


def test_max_seq_length_is_capped_at_the_position_limit(folders, tmp_path: Path) -> None:
    root = _copy(folders["embed"], tmp_path)
    _edit(root / "sentence_bert_config.json", max_seq_length=4096)
    task = text_task(resolve_model_folder(root), TOKENS)
    assert (task.max_seq_length, task.source_of["max_seq_length"]) == (512, "config.json")
    _edit(root / "sentence_bert_config.json", max_seq_length=0)
    with pytest.raises(UsageError, match="max_seq_length = 0; it must be a positive integer"):
        resolve_model_folder(root)


def test_a_module_ortpilot_does_not_apply_is_refused(folders, tmp_path: Path) -> None:
    root = _copy(folders["embed"], tmp_path)
    modules = json.loads((root / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (root / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UsageError, match=r"lists Dense after the transformer.*sentence_embedding"):
        text_task(resolve_model_folder(root), TOKENS)
    pooled = [OutputFacts("sentence_embedding", F32, ("batch", 128))]  # the graph holds the Dense: fine
    assert text_task(resolve_model_folder(root), pooled).pooled


def test_a_folder_that_does_not_say_how_to_pool_is_not_guessed(folders, tmp_path: Path) -> None:
    root = _copy(folders["embed"], tmp_path)
    for name in ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
        (root / name).unlink()
    with pytest.raises(UsageError, match=r"does not say what its text model does.*pooling='mean'"):
        text_task(resolve_model_folder(root), TOKENS)
    task = text_task(resolve_model_folder(root), TOKENS, pooling="cls")
    assert (task.pooling, task.normalize, task.source_of["pooling"]) == (("cls_token",), False, "pooling=")
    with pytest.raises(UsageError, match="unknown pooling 'median'"):
        text_task(resolve_model_folder(root), TOKENS, pooling="median")


def test_no_tokenizer_and_no_readable_output_are_refused(folders, tmp_path: Path) -> None:
    root = _copy(folders["embed"], tmp_path)
    two = [OutputFacts("a", F32, ("batch", "s", 8)), OutputFacts("b", F32, ("batch", "s", 8))]
    with pytest.raises(UsageError, match=r"no output ortpilot can read sentence embeddings from \(outputs: a\[batch"):
        text_task(resolve_model_folder(root), two)
    (root / "tokenizer.json").unlink()
    with pytest.raises(UsageError, match=r"has no tokenizer.json; a text model needs one"):
        text_task(resolve_model_folder(root), TOKENS)


def test_a_cross_encoder_and_a_classifier(folders: dict[str, Path]) -> None:
    rerank = text_task(resolve_model_folder(folders["rerank"]), [OutputFacts("logits", F32, ("batch", 1))])
    assert (rerank.kind, rerank.output, rerank.labels, rerank.activation) == (
        "rerank",
        "logits",
        ("LABEL_0",),
        "sigmoid",
    )
    assert rerank.max_seq_length == 512 and rerank.source_of["labels"] == "config.json"
    classify = text_task(resolve_model_folder(folders["classify"]), [OutputFacts("logits", F32, ("batch", 3))])
    assert (classify.kind, classify.labels, classify.activation) == (
        "classify",
        ("negative", "neutral", "positive"),
        "softmax",
    )
    assert TextTask.from_dict(classify.to_dict()) == classify


def test_classifier_files_that_contradict_the_model_or_name_their_activation(folders, tmp_path: Path) -> None:
    root = _copy(folders["classify"], tmp_path)
    logits = [OutputFacts("logits", F32, ("batch", 3))]
    with pytest.raises(UsageError, match="names 3 labels .* but the model's logits have 4"):
        text_task(resolve_model_folder(root), [OutputFacts("logits", F32, ("batch", 4))])
    _edit(root / "config.json", problem_type="multi_label_classification")
    assert text_task(resolve_model_folder(root), logits).activation == "sigmoid"
    _edit(root / "config.json", sentence_transformers={"activation_fn": "torch.nn.modules.linear.Identity"})
    assert text_task(resolve_model_folder(root), logits).activation == "none"
    _edit(root / "config.json", sentence_transformers={"activation_fn": "torch.nn.modules.activation.Tanh"})
    with pytest.raises(UsageError, match="names the score function 'torch.nn.modules.activation.Tanh'"):
        text_task(resolve_model_folder(root), logits)
    _edit(root / "config.json", sentence_transformers=None, id2label={"0": "a", "2": "b"})
    with pytest.raises(UsageError, match="must map the ids 0..N-1"):
        text_task(resolve_model_folder(root), logits)


def test_from_dict_is_strict() -> None:
    good = TextTask("embed", "last_hidden_state", pooling=("mean_tokens",)).to_dict()
    for bad, message in (
        ({**good, "extra": 1}, "unknown field"),
        ({k: v for k, v in good.items() if k != "output"}, "no output"),
        ({**good, "pooled": "yes"}, "field 'pooled'"),
        ({**good, "max_seq_length": True}, "field 'max_seq_length'"),
        ({**good, "labels": [1]}, "field 'labels'"),
        ({**good, "kind": "translate"}, "kind 'translate' is not one of"),
        ({**good, "pooling": []}, "needs a pooling mode"),
        ({**good, "pooling": ["median"]}, "is not made of"),
        ([], "not a JSON object"),
    ):
        with pytest.raises(UsageError, match=message):
            TextTask.from_dict(bad, "profile text.task")


def test_sentence_transformers_files_that_are_not_what_it_writes_are_refused(folders, tmp_path: Path) -> None:
    root = _copy(folders["embed"], tmp_path)
    (root / "modules.json").write_text('{"0": "Transformer"}')
    with pytest.raises(UsageError, match="is not a list of modules with a 'type' each"):
        resolve_model_folder(root)
    (root / "modules.json").write_text("[{")
    with pytest.raises(UsageError, match="modules.json '.*' cannot be read as JSON"):
        resolve_model_folder(root)
    (root / "modules.json").unlink()
    _edit(root / "sentence_bert_config.json", do_lower_case="yes")
    with pytest.raises(UsageError, match="do_lower_case = 'yes'; it must be true or false"):
        resolve_model_folder(root)
