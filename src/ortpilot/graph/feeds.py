"""Synthetic inputs that respect the graph, and validation of user feeds.

Random int64 token ids index past an embedding table and crash the run; random masks turn
attention off. So generated values follow the graph: integer inputs that index a ``Gather``
on an initializer stay below its row count, masks are ones, type ids zeros, positions count up,
lengths equal their sequence.
"""

from __future__ import annotations

import math
import re
import warnings
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from ortpilot.errors import InputError
from ortpilot.graph.shapes import InputInfo, graph_inputs, resolve_input_shapes

_MASK = re.compile(r"mask", re.I)
_TYPE_IDS = re.compile(r"(token_?type|segment)", re.I)
_POSITION = re.compile(r"position", re.I)
_LENGTH = re.compile(r"(length|lens?$|seqlens)", re.I)
_SAMPLE_RATE = re.compile(r"^(sr|sample_?rate|sampling_?rate)$", re.I)
# Element types numpy can hold (strings and others are refused later, by _value_for).
_SIZED = {t for t in range(1, 17) if t not in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED)}
# Pass-through ops between an input and the Gather that consumes it as indices.
_TRANSPARENT = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Identity", "Flatten"}


class NaNInputWarning(UserWarning):
    """A feed holds NaN or Inf values: legal, but usually a bug upstream."""


@dataclass(frozen=True)
class FeedPlan:
    """The shapes chosen for generated inputs, and the dims they came from (for printing).

    ``inputs``: the model's ``graph_inputs`` the plan was made from, so that the feeds made with it
    do not walk the graph again (empty: a plan built by hand; ``make_feeds`` looks them up)."""

    shapes: dict[str, tuple[int, ...]]
    dim_values: dict[str, int]
    index_bounds: dict[str, int]
    inputs: tuple[InputInfo, ...] = field(default=(), compare=False, repr=False)

    def describe(self) -> str:
        return ", ".join(f"{n}={'x'.join(map(str, s)) or 'scalar'}" for n, s in self.shapes.items())


def embedding_bounds(model: onnx.ModelProto, inputs: Sequence[InputInfo] | None = None) -> dict[str, int]:
    """Input name -> row count of the initializer table it indexes through Gather.

    ``inputs``: the model's ``graph_inputs`` when the caller has them already."""
    inits = {t.name: t for t in model.graph.initializer}
    consts = {}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            consts[node.output[0]] = node.attribute[0].t
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    bounds: dict[str, int] = {}
    for info in graph_inputs(model) if inputs is None else inputs:
        frontier, seen = [info.name], set()
        while frontier:
            tensor = frontier.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            for node in consumers.get(tensor, []):
                if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == tensor:
                    table = inits.get(node.input[0]) or consts.get(node.input[0])
                    if table is not None and table.dims:
                        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                        rows = int(table.dims[axis])
                        bounds[info.name] = min(bounds.get(info.name, rows), rows)
                elif node.op_type in _TRANSPARENT and node.input and node.input[0] == tensor:
                    frontier.extend(node.output)
    return bounds


def plan_feeds(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    inputs: Sequence[InputInfo] | None = None,
) -> FeedPlan:
    """The shapes and index bounds of generated inputs; ``inputs``: the model's ``graph_inputs``, if known."""
    found = tuple(graph_inputs(model) if inputs is None else inputs)
    concrete, dims = resolve_input_shapes(found, shapes)
    return FeedPlan(concrete, dims, embedding_bounds(model, found), found)


def make_feeds(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    seed: int = 0,
    plan: FeedPlan | None = None,
) -> dict[str, np.ndarray]:
    """Generate one set of inputs for the model (deterministic for a seed)."""
    plan = plan or plan_feeds(model, shapes)
    infos = _input_infos(model, plan)
    check_memory(plan, infos)  # before anything is allocated
    return _generated(plan, infos, seed)


def _generated(plan: FeedPlan, infos: Mapping[str, InputInfo], seed: int) -> dict[str, np.ndarray]:
    """One input set of ``plan`` for ``seed``, its memory already checked."""
    rng = np.random.default_rng(seed)
    return {name: _value_for(infos[name], shape, plan, rng) for name, shape in plan.shapes.items()}


def _input_infos(model: onnx.ModelProto, plan: FeedPlan) -> dict[str, InputInfo]:
    """The model's inputs by name, as the plan read them (or read now)."""
    return {i.name: i for i in plan.inputs or graph_inputs(model)}


def generate_samples(
    model: onnx.ModelProto,
    count: int,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    plan: FeedPlan | None = None,
    first_seed: int = 0,
) -> list[dict[str, np.ndarray]]:
    """``count`` generated input sets, seeds ``first_seed``, ``first_seed + 1``, ... (synthetic samples:
    calibration and gate data when none is given; ``data.DataSource.of_samples`` names them)."""
    plan = plan or plan_feeds(model, shapes)
    infos = _input_infos(model, plan)
    check_memory(plan, infos, count)  # all of them are kept: checked once for all
    return [_generated(plan, infos, first_seed + i) for i in range(count)]


def check_memory(plan: FeedPlan, infos: Mapping[str, InputInfo], count: int = 1) -> None:
    """Refuse inputs that cannot fit before allocating them: exit 2 naming the input, its shape and bytes.

    ORT needs at least as much again for outputs and intermediates, so inputs above half of what
    is available (MemAvailable, or the cgroup's ``memory.max`` less its usage) cannot run; ``count``
    input sets held at once (generated samples) count ``count`` times.
    """
    sizes = {
        name: math.prod(shape) * np.dtype(infos[name].dtype).itemsize
        for name, shape in plan.shapes.items()
        if name in infos and infos[name].elem_type in _SIZED
    }
    total = sum(sizes.values()) * count
    available = available_memory()
    if available is None or total <= available // 2:
        return
    name = max(sizes, key=sizes.get)
    sets = f"The {count:,} generated input sets" if count > 1 else "The generated inputs"
    fewer = "Ask for fewer samples (--samples N) or choose" if count > 1 else "Choose"
    raise InputError(
        f"{sets} would need {total:,} bytes ({total / 2**30:.1f} GiB), the largest input "
        f"'{name}' with shape {list(plan.shapes[name])} {sizes[name]:,} bytes a set; with ORT's outputs "
        f"and intermediates that is more than the {available:,} bytes ({available / 2**30:.1f} GiB) "
        f"of memory available. {fewer} smaller dims with --shape NAME=DIMS."
    )


def available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable, capped by the cgroup v2 (or v1) memory limit."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            if limit.isdigit() and int(limit) < 2**60:
                found.append(max(0, int(limit) - int(Path(usage_file).read_text().strip())))
                break
        except (OSError, ValueError):
            continue
    return min(found) if found else None


def _value_for(info: InputInfo, shape: tuple[int, ...], plan: FeedPlan, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(info.dtype)
    name = info.name
    if dtype == np.bool_:
        return np.ones(shape, dtype=bool) if _MASK.search(name) else rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.floating):
        if _MASK.search(name):
            return np.ones(shape, dtype=dtype)
        return rng.standard_normal(shape).astype(dtype)
    if not np.issubdtype(dtype, np.integer):
        raise InputError(
            f"Input '{name}' has element type {dtype}, which ortpilot cannot generate; "
            "pass it with --input NAME=FILE.npy."
        )
    if _MASK.search(name):
        return np.ones(shape, dtype=dtype)
    if name in plan.index_bounds:
        return rng.integers(0, max(1, plan.index_bounds[name]), shape).astype(dtype)
    if _TYPE_IDS.search(name):
        return np.zeros(shape, dtype=dtype)
    if _POSITION.search(name) and shape:
        past = next((v for k, v in plan.dim_values.items() if "past" in k.lower()), 0)
        return np.broadcast_to(np.arange(past, past + shape[-1]), shape).astype(dtype).copy()
    if _SAMPLE_RATE.match(name):
        return np.full(shape, 16000, dtype=dtype)
    if _LENGTH.search(name):
        seq = next((v for k, v in plan.dim_values.items() if "seq" in k.lower()), 1)
        return np.full(shape, seq, dtype=dtype)
    return rng.integers(0, 2, shape).astype(dtype)


def validate_feeds(inputs: Sequence[InputInfo], feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Check names, dtypes, ranks and fixed dims; warn on NaN/Inf. Returns numpy arrays.

    Runs before ORT so that the error names the input and the fix, not an ORT status code.
    """
    if not isinstance(feeds, Mapping):  # ORT's run takes {name: array}; a list of arrays failed as "unhashable"
        raise InputError(
            f"The inputs must be a mapping of input name to array, got {type(feeds).__name__}: "
            + "{"
            + ", ".join(f"'{i.name}': {i.dtype}{_dims(i.dims)}" for i in inputs)
            + "}."
        )
    by_name = {i.name: i for i in inputs}
    unknown = [n for n in feeds if n not in by_name]
    if unknown:
        raise InputError(
            f"Unknown input name(s) {', '.join(map(repr, unknown))}. The model's inputs are: "
            + ", ".join(f"{i.name} {i.dtype}{_dims(i.dims)}" for i in inputs)
            + "."
        )
    missing = [n for n in by_name if n not in feeds]
    if missing:
        raise InputError(
            f"Missing input(s) {', '.join(map(repr, missing))}. Provide every input: "
            + ", ".join(f"{i.name} {i.dtype}{_dims(i.dims)}" for i in inputs)
            + "."
        )
    out: dict[str, np.ndarray] = {}
    shape_problems: list[str] = []  # every input's, every dim's: one error names them all
    for name, value in feeds.items():
        info = by_name[name]
        if not isinstance(value, np.ndarray):
            if hasattr(value, "numpy") and callable(value.numpy):
                value = value.numpy()
            else:
                value = np.asarray(value)
        want = np.dtype(info.dtype)
        if value.dtype != want:
            raise InputError(
                f"Input '{name}' must be {want}, got {value.dtype}. Convert it first, e.g. arr.astype(np.{want.name})."
            )
        if info.dims and value.ndim != len(info.dims):
            shape_problems.append(
                f"Input '{name}' must have rank {len(info.dims)} {_dims(info.dims)}, got rank "
                f"{value.ndim} with shape {list(value.shape)}."
            )
            continue
        bad = [
            f"dim {axis} must be {d}"
            for axis, (d, got) in enumerate(zip(info.dims, value.shape))
            if isinstance(d, int) and d >= 0 and d != got
        ]
        if bad:
            shape_problems.append(
                f"Input '{name}' {' and '.join(bad)} {_dims(info.dims)}, got shape {list(value.shape)}."
            )
            continue
        if np.issubdtype(value.dtype, np.floating) and value.size and not np.isfinite(value).all():
            nans = int(np.isnan(value).sum())
            infs = int(np.isinf(value).sum())
            warnings.warn(
                f"Input '{name}' contains {nans} NaN and {infs} Inf value(s); outputs will likely be NaN too.",
                NaNInputWarning,
                stacklevel=3,
            )
        out[name] = value
    if shape_problems:
        raise InputError(" ".join(shape_problems))
    return out


def _dims(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


# What numpy raises on a damaged .npy/.npz: a bad header or pickled objects (ValueError), an empty file (EOFError),
# a truncated or corrupt archive (BadZipFile; zlib.error inside a compressed member), a member missing (KeyError),
# a header claiming a shape larger than memory (MemoryError, before a byte of data is read).
UNREADABLE_ARRAY = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, KeyError, MemoryError)


def refuse_all_empty(samples: Sequence[Mapping[str, np.ndarray]], job: str, given: str = "sample(s) given") -> None:
    """Samples whose every input is empty (a 0 dim) give a timing of nothing and an accuracy verdict on nothing:
    ``job`` (what would "pass" on them: "a tune", "the comparison", "the gate") refuses them, naming the first.
    ``run`` and ``bench`` take them (an edge case a user may want to see run)."""
    empty = [i for i, s in enumerate(samples) if s and all(np.size(v) == 0 for v in s.values())]
    if empty:
        shown = ", ".join(f"'{k}' {list(np.shape(v))}" for k, v in samples[empty[0]].items())
        raise InputError(
            f"{len(empty)} of {len(samples)} {given} have every input empty (the first, #{empty[0]}: {shown}): "
            f"{job} would time and compare nothing on them. Give inputs with at least one element (each dim of "
            "--shape 1 or more)."
        )


NPZ_MAGIC = b"PK"  # a zip archive's first bytes
NPY_MAGIC = b"\x93NUMPY"


def _refuse_foreign(path: str | Path, what: str, kind: str) -> None:
    """numpy reads a file that is neither a zip nor an .npy as a pickle and says "pickled (object) data": a text
    file or random bytes named .npz would read as that. Say what the file is not instead."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(NPY_MAGIC))
    except OSError:
        return  # np.load says what is wrong with a path it cannot open
    if head and not head.startswith(NPZ_MAGIC) and not head.startswith(NPY_MAGIC):
        raise InputError(
            f"{what} '{path}' is not a readable {kind}: it starts with neither a zip archive's nor an .npy file's "
            "header (numpy.savez writes an .npz, numpy.save an .npy)."
        )


def read_npz(path: str | Path, what: str = "Input file") -> dict[str, np.ndarray]:
    """The named arrays of one .npz; a corrupt archive, pickled objects or a plain .npy is an ``InputError``."""
    try:
        _refuse_foreign(path, what, ".npz")
        data = np.load(path, allow_pickle=False)
        if not hasattr(data, "files"):  # an .npy file named .npz
            raise ValueError("it holds one array, not named arrays")
        with data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise InputError(f"{what} '{path}' does not exist.") from None
    except UNREADABLE_ARRAY as exc:
        raise InputError(f"{what} '{path}' is not a readable .npz ({type(exc).__name__}: {str(exc)[:200]}).") from None


def read_npy(path: str | Path, what: str = "Input file") -> np.ndarray:
    """The one array of an .npy; a damaged or empty file, pickled objects or an .npz is an ``InputError``."""
    try:
        _refuse_foreign(path, what, ".npy")
        value = np.load(path, allow_pickle=False)
        if not isinstance(value, np.ndarray):  # an .npz given where one array goes
            value.close()
            raise ValueError("it holds named arrays (an .npz), not one array: an .npz of every input goes alone")
        return value
    except FileNotFoundError:
        raise InputError(f"{what} '{path}' does not exist.") from None
    except UNREADABLE_ARRAY as exc:
        raise InputError(
            f"{what} '{path}' is not a readable .npy array ({type(exc).__name__}: {str(exc)[:200]})."
        ) from None


def read_samples(path: str | Path, what: str = "Sample file") -> list[dict[str, np.ndarray]]:
    """Samples saved as ``{i}/{name}`` arrays in one npz (:func:`samples_to_arrays`), in order; none if absent.
    A key of another form is an ``InputError`` naming it."""
    if not Path(path).is_file():
        return []
    out: dict[int, dict[str, np.ndarray]] = {}
    for key, value in read_npz(path, what).items():
        index, _, name = key.partition("/")
        if not index.isdigit() or not name:
            raise InputError(
                f"{what} '{path}' has an array named '{key}'; samples are stored as INDEX/INPUT "
                "('0/input_ids', '1/input_ids', ...), one index per sample."
            )
        out.setdefault(int(index), {})[name] = value
    return [out[i] for i in sorted(out)]


def samples_to_arrays(samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The ``{i}/{name}`` arrays of one npz holding ``samples`` (what :func:`read_samples` reads back)."""
    return {f"{i}/{name}": value for i, feeds in enumerate(samples) for name, value in feeds.items()}


def batch_size_of(feeds: Mapping[str, np.ndarray]) -> int:
    """Items per inference for throughput: the first dim of the first input with rank >= 2."""
    for value in feeds.values():
        if value.ndim >= 2:
            return int(value.shape[0])
    return 1


def nbytes(feeds: Mapping[str, np.ndarray]) -> int:
    return int(sum(v.nbytes for v in feeds.values()))
