"""Calibration data: read it, check it against the model, split off held-out samples.

Accepted: a folder of ``.npz`` files (one sample each, keys = input names) or ``.npy`` files
(``NAME.npy`` per input, or any names for a one-input model; an array with one more dim than
the input is a stack of samples); one ``.npz`` with stacked samples; a
``CalibrationDataReader`` object (or ``FILE.py:FACTORY`` on the command line). Without data,
inputs are generated from the declared shapes, with a loud warning: calibration on random
inputs gives scales that fit random inputs, and the accuracy gate then measures random inputs.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ortpilot.errors import InputError
from ortpilot.graph.feeds import make_feeds, plan_feeds, read_npz, validate_feeds
from ortpilot.graph.shapes import InputInfo, graph_inputs

log = logging.getLogger("ortpilot")
DEFAULT_SYNTHETIC_SAMPLES = 8
Sample = dict[str, np.ndarray]


class SyntheticCalibrationWarning(UserWarning):
    """Calibration runs on generated inputs: scales and the accuracy gate are not representative."""


@dataclass
class CalibrationSet:
    """Samples (one feed dict each), where they came from, and whether they are synthetic."""

    samples: list[Sample]
    source: str
    synthetic: bool = False
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.samples)

    def split(self, holdout_fraction: float = 0.25, min_holdout: int = 1) -> tuple[list[Sample], list[Sample]]:
        """(calibration, held-out). With one sample, both are that sample (and a note says so)."""
        n = len(self.samples)
        if n <= 1:
            self.notes.append("only one sample: the accuracy gate runs on the calibration sample itself")
            return list(self.samples), list(self.samples)
        held = max(min_holdout, round(n * holdout_fraction))
        held = min(held, n - 1)
        return list(self.samples[: n - held]), list(self.samples[n - held :])

    def describe(self) -> str:
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in (self.samples[0].items() if self.samples else []))
        kind = "synthetic" if self.synthetic else "given"
        return f"{len(self)} {kind} sample(s) from {self.source}: {shapes}"


def reader_for(samples: Sequence[Mapping[str, np.ndarray]]):
    """An ``onnxruntime.quantization.CalibrationDataReader`` over ``samples`` (rewindable)."""
    from onnxruntime.quantization import CalibrationDataReader

    class _ListReader(CalibrationDataReader):
        def __init__(self) -> None:
            self._items = [dict(s) for s in samples]
            self._pos = 0

        def get_next(self):
            if self._pos >= len(self._items):
                return None
            self._pos += 1
            return self._items[self._pos - 1]

        def rewind(self) -> None:
            self._pos = 0

        def __len__(self) -> int:
            return len(self._items)

    return _ListReader()


def load_calibration(
    source: Any,
    model: onnx.ModelProto,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    synthetic_samples: int = DEFAULT_SYNTHETIC_SAMPLES,
) -> CalibrationSet:
    """Read calibration data from ``source`` (see module docstring) and check it against ``model``."""
    inputs = graph_inputs(model)
    if source is None:
        return synthetic(model, shapes, synthetic_samples)
    if hasattr(source, "get_next"):
        return _checked(_drain(source), inputs, f"{type(source).__name__} reader")
    text = str(source)
    if ".py:" in text:
        return _checked(_drain(_reader_from_file(text, model)), inputs, text)
    path = Path(text)
    if not path.exists():
        raise InputError(
            f"Calibration data '{path}' does not exist. Give a folder of .npy/.npz files, one .npz "
            "with stacked samples, or FILE.py:FACTORY returning a CalibrationDataReader."
        )
    if path.is_dir():
        return _checked(_from_folder(path, inputs), inputs, str(path))
    if path.suffix == ".npz":
        return _checked(_unstack(_load_npz(path), inputs, str(path)), inputs, str(path))
    if path.suffix == ".npy" and len(inputs) == 1:
        return _checked(_unstack({inputs[0].name: _load_npy(path)}, inputs, str(path)), inputs, str(path))
    raise InputError(f"Calibration data '{path}' is not a folder, an .npz, or (for a one-input model) an .npy file.")


def synthetic(
    model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]] | None = None, n: int = DEFAULT_SYNTHETIC_SAMPLES
) -> CalibrationSet:
    plan = plan_feeds(model, shapes)
    message = (
        f"NO CALIBRATION DATA: calibrating and gating on {n} synthetic inputs ({plan.describe()}). Scales fit "
        "random data, so the accuracy measured here says little about real inputs. Pass --calibration DIR "
        "with real samples before trusting this model."
    )
    log.warning(message)
    warnings.warn(message, SyntheticCalibrationWarning, stacklevel=2)
    samples = [make_feeds(model, plan=plan, seed=i) for i in range(n)]
    return CalibrationSet(samples, "synthetic inputs", synthetic=True, notes=[message])


def _drain(reader: Any) -> list[Sample]:
    out = []
    while (item := reader.get_next()) is not None:
        out.append({k: np.asarray(v) for k, v in item.items()})
    if hasattr(reader, "rewind"):
        reader.rewind()
    return out


def _reader_from_file(spec: str, model: onnx.ModelProto) -> Any:
    file, _, attr = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location("ortpilot_user_calibration", file)
    if module_spec is None or module_spec.loader is None or not Path(file).is_file():
        raise InputError(f"Calibration reader file '{file}' does not exist or is not a Python file.")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    factory = getattr(module, attr, None)
    if factory is None:
        raise InputError(
            f"'{file}' defines no '{attr}'. It must be a CalibrationDataReader class or a function returning one."
        )
    reader = factory() if callable(factory) and not hasattr(factory, "get_next") else factory
    if not hasattr(reader, "get_next"):
        raise InputError(f"'{spec}' did not give a CalibrationDataReader (an object with get_next()).")
    return reader


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise InputError(f"Calibration file '{path}' is not a readable .npy array ({exc}).") from None


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    return read_npz(path, "Calibration file")


def _from_folder(folder: Path, inputs: Sequence[InputInfo]) -> list[Sample]:
    npz = sorted(folder.glob("*.npz"))
    npy = sorted(folder.glob("*.npy"))
    if not npz and not npy:
        raise InputError(f"Calibration folder '{folder}' holds no .npy or .npz files.")
    samples: list[Sample] = []
    for file in npz:
        samples.extend(_unstack(_load_npz(file), inputs, str(file)))
    if npy:
        names = {i.name for i in inputs}
        by_name = {f.stem: f for f in npy}
        if len(inputs) == 1 and not set(by_name) <= names:
            for file in npy:  # one-input model: every .npy is a sample (or a stack of them)
                samples.extend(_unstack({inputs[0].name: _load_npy(file)}, inputs, str(file)))
        else:
            unknown = sorted(set(by_name) - names)
            if unknown:
                raise InputError(
                    f"Calibration files {', '.join(f + '.npy' for f in unknown)} in '{folder}' match no "
                    f"model input; the inputs are {_describe(inputs)}. Name each file INPUT.npy."
                )
            samples.extend(_unstack({k: _load_npy(v) for k, v in by_name.items()}, inputs, str(folder)))
    return samples


def _unstack(arrays: Mapping[str, np.ndarray], inputs: Sequence[InputInfo], where: str) -> list[Sample]:
    """One sample, or N stacked samples when every array has one more dim than its input."""
    by_name = {i.name: i for i in inputs}
    unknown = [k for k in arrays if k not in by_name]
    missing = [n for n in by_name if n not in arrays]
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"names {', '.join(map(repr, unknown))} that are not model inputs")
        if missing:
            parts.append(f"no array for input(s) {', '.join(map(repr, missing))}")
        raise InputError(
            f"Calibration data '{where}' has {' and '.join(parts)}; the model's inputs are {_describe(inputs)}."
        )
    stacked = {k: bool(by_name[k].dims) and v.ndim == len(by_name[k].dims) + 1 for k, v in arrays.items()}
    if all(stacked.values()):
        counts = {k: v.shape[0] for k, v in arrays.items()}
        if len(set(counts.values())) != 1:
            raise InputError(f"Calibration data '{where}' stacks different numbers of samples per input: {counts}.")
        n = next(iter(counts.values()))
        return [{k: np.ascontiguousarray(v[i]) for k, v in arrays.items()} for i in range(n)]
    if any(stacked.values()):
        bad = [k for k, s in stacked.items() if s]
        raise InputError(
            f"Calibration data '{where}': input(s) {', '.join(bad)} have one dim more than the model "
            "expects while others do not; stack all inputs or none."
        )
    return [dict(arrays)]


def _checked(samples: list[Sample], inputs: Sequence[InputInfo], where: str) -> CalibrationSet:
    if not samples:
        raise InputError(f"Calibration data '{where}' holds no samples.")
    for i, sample in enumerate(samples):
        try:
            samples[i] = validate_feeds(inputs, sample)
        except InputError as exc:
            raise InputError(f"Calibration data '{where}', sample {i}: {exc}") from None
    return CalibrationSet(samples, where)


def _describe(inputs: Sequence[InputInfo]) -> str:
    return ", ".join(f"{i.name} {np.dtype(i.dtype).name}{list(i.dims)}" for i in inputs)


def write_samples(samples: Sequence[Mapping[str, np.ndarray]], folder: str | Path) -> Path:
    """Write samples as ``sample_000.npz``... (the folder format ``load_calibration`` reads)."""
    from ortpilot.artifacts.atomic import atomic_open

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for i, sample in enumerate(samples):
        with atomic_open(out / f"sample_{i:03d}.npz") as fh:
            np.savez(fh, **sample)
    return out


__all__ = [
    "CalibrationSet",
    "SyntheticCalibrationWarning",
    "load_calibration",
    "reader_for",
    "synthetic",
    "write_samples",
]
