"""Build a candidate's model: its passes applied to the source, through the model cache.

A candidate's pipeline is a list of steps (``passes.registry.Step``: ``{"pass": "fusion", ...}``,
``{"pass": "quantize", ...}``); each builds its pass from the registry (``FusionPass``,
``QuantizePass``, ...), and :func:`expand` puts the quantizer's model preparation
(``PrepareForQuantization``) before each quantize step as a step of its own. Every prefix of
a pipeline is content-addressed in ``artifacts.store`` (key: source, ORT version, steps and,
for calibrated modes, the calibration samples), so a prefix seen before (the fused model, the
prepared model) costs a hash check, not a rebuild, across candidates, tunes and processes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from ortpilot.artifacts.stamp import write_stamp
from ortpilot.artifacts.store import ModelStore, cache_key
from ortpilot.modelio import file_sha256
from ortpilot.passes.base import Pipeline
from ortpilot.passes.decoder_fusion import FusionIncompleteError
from ortpilot.passes.fusion import FusionPass
from ortpilot.passes.quantize import NothingQuantizedError
from ortpilot.passes.registry import Step

PREPARE = Step("prepare")  # PrepareForQuantization: once per model, shared by its INT8 variants

Feeds = Mapping[str, np.ndarray]
STORE_VERSION = 3  # bump when the step -> pass mapping changes what a step builds


class NothingToDo(Exception):
    """A pass left the model unchanged (fusion found no pattern, nothing quantizable): a duplicate."""


def samples_digest(samples: Sequence[Feeds]) -> str:
    digest = hashlib.sha256()
    for feeds in samples:
        for name in sorted(feeds):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(feeds[name]).tobytes())
    return digest.hexdigest()[:16]


def expand(steps: Sequence[Step | Mapping[str, Any]]) -> list[Step]:
    """The steps as built: a ``prepare`` step (``PrepareForQuantization``) before every quantize step."""
    out: list[Step] = []
    for step in map(Step.of, steps):
        if step.name == "quantize":
            out.append(PREPARE)
        out.append(step)
    return out


def pipeline_for(steps: Sequence[Step | Mapping[str, Any]], calibration: Sequence[Feeds]) -> Pipeline:
    """The candidate's passes as one ``Pipeline`` (what :func:`build_model` runs, prefix by prefix)."""
    expanded = expand(steps)
    return Pipeline(
        [
            step.build(calibration=calibration, prepared=i > 0 and expanded[i - 1].name == PREPARE.name)
            for i, step in enumerate(expanded)
        ]
    )


def build_model(
    source: Path, steps: Sequence[Step | Mapping[str, Any]], calibration: Sequence[Feeds]
) -> tuple[Path, list[dict[str, Any]], bool]:
    """Return (model path, pass records, cache hit). The source itself when there are no steps.

    Every prefix of the pipeline is its own cache entry, so candidates that share a prefix
    (the fused model, the prepared model) build it once.
    """
    if not steps:
        return source, [], True
    store = ModelStore()
    source_sha = file_sha256(source)
    current, records, hit_all = source, [], True
    expanded, passes, keys = _prefix_keys(source_sha, steps, calibration)
    for i, (step, step_pass, key) in enumerate(zip(expanded, passes, keys)):
        prefix = [s.to_dict() for s in expanded[: i + 1]]
        is_last = i == len(expanded) - 1

        def build(out: Path, step_pass=step_pass, current=current, last=is_last) -> dict[str, Any]:
            try:
                result = step_pass.run(current)
            except (NothingQuantizedError, FusionIncompleteError) as exc:
                raise NothingToDo(str(exc).split(". ")[0]) from None
            if isinstance(step_pass, FusionPass) and not result.record.fused:
                raise NothingToDo(f"transformer fusion ({step_pass.model_type}) found no pattern to fuse")
            record = result.record
            if last:  # the final model's stamp names the original source
                record.stamp = dict(record.stamp or {}, source_sha256=source_sha, source_path=str(source.resolve()))
                write_stamp(result.model, record.stamp)
            result.save(out)
            return {"record": record.to_dict()}  # kept in the entry's meta, for hits

        path, hit = store.get_or_create(key, build, meta={"steps": prefix, "source_sha256": source_sha})
        records.append(
            store.read_entry(key).get("meta", {}).get("record") or {"name": step.name, "options": dict(step)}
        )
        hit_all = hit_all and hit
        current = path
    return current, records, hit_all


def _prefix_keys(
    source_sha: str,
    steps: Sequence[Step | Mapping[str, Any]],
    calibration: Sequence[Feeds],
    digest: Callable[[], str] | None = None,
) -> tuple[list[Step], list[Any], list[str]]:
    """(the steps as built, their passes, the model cache's key of each prefix): what ``build_model`` builds in turn.
    ``digest``: the calibration samples' digest where the caller keeps it (computed here at most once otherwise)."""
    expanded = expand(steps)
    passes = pipeline_for(steps, calibration).passes
    keys: list[str] = []
    known: str | None = None
    for i in range(len(expanded)):
        calibrated = any(p.calibrated for p in passes[: i + 1])
        if calibrated and known is None:
            known = digest() if digest is not None else samples_digest(calibration)
        keys.append(
            cache_key(
                model_sha256=source_sha,
                ort_version=ort.__version__,
                providers=[],
                level="tune-pipeline",
                extra={
                    "steps": [s.to_dict() for s in expanded[: i + 1]],
                    "tuner": STORE_VERSION,
                    "revisions": [p.revision for p in passes[: i + 1]],
                    "calibration": known if calibrated else None,
                },
            )
        )
    return expanded, passes, keys


def cached_prefix(
    source_sha: str, steps: Sequence[Step], calibration: Sequence[Feeds], digest: Callable[[], str] | None = None
) -> tuple[Step, ...]:
    """The leading ``steps`` whose models the model cache holds (each model's file is there; ``build_model`` checks
    an entry when it serves it), and ``PREPARE`` after them where the quantizer's preparation of the next step is
    held too: what the budget estimates a preparation from, since a cached model costs a load, not a build (a
    second tune of MiniLM estimated OpenVINO's INT8 at 38 s, its model there to load in 1.2 s)."""
    if not steps:
        return ()
    expanded, _, keys = _prefix_keys(source_sha, steps, calibration, digest)
    store, held = ModelStore(), []
    for step, key in zip(expanded, keys):
        if not store.holds(key):
            break
        held.append(step)
    kept = [s for s in held if s.name != PREPARE.name]
    return (*kept, PREPARE) if held and held[-1].name == PREPARE.name else tuple(kept)


# --------------------------------------------------------------------------- attention shape


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {t.name: t for t in model.graph.initializer}
    out: dict[str, Any] = dict(values)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            out[node.output[0]] = node.attribute[0].t
    return {k: numpy_helper.to_array(v) for k, v in out.items() if v.data_type in (6, 7)}  # int32, int64


def attention_dims(model: onnx.ModelProto) -> tuple[int, int]:
    """(num_heads, hidden_size) of the first self-attention, or (0, 0) when the graph does not say.

    ORT's fusion reads the head count from the constant in the Q/K/V reshape; exporters that
    write ``[batch, seq, -1, head_size]`` leave it unreadable (MiniLM does), and attention is
    then not fused at all. Here the head size and the projection width give it.
    """
    consts = _constants(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    widths = {t.name: int(t.dims[-1]) for t in model.graph.initializer if len(t.dims) >= 1}

    def tail_of(name: str) -> list[int]:
        """The trailing constant entries of a reshape's target shape (all of it when constant)."""
        if name in consts:
            return [int(v) for v in consts[name].reshape(-1)]
        node = producer.get(name)
        if node is None or node.op_type != "Concat":
            return []
        tail: list[int] = []
        for part in reversed(node.input):
            if part not in consts:
                break
            tail = [int(v) for v in consts[part].reshape(-1)] + tail
        return tail

    def width_of(name: str, depth: int = 0) -> int:
        node = producer.get(name)
        if node is None or depth > 3:
            return 0
        if node.op_type in ("MatMul", "Gemm", "Add"):
            for inp in node.input[1:] if node.op_type != "Add" else node.input:
                if inp in widths:
                    return widths[inp]
            return width_of(node.input[0], depth + 1)
        return 0

    for node in model.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        perms = [
            next((list(a.ints) for a in c.attribute if a.name == "perm"), None)
            for c in consumers.get(node.output[0], [])
            if c.op_type == "Transpose"
        ]
        if [0, 2, 1, 3] not in perms and [0, 2, 3, 1] not in perms:
            continue
        tail = tail_of(node.input[1])  # a 4-D [batch, seq, heads, head_size] (the transpose says 4-D)
        if len(tail) < 2 or tail[-1] <= 0:
            continue
        heads, head_size = tail[-2], tail[-1]
        hidden = width_of(node.input[0])
        if heads and heads > 0:
            return heads, hidden or heads * head_size
        if hidden and hidden % head_size == 0:
            return hidden // head_size, hidden
    return 0, 0
