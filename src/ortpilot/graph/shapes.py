"""Resolve symbolic input dims to numbers, the way a user would expect.

Dims named like batch get 1, like sequence/length get 128 (past dims too; a "total" dim is
past + sequence); ``--shape NAME=1x128`` fixes one input's whole shape and ``--shape DIM=64``
fixes one symbolic dim everywhere. An unnamed dim with no sensible default is an error that
asks for ``--shape``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

from ortpilot.errors import InputError, UsageError

BATCH_DEFAULT = 1
SEQUENCE_DEFAULT = 128
MAX_DIM = 2**31 - 1

_BATCH = re.compile(r"^(n|b|bs|batch|batch_?size|.*batch.*|num_?images|unk__\d+_batch)$", re.I)
_SEQ = re.compile(r"(seq|sequence|length|len|tokens|time|frames|steps)", re.I)
_PAST = re.compile(r"past", re.I)
_TOTAL = re.compile(r"(total|all|kv|key_?len)", re.I)


def is_batch_dim(name: str) -> bool:
    """Whether a symbolic dim's name says batch (the rule that gives it the default 1)."""
    return bool(_BATCH.match(name))


def is_length_dim(name: str) -> bool:
    """Whether a symbolic dim's name says a length (sequence, past, frames: the rule that gives it 128), not a
    batch: a first dim so named is a sample's own."""
    return not is_batch_dim(name) and bool(_SEQ.search(name) or _PAST.search(name))


@dataclass(frozen=True)
class InputInfo:
    """One graph input: name, element type (onnx enum) and dims (int, str or None)."""

    name: str
    elem_type: int
    dims: tuple[int | str | None, ...]

    @property
    def dtype(self):
        return onnx.helper.tensor_dtype_to_np_dtype(self.elem_type)

    @property
    def symbolic(self) -> bool:
        return any(not isinstance(d, int) or d < 0 for d in self.dims)


def graph_inputs(model: onnx.ModelProto) -> list[InputInfo]:
    """Real inputs: graph inputs that are not also initializers (old exporters list both)."""
    inits = {i.name for i in model.graph.initializer}
    return [
        InputInfo(vi.name, vi.type.tensor_type.elem_type, value_dims(vi) or ())
        for vi in model.graph.input
        if vi.name not in inits
    ]


def value_dims(value: onnx.ValueInfoProto) -> tuple[int | str | None, ...] | None:
    """A value's declared dims (a number, a symbol, or None when unnamed); None when it has no shape."""
    ttype = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not ttype.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for d in ttype.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def parse_shape_args(
    items: Sequence[str] | Mapping[str, Sequence[int] | int | str] | None,
) -> dict[str, tuple[int, ...]]:
    """Parse ``NAME=1x3x224x224`` strings (or a dict) into name -> dims."""
    if not items:
        return {}
    pairs: list[tuple[str, object]]
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            name, eq, dims = str(item).rpartition("=")
            if not eq or not name:
                raise UsageError(f"Malformed --shape '{item}': write NAME=DIMS, e.g. input_ids=1x128 or batch=4.")
            pairs.append((name, dims))
    out: dict[str, tuple[int, ...]] = {}
    for name, dims in pairs:
        out[name] = _parse_dims(name, dims)
    return out


def _parse_dims(name: str, dims: object) -> tuple[int, ...]:
    if isinstance(dims, bool):
        raise UsageError(f"Malformed --shape for '{name}': {dims!r} is not a dim.")
    if isinstance(dims, int):
        values = [dims]
    elif isinstance(dims, str):
        parts = [p for p in re.split(r"[x,×*]", dims.strip()) if p != ""] if dims.strip() not in ("", "scalar") else []
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise UsageError(f"Malformed --shape for '{name}': '{dims}' is not dims like 1x3x224x224.") from None
    else:
        try:
            values = [_integer(v) for v in dims]  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise UsageError(f"Malformed --shape for '{name}': {dims!r} is not a list of integer dims.") from None
    if any(v < 0 for v in values):
        raise UsageError(f"--shape for '{name}' has a negative dim: {values}.")
    too_big = [v for v in values if v > MAX_DIM]
    if too_big:
        raise UsageError(
            f"--shape for '{name}' has dim {too_big[0]}, above the largest dim ortpilot accepts "
            f"({MAX_DIM}, 2^31-1: ORT's kernels index dims with 32-bit integers in places)."
        )
    return tuple(values)


def _integer(value: object) -> int:
    """An int, or a string of digits; never a bool or a float (1.5 would silently become 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(value)
    return int(value)


def check_shape_names(inputs: Sequence[InputInfo], overrides: Mapping[str, object], flag: str = "--shape") -> None:
    """A user's ``--shape`` names each an input or a symbolic dim of the model: a typo would otherwise run at the
    default shape, silently. For commands of one model (``run``, ``tune``); ``bench --vs`` hands one ``--shape``
    to models that may lack a dim, which ``resolve_input_shapes`` lets pass."""
    names = {i.name for i in inputs}
    symbols = list(dict.fromkeys(d for i in inputs for d in i.dims if isinstance(d, str) and d))
    unknown = [k for k in overrides if k not in names and k not in symbols]
    if unknown:
        raise UsageError(
            f"{flag} {', '.join(unknown)} names neither an input nor a symbolic dim of the model. Its inputs: "
            f"{', '.join(sorted(names))}; its symbolic dims: {', '.join(symbols) or 'none'}."
        )


def resolve_input_shapes(
    inputs: Sequence[InputInfo], overrides: Mapping[str, tuple[int, ...]] | None = None
) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Concrete shapes for every input, and the value chosen for each symbolic dim name.

    Raises InputError for overrides that contradict the model and UsageError for dims that
    need ``--shape``.
    """
    overrides = dict(overrides or {})
    names = {i.name for i in inputs}
    dim_values: dict[str, int] = {}
    for key in list(overrides):
        if key not in names:
            dims = overrides.pop(key)
            if len(dims) != 1:
                raise UsageError(
                    f"--shape '{key}' matches no input ({', '.join(sorted(names))}); "
                    "to set one symbolic dim everywhere give one number, e.g. sequence=64."
                )
            dim_values[key] = dims[0]
    shapes: dict[str, tuple[int, ...]] = {}
    contradictions = [
        problem for info in inputs if info.name in overrides for problem in _contradictions(info, overrides[info.name])
    ]
    if contradictions:  # every --shape that contradicts the model, each dim of it, in one error
        raise InputError(" ".join(contradictions))
    for info in inputs:
        if info.name in overrides:
            shapes[info.name] = _take_override(info, overrides[info.name], dim_values)
    _default_dims(inputs, dim_values)
    unknown: list[str] = []
    for info in inputs:
        if info.name in shapes:
            continue
        dims: list[int] = []
        missing: list[str] = []
        for axis, d in enumerate(info.dims):
            if isinstance(d, int) and d >= 0:
                dims.append(d)
            elif isinstance(d, str) and d in dim_values:
                dims.append(dim_values[d])
            else:
                missing.append(f"dim {axis} {'named ' + repr(d) if d else 'unnamed'}")
        if missing:
            named = [d for d in info.dims if isinstance(d, str) and d and d not in dim_values]
            unknown.append(
                f"Input '{info.name}' has {' and '.join(missing)} with no sensible default. Fix it with --shape "
                f"{info.name}="
                + "x".join(str(x) if isinstance(x, int) and x >= 0 else "N" for x in info.dims)
                + (f" (or {', '.join(f'--shape {d}=N' for d in dict.fromkeys(named))})" if named else "")
                + "."
            )
            continue
        shapes[info.name] = tuple(dims)
    if unknown:
        raise UsageError(" ".join(unknown))
    return shapes, dim_values


def _contradictions(info: InputInfo, dims: tuple[int, ...]) -> list[str]:
    """What a ``--shape`` for ``info`` contradicts in the model: its rank, or every dim the model fixes otherwise."""
    if info.dims and len(dims) != len(info.dims):
        return [
            f"--shape {info.name}={'x'.join(map(str, dims))} has rank {len(dims)}, but the model "
            f"declares rank {len(info.dims)} ({_fmt_dims(info.dims)})."
        ]
    bad = [
        (axis, want, got)
        for axis, (want, got) in enumerate(zip(info.dims, dims))
        if isinstance(want, int) and want >= 0 and want != got
    ]
    if not bad:
        return []
    sets = " and ".join(f"dim {axis} to {got}" for axis, _, got in bad)
    fixed = " and ".join(str(want) for _, want, _ in bad)
    return [
        f"--shape {info.name} sets {sets}, but the model fixes {'it' if len(bad) == 1 else 'them'} at {fixed} "
        f"({_fmt_dims(info.dims)})."
    ]


def _take_override(info: InputInfo, dims: tuple[int, ...], dim_values: dict[str, int]) -> tuple[int, ...]:
    """An override that fits the model (``_contradictions`` found nothing); its symbolic dims' values noted."""
    for want, got in zip(info.dims, dims):
        if isinstance(want, str):
            dim_values.setdefault(want, got)
    return dims


def _fmt_dims(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _default_dims(inputs: Sequence[InputInfo], dim_values: dict[str, int]) -> None:
    symbolic = []
    for info in inputs:
        for d in info.dims:
            if isinstance(d, str) and d not in dim_values and d not in symbolic:
                symbolic.append(d)
    totals = []
    for name in symbolic:
        if is_batch_dim(name):
            dim_values[name] = BATCH_DEFAULT
        elif _PAST.search(name):
            dim_values[name] = SEQUENCE_DEFAULT
        elif _TOTAL.search(name) and _SEQ.search(name):
            totals.append(name)
        elif _SEQ.search(name):
            dim_values[name] = SEQUENCE_DEFAULT
    for name in totals:
        past = next((v for k, v in dim_values.items() if _PAST.search(k)), 0)
        seq = next(
            (v for k, v in dim_values.items() if _SEQ.search(k) and not _PAST.search(k) and not _TOTAL.search(k)),
            SEQUENCE_DEFAULT,
        )
        dim_values[name] = past + seq if past else seq


def model_max_positions(model: onnx.ModelProto) -> int | None:
    """The context limit an export recorded in its metadata, if any."""
    meta = {p.key: p.value for p in model.metadata_props}
    for key in ("max_positions", "max_position_embeddings", "context_length"):
        if meta.get(key, "").isdigit():
            return int(meta[key])
    return None
