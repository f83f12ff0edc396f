"""Model folders built in code, as users have them (optimum export, Hugging Face onnx/, genai), for the tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

WORDS = [
    "the",
    "a",
    "an",
    "is",
    "was",
    "runs",
    "model",
    "fast",
    "slow",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "onnx",
    "runtime",
    "quantization",
    "sentence",
    "embedding",
    "vector",
    "meaning",
    "rain",
    "day",
    "match",
    "week",
    "report",
    "friday",
    "patient",
    "dose",
    "market",
    "monday",
    "password",
    "email",
    "recipe",
    "flour",
    "egg",
    "salt",
    "graph",
    "fuse",
    "attention",
    "layer",
    "violin",
    "concert",
    "people",
    "committee",
    "budget",
    "majority",
    "cats",
    "sleep",
    "night",
    "hunt",
    "train",
    "station",
    "nearest",
    "where",
    "how",
    "do",
    "i",
    "reset",
    "my",
    "if",
    "no",
    "longer",
    "have",
    "access",
    "to",
]
SENTENCES = [
    "the cat sat on the mat",
    "a dog runs fast",
    "onnx runtime runs the model",
    "quantization is fast",
    "the sentence embedding is a vector",
    "rain all day and the match was on monday",
    "the patient was given a dose",
    "where is the nearest train station",
    "how do i reset my password",
    "the recipe needs flour egg and salt",
    "graph layer fuse attention",
    "the violin concert had people",
    "the committee budget majority",
    "cats sleep at night and hunt",
    "the market was slow on monday",
    "a report before friday",
    "the model runs on the onnx runtime",
    "the dog sat on a mat",
    "meaning of a sentence vector",
    "the cat runs",
]


def word_tokenizer(path: Path, words=WORDS) -> Path:
    """A WordLevel tokenizer.json ([CLS] text [SEP], type ids, [PAD] padding) made with ``tokenizers``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *dict.fromkeys(words)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def sentence_folder(root: Path, encoder: Path, layout: str = "optimum", **config) -> Path:
    """A sentence-transformers style folder around the demo encoder (hidden 128, 4 heads)."""
    root.mkdir(parents=True, exist_ok=True)
    target = {
        "optimum": root / "model.onnx",
        "hf-onnx": root / "onnx" / "model.onnx",
        "bare": root / "model.onnx",
        "genai": root / "encoder.onnx",
    }[layout]
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(encoder, target)
    if layout == "bare":
        return root
    cfg = {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "num_attention_heads": 4,
        "hidden_size": 128,
        "max_position_embeddings": 512,
        **config,
    }
    (root / "config.json").write_text(json.dumps(cfg))
    word_tokenizer(root / "tokenizer.json")
    (root / "1_Pooling").mkdir(exist_ok=True)
    (root / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 128, "pooling_mode_mean_tokens": True})
    )
    if layout == "genai":
        (root / "genai_config.json").write_text(
            json.dumps(
                {
                    "model": {
                        "type": "bert",
                        "context_length": 256,
                        "decoder": {"filename": "encoder.onnx", "num_attention_heads": 4, "hidden_size": 128},
                    }
                }
            )
        )
    return root


def write_images(folder: Path, n: int = 6, size: tuple[int, int] = (48, 40), seed: int = 0) -> Path:
    """``n`` small RGB pictures (gradients and blocks, not noise) as png, jpg and webp."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w, h = size
    for i in range(n):
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * 255 / w, yy * 255 / h, np.full((h, w), 40 * i % 255)], axis=-1)
        x0, y0 = rng.integers(0, w // 2), rng.integers(0, h // 2)
        base[y0 : y0 + h // 3, x0 : x0 + w // 3] = rng.integers(0, 255, 3)
        ext = ("png", "jpg", "webp")[i % 3]
        Image.fromarray(base.astype(np.uint8)).save(folder / f"img{i}.{ext}")
    return folder


def image_folder(root: Path, cnn: Path, **config) -> Path:
    """The demo CNN (image [batch, 3, 32, 32]) with a preprocessor_config.json, as a Hugging Face folder."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(cnn, root / "model.onnx")
    cfg = {
        "do_resize": True,
        "size": {"height": 32, "width": 32},
        "resample": 2,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.25, 0.25, 0.25],
        **config,
    }
    (root / "preprocessor_config.json").write_text(json.dumps(cfg))
    (root / "config.json").write_text(
        json.dumps(
            {
                "model_type": "resnet",
                "architectures": ["ResNetForImageClassification"],
                "id2label": {str(i): f"class{i}" for i in range(10)},
            }
        )
    )
    return root
