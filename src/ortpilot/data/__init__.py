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

from ortpilot.data.folder import ModelFolder, Value, folder_of, model_path_of, resolve_model_folder
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


def digest_samples(samples: Sequence[Mapping[str, np.ndarray]]) -> str:
    """sha256 over samples' names, dtypes, shapes and bytes: data with no file of its own (generated
    inputs, a reader object) is still named exactly."""
    digest = hashlib.sha256()
    for sample in samples:
        for name in sorted(sample):
            array = np.ascontiguousarray(sample[name])
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class DataSource:
    """Where samples came from: ``kind`` (text, images, files, synthetic), the path and its sha256."""

    kind: str
    path: str | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in SOURCES:
            raise ValueError(f"data source kind {self.kind!r} is not one of {', '.join(SOURCES)}")

    @classmethod
    def of_samples(
        cls, samples: Sequence[Mapping[str, np.ndarray]], kind: str = "synthetic", path: str | None = None
    ) -> DataSource:
        """Samples with no file of their own (generated inputs, a reader, feeds given in code), named
        by their digest: ``graph.feeds.generate_samples`` makes the synthetic ones."""
        return cls(kind, path, digest_samples(samples))

    @property
    def real(self) -> bool:
        return self.kind != "synthetic"

    def describe(self, samples: int, of: int | None = None, reading: str = "") -> dict[str, Any]:
        """The ``gate_data`` / ``calibration_data`` record of reports and profiles: ``samples`` used,
        ``of`` the ``total`` the source holds (the rest went to the other side of the split), and
        ``reading``: how a file's leading axis was split into samples, where it was."""
        doc: dict[str, Any] = {"source": self.kind, "samples": samples, "path": self.path, "sha256": self.sha256}
        if of is not None:
            doc["total"] = of
        if reading:
            doc["reading"] = reading
        return doc


def samples_phrase(data: Mapping[str, Any]) -> str:
    """How a report names a ``gate_data`` / ``calibration_data`` record: ``5 of 20 text samples from s.txt``,
    ``1 sample from calib.npz`` (files), ``4 synthetic samples``; the path, the digest and the reading the
    caller adds as it needs them."""
    n, total = int(data.get("samples") or 0), data.get("total")
    kind = {"text": "text ", "images": "image ", "synthetic": "synthetic "}.get(str(data.get("source")), "")
    if total is not None and total != n:
        return f"{n} of {total} {kind}samples"
    return f"{n} {kind}sample{'s' * (n != 1)}"


def gate_phrase(gate_data: Mapping[str, Any] | None) -> str:
    """How a headline says what a gate ran on: ``gated on 5 real samples (text, s.txt)``."""
    if not gate_data:
        return ""
    n = gate_data.get("samples", 0)
    if gate_data.get("source") == "synthetic":
        return f"gated on {n} synthetic input{'s' * (n != 1)} (not real data)"
    where = Path(str(gate_data.get("path") or "")).name
    return f"gated on {n} real sample{'s' * (n != 1)} ({gate_data.get('source')}{', ' + where if where else ''})"


@dataclass(frozen=True)
class TextData:
    """``--calibration-text FILE``: one sample per line, tokenized with ``tokenizer``."""

    path: Path
    tokenizer: Path
    max_positions: int | None = None  # the model's position limit: no --shape beyond it
    max_length: int | None = None  # where a deployment cuts a text (the folder's max_seq_length): lines at their
    # own length are cut there, as text_model and serving cut them

    @property
    def source(self) -> DataSource:
        return DataSource("text", str(self.path), digest_files([self.path]))

    def samples(
        self, inputs: Sequence[InputInfo], shapes: Mapping[str, tuple[int, ...]] | None = None
    ) -> tuple[list[dict[str, np.ndarray]], list[str]]:
        return text_samples(
            self.path,
            load_tokenizer(self.tokenizer),
            inputs,
            shapes=shapes,
            max_positions=self.max_positions,
            max_length=self.max_length,
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
    folder: ModelFolder | str | os.PathLike | None = None,
    tokenizer: str | os.PathLike | None = None,
    image_size: str | None = None,
    mean: str | None = None,
    std: str | None = None,
    layout: str = "NCHW",
    text_flag: str = "--calibration-text",
) -> TextData | ImageData | None:
    """The data spec a command's ``--calibration-text`` / ``--calibration-images`` flags describe, with the
    tokenizer or preprocessing taken from the flags first, the model's folder second (``folder``: a
    ``ModelFolder`` or the folder's path; a model file's path is no folder and gives nothing). ``text_flag``:
    the flag a message names for ``text`` (``--workload`` reads its text lines here too)."""
    from ortpilot.errors import UsageError

    if folder is not None and not isinstance(folder, ModelFolder):
        folder = resolve_model_folder(folder) if Path(folder).is_dir() else None
    if text is not None and images is not None:
        raise UsageError("Give --calibration-text or --calibration-images, not both: one model reads one kind of data.")
    if text is not None:
        file = Path(text)
        if not file.is_file():
            raise UsageError(f"{text_flag} '{file}' is not a file (one sample per line, UTF-8).")
        tok = Path(tokenizer) if tokenizer else (folder.tokenizer_file if folder else None)
        if tok is None:
            where = f"the model folder '{folder.root}' has no tokenizer.json" if folder else "the model is a file"
            raise UsageError(
                f"{text_flag} '{file}' needs a tokenizer, and {where}: give the model as its folder "
                "(with tokenizer.json) or pass --tokenizer PATH/tokenizer.json."
            )
        from ortpilot.data.texttask import text_length_limit  # a deployment cuts texts there, so the samples too

        if folder is None:
            return TextData(file, tok)
        return TextData(file, tok, folder.get("max_positions"), text_length_limit(folder))
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
    "digest_samples",
    "folder_of",
    "gate_phrase",
    "image_samples",
    "load_tokenizer",
    "model_path_of",
    "read_lines",
    "real_data",
    "resolve_model_folder",
    "text_samples",
]
