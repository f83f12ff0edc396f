"""Images in, model feeds out: a folder of jpg/png/webp files, preprocessed as the model expects.

How an image becomes a tensor is the model's contract, not a guess: a folder's
``preprocessor_config.json`` (Hugging Face image processors: ``do_resize``/``size``,
``resample``, ``do_center_crop``/``crop_size``, ``do_rescale``/``rescale_factor``,
``do_normalize``/``image_mean``/``image_std``) says it, or, for a CNN exported by hand, the
caller does (``--image-size``, ``--mean``, ``--std``, ``--layout NCHW|NHWC``). Images are
decoded with Pillow, converted to RGB, resized, cropped, rescaled and normalized in float32,
and laid out as one batch-1 sample each. A file that does not decode is refused by name.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.errors import UsageError
from ortpilot.graph.shapes import InputInfo

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
MAX_IMAGES = 10_000
# PIL.Image.Resampling values, as Hugging Face configs store them.
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


@dataclass(frozen=True)
class ImagePreprocess:
    """How one image becomes one input tensor."""

    height: int
    width: int  # 0: each image's own aspect at ``height`` (``--image-size 48xauto``: a text line's natural width)
    shortest_edge: int | None = None  # resize so the short side is this long (then crop to height x width)
    crop: bool = False
    rescale: float = 1 / 255
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    layout: str = "NCHW"
    resample: int = 2  # bilinear
    source: str = "arguments"

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": [self.height, self.width],
            "shortest_edge": self.shortest_edge,
            "center_crop": self.crop,
            "rescale": self.rescale,
            "mean": list(self.mean),
            "std": list(self.std),
            "layout": self.layout,
            "resample": RESAMPLE_NAMES.get(self.resample, self.resample),
            "source": self.source,
        }

    @classmethod
    def from_config(cls, doc: Mapping[str, Any], source: str = "preprocessor_config.json") -> ImagePreprocess:
        """From a Hugging Face ``preprocessor_config.json``."""

        def hw(value: Any, what: str) -> tuple[int, int] | None:
            if value is None:
                return None
            if isinstance(value, int):
                return value, value
            if isinstance(value, Mapping) and {"height", "width"} <= set(value):
                return int(value["height"]), int(value["width"])
            if isinstance(value, Mapping) and "shortest_edge" in value:
                return None
            if isinstance(value, (list, tuple)) and len(value) == 2:
                return int(value[0]), int(value[1])
            raise UsageError(
                f"{source}: {what} {value!r} is not a size this reader knows (an int, "
                "{'height', 'width'} or {'shortest_edge'})."
            )

        size = doc.get("size")
        shortest = int(size["shortest_edge"]) if isinstance(size, Mapping) and "shortest_edge" in size else None
        resized = hw(size, "size") if doc.get("do_resize", True) else None
        crop = hw(doc.get("crop_size"), "crop_size") if doc.get("do_center_crop") else None
        final = crop or resized or ((shortest, shortest) if shortest else None)
        if final is None:
            raise UsageError(f"{source} gives no image size (size / crop_size); pass --image-size.")
        normalize = doc.get("do_normalize", True)
        mean = tuple(float(v) for v in doc.get("image_mean") or ()) if normalize else ()
        std = tuple(float(v) for v in doc.get("image_std") or ()) if normalize else ()
        rescale = float(doc.get("rescale_factor", 1 / 255)) if doc.get("do_rescale", True) else 1.0
        return cls(
            final[0],
            final[1],
            shortest if not resized else None,
            crop is not None,
            rescale,
            mean,
            std,
            "NCHW",
            int(doc.get("resample", 2)),
            source,
        )

    @classmethod
    def from_args(
        cls, size: str, mean: str | None = None, std: str | None = None, layout: str = "NCHW", rescale: float = 1 / 255
    ) -> ImagePreprocess:
        """From ``--image-size HxW|N|Hxauto``, ``--mean a,b,c``, ``--std a,b,c``, ``--layout``. ``Hxauto``: each
        image resized to height H at its own aspect (width 0 here), for a model whose width is dynamic."""
        try:
            parts = [0 if p == AUTO else int(p) for p in str(size).lower().split("x")]
        except ValueError:
            raise UsageError(f"--image-size must be HxW, N or Hxauto (pixels), got {size!r}.") from None
        if len(parts) == 1:
            parts *= 2
        auto = len(parts) == 2 and parts[1] == 0 and str(size).lower().endswith(AUTO)
        if len(parts) != 2 or parts[0] <= 0 or (parts[1] <= 0 and not auto) or max(parts) > MAX_SIDE:
            raise UsageError(f"--image-size must be HxW, N or Hxauto with sides in 1..{MAX_SIDE}, got {size!r}.")
        if layout.upper() not in ("NCHW", "NHWC"):
            raise UsageError(f"--layout must be NCHW or NHWC, got {layout!r}.")
        return cls(
            parts[0],
            parts[1],
            None,
            False,
            rescale,
            _floats(mean, "--mean"),
            _floats(std, "--std"),
            layout.upper(),
            2,
            "arguments",
        )

    def __post_init__(self) -> None:
        for name, values in (("mean", self.mean), ("std", self.std)):
            if values and len(values) not in (1, 3):
                raise UsageError(f"{self.source}: image {name} has {len(values)} values; give 1 or 3 (RGB).")
        for name, values in (("mean", self.mean), ("std", self.std), ("rescale", (self.rescale,))):
            if not all(math.isfinite(v) for v in values):  # inf std calibrated on zeros, nan mean blamed ORT
                shown = ",".join(f"{v:g}" for v in values)
                raise UsageError(f"{self.source}: image {name} must be finite numbers, got {shown}.")
        if any(v == 0 for v in self.std):
            raise UsageError(f"{self.source}: an image std of 0 would divide by zero.")


AUTO = "auto"  # --image-size Hxauto: each image's own width at height H
MAX_SIDE = 16384


def _floats(text: str | None, option: str) -> tuple[float, ...]:
    if not text:
        return ()
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"{option} must be comma-separated numbers, e.g. 0.485,0.456,0.406; got {text!r}.") from None


def image_files(folder: str | os.PathLike) -> list[Path]:
    """The folder's image files (jpg, png, webp), sorted; none is a UsageError."""
    p = Path(folder)
    if not p.is_dir():
        raise UsageError(f"--calibration-images '{p}' is not a folder of images.")
    files = sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())
    if not files:
        raise UsageError(f"--calibration-images '{p}' holds no .jpg, .png or .webp file.")
    if len(files) > MAX_IMAGES:
        raise UsageError(f"--calibration-images '{p}' holds {len(files)} images; {MAX_IMAGES} at most are read.")
    return files


def image_input(inputs: Sequence[InputInfo]) -> InputInfo:
    """The one float input of rank 4 an image fills; anything else is a UsageError."""
    images = [i for i in inputs if len(i.dims) == 4 and np.issubdtype(np.dtype(i.dtype), np.floating)]
    others = [i.name for i in inputs if i not in images]
    if len(images) != 1 or others:
        raise UsageError(
            f"Image samples fill one float input of rank 4 (N,C,H,W or N,H,W,C); this model takes "
            f"{', '.join(f'{i.name}{list(i.dims)}' for i in inputs)}. Give --calibration with arrays instead."
        )
    return images[0]


def load_image(path: Path, prep: ImagePreprocess) -> np.ndarray:
    """One image as float32 HxWx3, resized, cropped, rescaled and normalized."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.load()
            rgb = img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise UsageError(f"Image '{path}' cannot be decoded ({exc}). Remove it from the folder or fix it.") from None
    if prep.shortest_edge:
        w, h = rgb.size
        scale = prep.shortest_edge / min(w, h)
        rgb = rgb.resize((max(1, round(w * scale)), max(1, round(h * scale))), resample=prep.resample)
    elif not prep.width:  # its own aspect at the height asked for: a text line keeps its width
        w, h = rgb.size
        rgb = rgb.resize((min(MAX_SIDE, max(1, round(w * prep.height / h))), prep.height), resample=prep.resample)
    elif not prep.crop:
        rgb = rgb.resize((prep.width, prep.height), resample=prep.resample)
    if prep.crop or prep.shortest_edge:
        w, h = rgb.size
        left, top = max(0, (w - prep.width) // 2), max(0, (h - prep.height) // 2)
        rgb = rgb.crop((left, top, left + prep.width, top + prep.height))
    array = np.asarray(rgb, dtype=np.float32) * np.float32(prep.rescale)
    if prep.mean:
        array = array - np.asarray(prep.mean, np.float32)
    if prep.std:
        array = array / np.asarray(prep.std, np.float32)
    return array


def image_samples(
    folder: str | os.PathLike, prep: ImagePreprocess, inputs: Sequence[InputInfo]
) -> tuple[list[dict[str, np.ndarray]], list[str]]:
    """(samples, notes): each image of ``folder`` as one batch-1 feed of the model's image input."""
    info = image_input(inputs)
    layout = prep.layout
    spatial = info.dims[2:4] if layout == "NCHW" else info.dims[1:3]
    channels = info.dims[1] if layout == "NCHW" else info.dims[3]
    if isinstance(channels, int) and channels not in (-1, 0, 3):
        raise UsageError(
            f"Input '{info.name}' {list(info.dims)} has {channels} channels in {layout} layout; images "
            "give 3 (RGB). Pass --layout NHWC if the channels come last."
        )
    wanted = (prep.height, prep.width or "auto")
    fixed = [isinstance(d, int) and d > 0 for d in spatial]
    if (fixed[0] and spatial[0] != prep.height) or (fixed[1] and spatial[1] != wanted[1]):
        raise UsageError(
            f"Input '{info.name}' {list(info.dims)} ({layout}) takes {spatial[0]}x{spatial[1]} images, but the "
            f"preprocessing ({prep.source}) makes {wanted[0]}x{wanted[1]}: fix --image-size (or --layout) or the config."
        )
    dtype = np.dtype(info.dtype)
    samples = []
    for path in image_files(folder):
        hwc = load_image(path, prep)
        tensor = hwc.transpose(2, 0, 1) if layout == "NCHW" else hwc
        samples.append({info.name: np.ascontiguousarray(tensor[None].astype(dtype))})
    if prep.width:
        size = f"{prep.height}x{prep.width}"
    else:
        widths = sorted(int(s[info.name].shape[3 if layout == "NCHW" else 2]) for s in samples)
        size = f"height {prep.height}, each at its own width ({widths[0]}-{widths[-1]} px)"
    notes = [f"{len(samples)} image{'s' * (len(samples) != 1)} preprocessed from {prep.source}: {size} {layout}"]
    if prep.width and not fixed[1] and not prep.crop:  # said loudly: it changes what the model is tuned on
        logging.getLogger("ortpilot").warning(
            "Input '%s' has a dynamic width ('%s'), and every image was resized to %d px wide: --image-size %dxauto "
            "keeps each one's own aspect, the width a deployment sends (a text line's length).",
            info.name,
            spatial[1],
            prep.width,
            prep.height,
        )
    return samples, notes


__all__ = ["IMAGE_SUFFIXES", "ImagePreprocess", "image_files", "image_input", "image_samples", "load_image"]
