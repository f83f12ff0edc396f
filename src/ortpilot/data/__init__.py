"""Real data in: model folders as users have them, and text and images turned into model feeds.

``folder`` picks the model file of an optimum / Hugging Face ``onnx/`` / onnxruntime-genai
folder and reads its configs; ``text`` tokenizes sentences with the folder's ``tokenizer.json``;
``images`` preprocesses pictures as its ``preprocessor_config.json`` says. ``TextData`` and
``ImageData`` are what a command's ``--calibration-text`` / ``--calibration-images`` become:
``passes.calibration.load_calibration`` turns them into checked samples, split into calibration
and held-out gate samples, and every report says where its gate data came from (``gate_data``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.data.folder import ModelFolder, Value, model_path_of, resolve_model_folder
from ortpilot.data.images import ImagePreprocess, image_files, image_samples
from ortpilot.data.text import load_tokenizer, read_lines, text_samples
from ortpilot.graph.shapes import InputInfo

SOURCES = ("text", "images", "files", "synthetic")


def digest_files(paths: Sequence[Path]) -> str:
    """sha256 over the files' names and bytes, in order: which data a gate saw, exactly."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@dataclass(frozen=True)
class DataSource:
    """Where samples came from: ``kind`` (text, images, files, synthetic), the path and its sha256."""

    kind: str
    path: str | None = None
    sha256: str | None = None

    def describe(self, samples: int) -> dict[str, Any]:
        """The ``gate_data`` / ``calibration_data`` record of reports and profiles."""
        return {"source": self.kind, "samples": samples, "path": self.path, "sha256": self.sha256}


@dataclass(frozen=True)
class TextData:
    """``--calibration-text FILE``: one sample per line, tokenized with ``tokenizer``."""

    path: Path
    tokenizer: Path
    max_positions: int | None = None

    @property
    def source(self) -> DataSource:
        return DataSource("text", str(self.path), digest_files([self.path]))

    def samples(
        self, inputs: Sequence[InputInfo], shapes: Mapping[str, tuple[int, ...]] | None = None
    ) -> tuple[list[dict[str, np.ndarray]], list[str]]:
        return text_samples(
            self.path, load_tokenizer(self.tokenizer), inputs, shapes=shapes, max_positions=self.max_positions
        )


@dataclass(frozen=True)
class ImageData:
    """``--calibration-images DIR``: every jpg/png/webp, preprocessed by ``preprocess``."""

    folder: Path
    preprocess: ImagePreprocess

    @property
    def source(self) -> DataSource:
        return DataSource("images", str(self.folder), digest_files(image_files(self.folder)))

    def samples(
        self, inputs: Sequence[InputInfo], shapes: Mapping[str, tuple[int, ...]] | None = None
    ) -> tuple[list[dict[str, np.ndarray]], list[str]]:
        return image_samples(self.folder, self.preprocess, inputs)


def real_data(
    *,
    text: str | os.PathLike | None = None,
    images: str | os.PathLike | None = None,
    folder: ModelFolder | None = None,
    tokenizer: str | os.PathLike | None = None,
    image_size: str | None = None,
    mean: str | None = None,
    std: str | None = None,
    layout: str = "NCHW",
) -> TextData | ImageData | None:
    """The data spec a command's ``--calibration-text`` / ``--calibration-images`` flags describe, with the
    tokenizer or preprocessing taken from the flags first, the model's folder second."""
    from ortpilot.errors import UsageError

    if text is not None and images is not None:
        raise UsageError("Give --calibration-text or --calibration-images, not both: one model reads one kind of data.")
    if text is not None:
        file = Path(text)
        if not file.is_file():
            raise UsageError(f"--calibration-text '{file}' is not a file (one sample per line, UTF-8).")
        tok = Path(tokenizer) if tokenizer else (folder.tokenizer_file if folder else None)
        if tok is None:
            raise UsageError(
                "--calibration-text needs a tokenizer: give the model as its folder (with tokenizer.json) "
                "or pass --tokenizer PATH/tokenizer.json."
            )
        limit = folder.get("max_positions") if folder else None
        return TextData(file, tok, limit)
    if images is not None:
        if image_size:
            prep = ImagePreprocess.from_args(image_size, mean, std, layout)
        elif folder is not None and folder.preprocessor is not None:
            prep = ImagePreprocess.from_config(folder.preprocessor, str(folder.preprocessor_file))
        else:
            raise UsageError(
                "--calibration-images needs to know how to preprocess: give the model as its folder (with "
                "preprocessor_config.json) or pass --image-size HxW (and --mean, --std, --layout)."
            )
        return ImageData(Path(images), prep)
    if any(v is not None for v in (tokenizer, image_size, mean, std)):
        raise UsageError(
            "--tokenizer, --image-size, --mean and --std shape --calibration-text / --calibration-images "
            "data; give one of those too."
        )
    return None


__all__ = [
    "SOURCES",
    "DataSource",
    "ImageData",
    "ImagePreprocess",
    "ModelFolder",
    "TextData",
    "Value",
    "digest_files",
    "image_samples",
    "load_tokenizer",
    "model_path_of",
    "read_lines",
    "real_data",
    "resolve_model_folder",
    "text_samples",
]
