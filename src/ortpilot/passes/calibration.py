"""Calibration data: read it, check it against the model, split off held-out samples.

Accepted: a folder of ``.npz`` files (keys = input names) or ``.npy`` files (``NAME.npy`` per
input, or any names for a one-input model); one ``.npz`` with stacked samples; a
``CalibrationDataReader`` object (or ``FILE.py:FACTORY`` on the command line); a list of samples
(dicts of input name -> array, from Python); text and images
(``ortpilot.data.TextData`` / ``ImageData``, what ``--calibration-text`` / ``--calibration-images``
become through ``ortpilot.data.real_data``). Without data, inputs are generated from the declared
shapes, with a loud warning: calibration on random inputs gives scales that fit random inputs,
and the accuracy gate then measures random inputs.

Arrays in files have a leading sample axis, read one of two ways (``_leading_axis``): one dim more
than the input is always a stack of samples; arrays of the input's own rank are split along their
first dim when the batch the model or ``--shape`` asks for does not take them whole (a static
batch of 1 and ``(96, 2048)`` is 96 samples, not a refusal), and are one sample when it does.
Where the batch is dynamic and no ``--shape`` fixes it, the file is read as samples of batch 1
(the batch ortpilot gives a batch dim everywhere else) and one warning says so and how to read it
as one batch instead; the reading is kept in ``gate_data`` / ``calibration_data`` (``reading``).

Every set carries its ``DataSource`` (kind, path, sha256), so each report can say what its gate
and its calibration ran on (``gate_data``, ``calibration_data``). ``CalibrationSet.split`` divides
the samples into calibration samples and held-out gate samples that never share a sample: a
quarter of them, spread evenly over the set, is held out (a file sorted by topic still gates on
every part of it), at most ``MAX_HELDOUT``; calibration keeps the rest, at most
``MAX_CALIBRATION`` of them, spread evenly.
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

from ortpilot.data import DataSource, ImageData, TextData, digest_files
from ortpilot.errors import InputError, UsageError
from ortpilot.graph.feeds import generate_samples, plan_feeds, read_npy, read_npz, validate_feeds
from ortpilot.graph.shapes import InputInfo, graph_inputs, is_length_dim

log = logging.getLogger("ortpilot")
DEFAULT_SYNTHETIC_SAMPLES = 8
# The gate runs every held-out sample through every candidate, so they are capped; but at 299, where a
# worst-sample verdict sees a sample that breaks 1 time in 100 (gate.result.SAMPLES_TO_SEE_RARE), so that
# the advice the report gives (give 4x that many samples) is one a user can follow.
MAX_HELDOUT = 299
MAX_CALIBRATION = 256  # calibrators keep every activation of every sample in memory
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
    data: DataSource | None = None  # where the samples came from (None: told by ``origin``)
    counts: tuple[int, int] | None = None  # (calibration, held-out) samples of the last ``split``
    reading: str = ""  # how a file's leading axis was read, where it was split into samples (``_leading_axis``)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def origin(self) -> DataSource:
        """The samples' ``DataSource``; a set built in code is described by its samples' digest."""
        if self.data is not None:
            return self.data
        return DataSource.of_samples(self.samples, "synthetic" if self.synthetic else "files")

    def split(
        self,
        holdout_fraction: float = 0.25,
        min_holdout: int = 1,
        *,
        max_heldout: int = MAX_HELDOUT,
        max_calibration: int = MAX_CALIBRATION,
    ) -> tuple[list[Sample], list[Sample]]:
        """(calibration, held-out): disjoint, deterministic, spread over the set (module docstring).

        Text and images need two samples at least (a UsageError naming the file otherwise); one
        sample of arrays is, as before, both sides (and a note says the gate saw it calibrate).
        """
        n = len(self.samples)
        if n <= 1:
            if self.origin.kind in ("text", "images"):
                raise UsageError(
                    f"'{self.origin.path}' holds {n} sample; calibration and the accuracy gate need two at "
                    "least (one to calibrate on, one held out to gate on), and more to mean anything."
                )
            self.notes.append("only one sample: the accuracy gate runs on the calibration sample itself")
            self.counts = (n, n)
            return list(self.samples), list(self.samples)
        held = min(max(min_holdout, round(n * holdout_fraction)), n - 1, max_heldout)
        chosen = set(spread(n, held))
        heldout = [s for i, s in enumerate(self.samples) if i in chosen]
        rest = [s for i, s in enumerate(self.samples) if i not in chosen]
        calib = [rest[i] for i in spread(len(rest), max_calibration)]
        unused = n - len(heldout) - len(calib)
        left = f", {unused} unused (at most {max_calibration} calibrate, {max_heldout} gate)" if unused else ""
        self.notes.append(
            f"{n} samples from {self.source}: {len(calib)} calibrate, {len(heldout)} held out for the gate{left}"
        )
        self.counts = (len(calib), len(heldout))
        return calib, heldout

    def gate_data(self) -> dict[str, Any]:
        """The ``gate_data`` record: the held-out side of the last ``split`` (every sample before one)."""
        return self.origin.describe(self.counts[1] if self.counts else len(self), len(self), self.reading)

    def calibration_data(self) -> dict[str, Any]:
        """The ``calibration_data`` record: the calibrating side of the last ``split``."""
        return self.origin.describe(self.counts[0] if self.counts else len(self), len(self), self.reading)

    def describe(self) -> str:
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in (self.samples[0].items() if self.samples else []))
        kind = "synthetic" if self.synthetic else "given"
        return f"{len(self)} {kind} sample(s) from {self.source}: {shapes}"


def spread(n: int, k: int) -> list[int]:
    """``k`` of the indices ``0..n-1``, evenly spaced (the middle of each stretch), ascending; all when k >= n."""
    if k >= n:
        return list(range(n))
    return [int((j + 0.5) * n / k) for j in range(k)]


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
    inputs = graph_inputs(model)  # once: the synthetic plan and every check below read them
    if source is None:
        return synthetic(model, shapes, synthetic_samples, inputs=inputs)
    if isinstance(source, CalibrationSet):
        return source
    if isinstance(source, (TextData, ImageData)):  # --calibration-text / --calibration-images
        samples, notes = source.samples(inputs, shapes)
        for note in notes:  # a truncation changes what the model sees: said loudly
            log.log(logging.WARNING if "truncated" in note else logging.INFO, "%s", note)
        data = _checked(samples, inputs, source.source.path or "", source.source)
        data.notes.extend(notes)
        return data
    if hasattr(source, "get_next"):
        return _checked(_drain(source), inputs, f"{type(source).__name__} reader")
    if isinstance(source, (list, tuple)) and all(isinstance(s, Mapping) for s in source):  # from Python
        return _checked([dict(s) for s in source], inputs, f"{len(source)} samples given in Python")
    text = str(source)
    if ".py:" in text:
        data = _checked(_drain(_reader_from_file(text, model)), inputs, text)
        data.data = DataSource.of_samples(data.samples, "files", text)
        return data
    path = Path(text)
    if not path.exists():
        raise InputError(
            f"Calibration data '{path}' does not exist. Give a folder of .npy/.npz files, one .npz "
            "with stacked samples, or FILE.py:FACTORY returning a CalibrationDataReader."
        )
    files = _FileReader(inputs, shapes or {})
    if path.is_dir():
        listed = sorted([*path.glob("*.npz"), *path.glob("*.npy")])
        return files.checked(_from_folder(path, files), str(path), _files(path, listed))
    if path.suffix == ".npz":
        return files.checked(files.unstack(_load_npz(path), str(path)), str(path), _files(path, [path]))
    if path.suffix == ".npy" and len(inputs) == 1:
        one = files.unstack({inputs[0].name: _load_npy(path)}, str(path))
        return files.checked(one, str(path), _files(path, [path]))
    raise InputError(f"Calibration data '{path}' is not a folder, an .npz, or (for a one-input model) an .npy file.")


def synthetic(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    n: int = DEFAULT_SYNTHETIC_SAMPLES,
    *,
    inputs: Sequence[InputInfo] | None = None,
) -> CalibrationSet:
    """``n`` generated samples, said loudly; ``inputs``: the model's ``graph_inputs``, if known."""
    plan = plan_feeds(model, shapes, inputs=inputs)
    message = (
        f"NO CALIBRATION DATA: calibrating and gating on {n} synthetic inputs ({plan.describe()}). Scales fit "
        "random data, so the accuracy measured here says little about real inputs. Pass --calibration-text "
        "FILE, --calibration-images DIR or --calibration DIR with real samples before trusting this model."
    )
    log.warning(message)
    warnings.warn(message, SyntheticCalibrationWarning, stacklevel=2)
    samples = generate_samples(model, n, plan=plan)
    return CalibrationSet(samples, "synthetic inputs", synthetic=True, notes=[message])  # origin: their digest


def _files(path: Path, files: Sequence[Path]) -> DataSource:
    return DataSource("files", str(path), digest_files(files))


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
    try:  # the user's code: what it raises is about their file, said as such, not a traceback of ortpilot's
        module_spec.loader.exec_module(module)
        factory = getattr(module, attr, None)
        if factory is None:
            raise InputError(
                f"'{file}' defines no '{attr}'. It must be a CalibrationDataReader class or a function returning one."
            )
        reader = factory() if callable(factory) and not hasattr(factory, "get_next") else factory
    except InputError:
        raise
    except Exception as exc:
        said = " ".join(str(exc).split())[:300]
        raise InputError(
            f"The calibration reader '{spec}' raised {type(exc).__name__}: {said}. Fix that file (run it alone with "
            "python to see where), or give the data as --calibration FILE.npz or a folder."
        ) from None
    if not hasattr(reader, "get_next"):
        raise InputError(f"'{spec}' did not give a CalibrationDataReader (an object with get_next()).")
    return reader


def _load_npy(path: Path) -> np.ndarray:
    return read_npy(path, "Calibration file")


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    return read_npz(path, "Calibration file")


def _from_folder(folder: Path, files: _FileReader) -> list[Sample]:
    npz = sorted(folder.glob("*.npz"))
    npy = sorted(folder.glob("*.npy"))
    if not npz and not npy:
        raise InputError(f"Calibration folder '{folder}' holds no .npy or .npz files.")
    inputs = files.inputs
    samples: list[Sample] = []
    for file in npz:
        samples.extend(files.unstack(_load_npz(file), str(file)))
    if npy:
        names = {i.name for i in inputs}
        by_name = {f.stem: f for f in npy}
        if len(inputs) == 1 and not set(by_name) <= names:
            for file in npy:  # one-input model: every .npy is a sample (or a stack of them)
                samples.extend(files.unstack({inputs[0].name: _load_npy(file)}, str(file)))
        else:
            unknown = sorted(set(by_name) - names)
            if unknown:
                raise InputError(
                    f"Calibration files {', '.join(f + '.npy' for f in unknown)} in '{folder}' match no "
                    f"model input; the inputs are {_describe(inputs)}. Name each file INPUT.npy."
                )
            samples.extend(files.unstack({k: _load_npy(v) for k, v in by_name.items()}, str(folder)))
    return samples


class _FileReader:
    """Arrays read from files into samples, each file's leading axis read as ``_leading_axis`` says; the
    readings it took are said once (a warning where the file could be read the other way too)."""

    def __init__(self, inputs: Sequence[InputInfo], shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.inputs = inputs
        self.shapes = shapes
        self.readings: list[str] = []  # one per distinct reading, for gate_data / calibration_data
        self.warned = False

    def unstack(self, arrays: Mapping[str, np.ndarray], where: str) -> list[Sample]:
        samples, axis = _unstack(arrays, self.inputs, where, self.shapes)
        if axis is not None:
            if axis.reading not in self.readings:
                self.readings.append(axis.reading)
            if axis.warning and not self.warned:  # said once, however many files read the same way
                log.warning("%s", axis.warning)
                self.warned = True
        return samples

    def checked(self, samples: list[Sample], where: str, data: DataSource) -> CalibrationSet:
        found = _checked(samples, self.inputs, where, data)
        found.reading = "; ".join(self.readings)
        if found.reading:
            found.notes.append(found.reading)
        return found


def _unstack(
    arrays: Mapping[str, np.ndarray],
    inputs: Sequence[InputInfo],
    where: str,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[list[Sample], _Axis | None]:
    """The samples in one file's arrays: N stacked samples when every array has one more dim than its input;
    else split along the first dim or whole, as ``_leading_axis`` reads it (with how it read it, None: whole)."""
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
        return [{k: np.ascontiguousarray(v[i]) for k, v in arrays.items()} for i in range(n)], None
    if any(stacked.values()):
        bad = [k for k, s in stacked.items() if s]
        raise InputError(
            f"Calibration data '{where}': input(s) {', '.join(bad)} have one dim more than the model "
            "expects while others do not; stack all inputs or none."
        )
    axis = _leading_axis(arrays, by_name, where, shapes or {})
    if axis is None:
        return [dict(arrays)], None
    n, size = axis.count, axis.batch
    return [{k: np.ascontiguousarray(v[i * size : (i + 1) * size]) for k, v in arrays.items()} for i in range(n)], axis


@dataclass(frozen=True)
class _Axis:
    """A file's arrays read as ``count`` samples of ``batch`` each along their first dim, and what to say about it."""

    count: int
    batch: int
    reading: str  # for gate_data / calibration_data
    warning: str = ""  # where the other reading was possible: which one was taken and how to force the other


_OTHER = "other"  # a named dynamic first dim that is no batch (a length): the array is one sample


def _asked_batch(info: InputInfo, shapes: Mapping[str, tuple[int, ...]]) -> int | str | None:
    """The batch ``info``'s first dim asks for: --shape for the input or its dim, else a static dim; ``_OTHER`` where
    it is a dynamic dim named as a length (a sample's own); None where it is any other dynamic dim nothing fixes
    (named as a batch, unnamed, or named as exporters name what they could not: ``unk__214``)."""
    first = info.dims[0]
    if shapes.get(info.name):
        return int(shapes[info.name][0])
    if isinstance(first, int) and first > 0:
        return first
    if isinstance(first, str) and len(shapes.get(first) or ()) == 1:
        return int(shapes[first][0])
    return _OTHER if isinstance(first, str) and is_length_dim(first) else None


def _leading_axis(
    arrays: Mapping[str, np.ndarray],
    by_name: Mapping[str, InputInfo],
    where: str,
    shapes: Mapping[str, tuple[int, ...]],
) -> _Axis | None:
    """How arrays of their inputs' own rank are read: None for one sample (their first dim is the batch the model
    or --shape asks for, or a dynamic length), else samples along the first dim (module docstring)."""
    infos = [by_name[k] for k in arrays]
    if any(len(i.dims) == 0 or arrays[i.name].ndim != len(i.dims) for i in infos):
        return None  # no shape to read it by, or a rank the checks below refuse with their own message
    firsts = {int(v.shape[0]) for v in arrays.values()}
    asked = [_asked_batch(i, shapes) for i in infos]
    if len(firsts) != 1 or _OTHER in asked:
        return None
    n = firsts.pop()
    known = {b for b in asked if isinstance(b, int)}
    if len(known) > 1:
        return None  # the inputs ask for different batches: the shape checks name it
    shown = ", ".join(f"{k} {list(v.shape)}" for k, v in arrays.items())
    if known:
        batch = known.pop()
        if n == batch:
            return None
        if n % batch:
            raise InputError(
                f"Calibration data '{where}' holds arrays ({shown}) whose first dim, {n}, is neither the batch "
                f"the model and --shape ask for ({batch}) nor a multiple of it. Give whole batches of {batch} "
                f"(read as samples of that batch), or stack the samples as (N, {batch}, ...), one dim more "
                "than the input."
            )
        source = "--shape's" if any(shapes.get(i.name) or shapes.get(str(i.dims[0])) for i in infos) else "the model's"
        reading = (
            f"{Path(where).name}: the first dim ({n}) read as {n // batch} sample{'s' * (n // batch != 1)} "
            f"of batch {batch} ({source} batch)"
        )
        return _Axis(n // batch, batch, reading)
    if n <= 1:
        return None  # one sample of batch 1 either way
    dims = {i.dims[0] for i in infos}
    name = next(iter(dims)) if len(dims) == 1 and isinstance(next(iter(dims)), str) else None
    whole = (
        f"--shape {name}={n}"
        if name
        else " ".join(f"--shape {i.name}={'x'.join(map(str, arrays[i.name].shape))}" for i in infos)
    )
    samples = (
        f"--shape {name}=1"
        if name
        else " ".join(f"--shape {i.name}={'x'.join(map(str, (1, *arrays[i.name].shape[1:])))}" for i in infos)
    )
    inputs = ", ".join(f"{i.name} {_dims(i.dims)}" for i in infos)
    reading = (
        f"{Path(where).name}: the first dim ({n}) read as {n} samples of batch 1; it could be one batch of {n} "
        f"({whole} reads it so)"
    )
    warning = (
        f"Calibration data '{where}' ({shown}) has the inputs' own rank, and their batch dim is dynamic "
        f"({inputs}) with no --shape fixing it: read as {n} samples of batch 1, its first dim taken as the "
        f"sample axis. To read it as one batch of {n} instead, pass {whole}, or save it as (N, batch, ...), one "
        f"dim more than the input; {samples} keeps this reading without this warning."
    )
    return _Axis(n, 1, reading, warning)


def _dims(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _checked(
    samples: list[Sample], inputs: Sequence[InputInfo], where: str, data: DataSource | None = None
) -> CalibrationSet:
    if not samples:
        raise InputError(f"Calibration data '{where}' holds no samples.")
    for i, sample in enumerate(samples):
        try:
            samples[i] = validate_feeds(inputs, sample)
        except InputError as exc:
            raise InputError(f"Calibration data '{where}', sample {i}: {exc}") from None
    return CalibrationSet(samples, where, data=data)


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
    "MAX_CALIBRATION",
    "MAX_HELDOUT",
    "CalibrationSet",
    "SyntheticCalibrationWarning",
    "load_calibration",
    "reader_for",
    "spread",
    "synthetic",
    "write_samples",
]
