"""Sentences through a tokenizer.json and pictures through a preprocessor config, into model feeds."""

from __future__ import annotations

import numpy as np
import pytest
from folders import SENTENCES, image_folder, sentence_folder, word_tokenizer, write_images

from ortpilot.data import ImagePreprocess, image_samples, load_tokenizer, real_data, resolve_model_folder, text_samples
from ortpilot.errors import UsageError
from ortpilot.graph.shapes import graph_inputs
from ortpilot.modelio import load_model
from ortpilot.session import load


@pytest.fixture
def encoder_inputs(demo_paths):
    return graph_inputs(load_model(demo_paths["encoder"]))


def test_lines_keep_their_own_length_with_masks_and_type_ids_and_run(tmp_path, demo_paths, encoder_inputs):
    text = tmp_path / "s.txt"
    text.write_text("\n".join(SENTENCES[:4]) + "\n\n")
    tok = load_tokenizer(word_tokenizer(tmp_path / "tokenizer.json"))
    tok.enable_padding(length=32)  # as many exports' tokenizer.json do: not what a user's sentence is
    samples, notes = text_samples(text, tok, encoder_inputs)
    assert len(samples) == 4 and not notes
    assert len({s["input_ids"].shape for s in samples}) > 1
    for sample, sentence in zip(samples, SENTENCES[:4]):
        ids = tok.encode(sentence).ids
        assert sample["input_ids"].shape == (1, len(ids)) and sample["input_ids"].dtype == np.int64
        assert sample["input_ids"][0].tolist() == ids and sample["input_ids"][0, 0] == 2  # [CLS]
        assert sample["attention_mask"][0].tolist() == [1] * len(ids)
        assert set(sample["token_type_ids"].ravel()) == {0}
        out = load(str(demo_paths["encoder"])).run(None, sample)[0]
        assert out.shape == (1, len(ids), 128) and np.isfinite(out).all()


def test_a_shape_pads_every_line_to_one_length_with_the_tokenizers_pad_id(tmp_path, encoder_inputs):
    text = tmp_path / "s.txt"
    text.write_text("\n".join(SENTENCES[:4]))
    tok = load_tokenizer(word_tokenizer(tmp_path / "tokenizer.json"))
    samples, _ = text_samples(text, tok, encoder_inputs, shapes={"sequence": (12,)})
    pad = tok.token_to_id("[PAD]")
    for sample, sentence in zip(samples, SENTENCES[:4]):
        n = len(tok.encode(sentence).ids)
        assert sample["input_ids"].shape == (1, 12) and sample["input_ids"][0, n:].tolist() == [pad] * (12 - n)
        assert sample["attention_mask"][0].tolist() == [1] * n + [0] * (12 - n)


def test_shape_fixes_the_length_and_long_lines_are_truncated_with_a_note(tmp_path, encoder_inputs):
    text = tmp_path / "s.txt"
    text.write_text("\n".join(SENTENCES[:3]))
    tok = load_tokenizer(word_tokenizer(tmp_path / "tokenizer.json"))
    samples, notes = text_samples(text, tok, encoder_inputs, shapes={"sequence": (5,)})
    assert all(s["input_ids"].shape == (1, 5) for s in samples) and "truncated" in notes[0]
    samples, _ = text_samples(text, tok, encoder_inputs, max_positions=4)
    assert all(s["input_ids"].shape == (1, 4) for s in samples)
    with pytest.raises(UsageError, match="position limit is 4"):
        text_samples(text, tok, encoder_inputs, shapes={"input_ids": (1, 9)}, max_positions=4)


@pytest.mark.parametrize(
    "content,message",
    [(b"", "holds no text"), (b"\n  \n", "holds no text"), (b"ok\n\xff\xfe bad\n", "not UTF-8 \\(line 2")],
)
def test_empty_or_undecodable_text_is_refused_naming_the_file(tmp_path, encoder_inputs, content, message):
    text = tmp_path / "s.txt"
    text.write_bytes(content)
    tok = load_tokenizer(word_tokenizer(tmp_path / "tokenizer.json"))
    with pytest.raises(UsageError, match=message):
        text_samples(text, tok, encoder_inputs)


def test_text_cannot_feed_a_model_without_token_inputs(tmp_path, demo_paths):
    text = tmp_path / "s.txt"
    text.write_text("the cat\n")
    tok = load_tokenizer(word_tokenizer(tmp_path / "tokenizer.json"))
    with pytest.raises(UsageError, match="'x'|x cannot come from text"):
        text_samples(text, tok, graph_inputs(load_model(demo_paths["mlp"])))


def test_images_follow_the_preprocessor_config_and_run_on_the_cnn(tmp_path, demo_paths):
    root = image_folder(tmp_path / "cnn", demo_paths["cnn"])
    pics = write_images(tmp_path / "pics", n=6)
    folder = resolve_model_folder(root)
    spec = real_data(images=pics, folder=folder)
    samples, notes = spec.samples(graph_inputs(load_model(folder.model_file)))
    assert len(samples) == 6 and "32x32 NCHW" in notes[0]
    x = samples[0]["image"]
    assert x.shape == (1, 3, 32, 32) and x.dtype == np.float32
    # normalized as the config says: (pixel / 255 - 0.5) / 0.25 lies in [-2, 2]
    assert x.min() >= -2.0 - 1e-6 and x.max() <= 2.0 + 1e-6 and x.std() > 0.1
    assert spec.source.kind == "images" and len(spec.source.sha256) == 64
    assert load(str(folder.model_file)).run(None, samples[0])[0].shape == (1, 10)


def test_shortest_edge_and_center_crop_and_arguments_for_a_bare_cnn(tmp_path, demo_paths):
    pics = write_images(tmp_path / "pics", n=2, size=(80, 50))
    inputs = graph_inputs(load_model(demo_paths["cnn"]))
    prep = ImagePreprocess.from_config(
        {
            "size": {"shortest_edge": 32},
            "do_center_crop": True,
            "crop_size": {"height": 32, "width": 32},
            "image_mean": [0.5] * 3,
            "image_std": [0.5] * 3,
        }
    )
    samples, _ = image_samples(pics, prep, inputs)
    assert samples[0]["image"].shape == (1, 3, 32, 32)
    samples, _ = image_samples(pics, ImagePreprocess.from_args("32", "0.4,0.4,0.4", "0.2,0.2,0.2"), inputs)
    assert samples[1]["image"].shape == (1, 3, 32, 32)
    with pytest.raises(UsageError, match="takes 32x32 images, but the preprocessing .* makes 64x64"):
        image_samples(pics, ImagePreprocess.from_args("64"), inputs)
    with pytest.raises(UsageError, match="--image-size must be HxW"):
        ImagePreprocess.from_args("big")
    # an inf std calibrated on zeros, a nan mean reached ORT: both are refused before any image is read
    with pytest.raises(UsageError, match="image std must be finite numbers, got 0.2,inf,0.2"):
        ImagePreprocess.from_args("32", std="0.2,inf,0.2")
    with pytest.raises(UsageError, match="image mean must be finite numbers, got nan"):
        ImagePreprocess.from_args("32", mean="nan")
    with pytest.raises(UsageError, match="an image std of 0 would divide by zero"):
        ImagePreprocess.from_args("32", std="0")


def test_an_undecodable_image_is_refused_by_name_and_an_empty_folder_too(tmp_path, demo_paths):
    pics = write_images(tmp_path / "pics", n=2)
    (pics / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    inputs = graph_inputs(load_model(demo_paths["cnn"]))
    with pytest.raises(UsageError, match="Image '.*broken.jpg' cannot be decoded"):
        image_samples(pics, ImagePreprocess.from_args("32"), inputs)
    (tmp_path / "none").mkdir()
    with pytest.raises(UsageError, match="holds no .jpg, .png or .webp"):
        image_samples(tmp_path / "none", ImagePreprocess.from_args("32"), inputs)


def test_real_data_takes_the_tokenizer_and_limit_from_the_folder(tmp_path, demo_paths):
    root = sentence_folder(tmp_path / "m", demo_paths["encoder"])
    text = tmp_path / "s.txt"
    text.write_text("the cat\n")
    spec = real_data(text=text, folder=resolve_model_folder(root))
    assert spec.tokenizer == root / "tokenizer.json" and spec.max_positions == 512
    assert spec.source.describe(1) == {"source": "text", "samples": 1, "path": str(text), "sha256": spec.source.sha256}
    with pytest.raises(UsageError, match="needs a tokenizer"):
        real_data(text=text)
    with pytest.raises(UsageError, match="not both"):
        real_data(text=text, images=tmp_path)
    with pytest.raises(UsageError, match="needs to know how to preprocess"):
        real_data(images=tmp_path)


def test_text_at_its_own_length_is_cut_where_the_folder_cuts_it_and_a_shape_up_to_the_positions(tmp_path):
    """A sentence-transformers folder says ``max_seq_length`` 128 (its position limit is 512): ``text_model``
    and serving cut there, so a tune's text samples are cut there too; ``--shape`` may still ask up to 512."""
    from ortpilot.models.textfolder import MAX_POSITIONS, MAX_SEQ_LENGTH, text_folder

    folder = text_folder(tmp_path / "embed")
    text = tmp_path / "long.txt"
    text.write_text(" ".join(["word"] * 300) + "\nshort line\n")
    data = real_data(text=text, folder=folder)
    assert data is not None and (data.max_length, data.max_positions) == (MAX_SEQ_LENGTH, MAX_POSITIONS)
    inputs = graph_inputs(load_model(folder / "model.onnx"))
    samples, notes = data.samples(inputs)
    lengths = [s["input_ids"].shape[1] for s in samples]
    assert lengths[0] == MAX_SEQ_LENGTH and lengths[1] < 20  # the long line cut, the short one at its own
    assert "longer than 128 tokens and were truncated" in notes[0]
    padded, _ = data.samples(inputs, {"sequence": (256,)})
    assert {s["input_ids"].shape for s in padded} == {(1, 256)}


def test_a_dynamic_width_keeps_each_images_own_aspect_with_auto_and_is_warned_about_without(tmp_path, caplog):
    """An OCR recognizer's lines differ in width: ``--image-size 48xauto`` resizes each to height 48 at its own
    aspect (what the deployment sends); a fixed width squeezes them all, said as a warning."""
    import logging

    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 48, "width"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 48, "width"])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "rec", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    inputs = graph_inputs(model)
    onnx.checker.check_model(model)
    lines = tmp_path / "lines"
    for i, size in enumerate([(120, 24), (300, 24), (60, 30)]):
        write_images(lines / str(i), n=1, size=size)
    flat = tmp_path / "flat"
    flat.mkdir()
    for i, f in enumerate(sorted(lines.glob("*/*"))):
        f.rename(flat / f"line{i}{f.suffix}")
    samples, notes = image_samples(flat, ImagePreprocess.from_args("48xauto", "0.5", "0.5"), inputs)
    assert sorted(s["x"].shape[3] for s in samples) == [96, 240, 600]  # 120x24 -> 240x48, 300x24 -> 600x48
    assert "each at its own width (96-600 px)" in notes[0]
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        squeezed, _ = image_samples(flat, ImagePreprocess.from_args("48x320"), inputs)
    assert {s["x"].shape for s in squeezed} == {(1, 3, 48, 320)}
    assert "--image-size 48xauto keeps each one's own aspect" in caplog.text
    with pytest.raises(UsageError, match="--image-size must be HxW, N or Hxauto"):
        ImagePreprocess.from_args("autox48")
