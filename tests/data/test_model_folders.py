"""Model folders: every layout, the file chosen, the values read with their source, contradictions refused."""

from __future__ import annotations

import json
import shutil

import pytest
from folders import image_folder, sentence_folder

from ortpilot.data import model_path_of, resolve_model_folder
from ortpilot.errors import UsageError


@pytest.mark.parametrize("layout", ["optimum", "hf-onnx", "genai", "bare"])
def test_each_layout_gives_its_model_file_and_what_its_files_say(tmp_path, demo_paths, layout):
    root = sentence_folder(tmp_path / "m", demo_paths["encoder"], layout)
    folder = resolve_model_folder(root)
    expected = {"optimum": "model.onnx", "hf-onnx": "onnx/model.onnx", "genai": "encoder.onnx", "bare": "model.onnx"}
    assert folder.layout == layout and folder.model_file == root / expected[layout]
    if layout == "bare":
        assert folder.values == {} and folder.tokenizer_file is None and folder.task == ""
        return
    assert folder.get("num_heads") == 4 and folder.get("hidden_size") == 128
    assert folder.values["model_type"].source == "config.json"
    assert folder.values["pooling"].to_dict() == {"value": "mean_tokens", "source": "1_Pooling/config.json"}
    assert folder.tokenizer_file == root / "tokenizer.json" and folder.task == "sentence-embedding"
    if layout == "genai":  # genai_config.json wins over config.json where both speak
        assert folder.values["num_heads"].source == "genai_config.json" and folder.get("max_positions") == 256
    else:
        assert folder.get("max_positions") == 512
    doc = folder.to_dict()
    assert doc["values"]["hidden_size"] == {"value": 128, "source": doc["values"]["hidden_size"]["source"]}


def test_several_models_are_listed_and_model_file_chooses(tmp_path, demo_paths):
    root = sentence_folder(tmp_path / "m", demo_paths["encoder"], "hf-onnx")
    shutil.copy(demo_paths["encoder"], root / "onnx" / "model_quantized.onnx")
    with pytest.raises(UsageError, match=r"several models: model\.onnx, model_quantized\.onnx.*--model-file"):
        resolve_model_folder(root)
    assert resolve_model_folder(root, "model_quantized.onnx").model_file == root / "onnx" / "model_quantized.onnx"
    with pytest.raises(UsageError, match="'model_q4.onnx' is not in"):
        resolve_model_folder(root, "model_q4.onnx")
    assert model_path_of(root, "model.onnx") == root / "onnx" / "model.onnx"
    with pytest.raises(UsageError, match="chooses a model inside a folder"):
        model_path_of(demo_paths["encoder"], "model.onnx")


@pytest.mark.parametrize(
    "config,message",
    [
        ({"num_attention_heads": 5}, "5 does not divide 128"),
        ({"num_attention_heads": "four"}, "must be a positive integer"),
        ({"hidden_size": 0}, "must be a positive integer"),
        ({"num_key_value_heads": 3}, "does not divide num_attention_heads=4"),
    ],
)
def test_contradicting_or_malformed_configs_are_refused(tmp_path, demo_paths, config, message):
    root = sentence_folder(tmp_path / "m", demo_paths["encoder"], **config)
    with pytest.raises(UsageError, match=message):
        resolve_model_folder(root)


def test_a_damaged_config_or_an_empty_folder_is_a_message(tmp_path, demo_paths):
    root = sentence_folder(tmp_path / "m", demo_paths["encoder"])
    (root / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match="config.json.*cannot be read as JSON"):
        resolve_model_folder(root)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no .onnx model in it"):
        resolve_model_folder(tmp_path / "empty")


def test_an_image_folder_is_a_classifier_with_its_preprocessor(tmp_path, demo_paths):
    folder = resolve_model_folder(image_folder(tmp_path / "cnn", demo_paths["cnn"]))
    assert folder.task == "classifier" and folder.preprocessor["size"] == {"height": 32, "width": 32}
    assert json.loads((tmp_path / "cnn" / "preprocessor_config.json").read_text())["image_mean"] == [0.5, 0.5, 0.5]
