"""INT8 quantization as a pass: dynamic, static (QOperator), QDQ and full QDQ.

Everything is ``onnxruntime.quantization``; this module only prepares the model and picks
settings. Preparation: ``Constant`` nodes become initializers (the quantizer only quantizes
initializer weights, and exporters such as silero-vad's or Paddle's keep weights in
``Constant`` nodes), unnamed nodes get names (exclusion works by name), then
``quant_pre_process`` (shape inference and basic fusions) when it succeeds.

Modes: ``dynamic`` weights INT8, activations quantized at run time (fast on MatMul-heavy
models, can be slow on conv nets); ``static`` QOperator ops (QLinearConv, ...) calibrated;
``qdq`` QuantizeLinear/DequantizeLinear around weighted ops and the data-movement ops between
them; ``full`` QDQ on every op type the quantizer knows, forced even where an input is float.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ortpilot.artifacts.scratch import scratch_dir
from ortpilot.errors import OrtpilotError, UsageError, VerificationError
from ortpilot.passes.base import Outcome, Pass, Setting, SourceModel, op_histogram, quantized_node_count
from ortpilot.passes.options import METHODS, NOISE_RANKING, QUANT_TYPES, WEIGHT_OPS, QuantizeOptions
from ortpilot.quantmodes import CALIBRATED_MODES, FULL, OPERATOR_MODES, QDQ, STATIC
from ortpilot.session.ortlog import capture_ort_output
from ortpilot.walk import graphs

log = logging.getLogger("ortpilot")
# QDQ around the ops whose integer kernels pay off, plus ops that carry INT8 through unchanged.
QDQ_OPS_DEFAULT = (
    "Conv",
    "ConvTranspose",
    "MatMul",
    "Gemm",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Relu",
    "Clip",
    "Reshape",
    "Transpose",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Resize",
    "Concat",
)


class NothingQuantizedError(UsageError):
    """The quantizer skipped every node: the output would equal the input."""


class QuantizerError(VerificationError):
    """ORT's quantizer (``quantize_static`` / ``quantize_dynamic``) raised: its message names the
    function inside ``onnxruntime.quantization`` where it failed, so a failure is never a bare
    ``ValueError`` with no word of whose it is."""


def _quantizer_error(entry: str, exc: BaseException) -> QuantizerError:
    """``exc`` from ORT's ``entry`` as a one-line QuantizerError naming the innermost ORT frame."""
    import onnxruntime

    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if f"{os.sep}onnxruntime{os.sep}" in f.filename]
    where = (inside or frames or [None])[-1]
    place = f" in {Path(where.filename).name}:{where.name} (line {where.lineno})" if where else ""
    text = " ".join(str(exc).split()) or type(exc).__name__
    origin = "inside ONNX Runtime's quantizer" if inside else "in the call to ONNX Runtime's quantizer"
    return QuantizerError(
        f"ORT's {entry} raised {type(exc).__name__}{place}: {text}. The failure is {origin} "
        f"(onnxruntime {onnxruntime.__version__}); no model was written. Try without --per-channel or "
        "another --mode, and report it to ONNX Runtime with the model if it persists."
    )


def _quant_type(name: str):
    """ORT's ``QuantType`` of one of ``QUANT_TYPES`` (``QuantizeOptions`` checked the name)."""
    from onnxruntime.quantization import QuantType

    return QuantType.QInt8 if name == "qint8" else QuantType.QUInt8


def _method(name: str):
    """ORT's ``CalibrationMethod`` of one of ``METHODS`` (``QuantizeOptions`` checked the name)."""
    from onnxruntime.quantization import CalibrationMethod

    return {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[name]


def full_op_types() -> list[str]:
    """Every op type ORT's QDQ and QOperator quantizers know."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return sorted(set(QDQRegistry) | set(QLinearOpsRegistry))


# --------------------------------------------------------------------------- preparation


def _constant_array(node: onnx.NodeProto) -> np.ndarray | None:
    if not node.attribute:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    if attr.name == "value_float":
        return np.array(attr.f, dtype=np.float32)
    if attr.name == "value_floats":
        return np.array(list(attr.floats), dtype=np.float32)
    if attr.name == "value_int":
        return np.array(attr.i, dtype=np.int64)
    if attr.name == "value_ints":
        return np.array(list(attr.ints), dtype=np.int64)
    return None  # sparse and string constants stay nodes


def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Turn ``Constant`` nodes into initializers of their graph (subgraphs too), in place; return how many."""
    converted = 0
    for graph in list(graphs(model.graph)):
        keep = []
        for node in graph.node:
            value = _constant_array(node) if node.op_type == "Constant" and node.domain in ("", "ai.onnx") else None
            if value is None:
                keep.append(node)
                continue
            graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
            converted += 1
        if converted:
            del graph.node[:]
            graph.node.extend(keep)
    return converted


def name_nodes(model: onnx.ModelProto) -> int:
    """Give every unnamed node a unique name (the quantizer excludes nodes by name)."""
    taken = {n.name for g in graphs(model.graph) for n in g.node if n.name}
    named = 0
    for graph in graphs(model.graph):
        for i, node in enumerate(graph.node):
            if not node.name:
                base = f"{node.op_type}_{i}"
                name, k = base, 1
                while name in taken:
                    name, k = f"{base}_{k}", k + 1
                node.name = name
                taken.add(name)
                named += 1
    return named


@contextlib.contextmanager
def _working_dir(path: str) -> Iterator[None]:
    """chdir for the block (process-wide: quant_pre_process is not called from threads here)."""
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def prepare(model: onnx.ModelProto, *, preprocess: bool = True) -> tuple[onnx.ModelProto, list[str]]:
    """Constant fix, node names, ``quant_pre_process`` (skipped with a note when it fails)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    work = onnx.ModelProto()
    work.CopyFrom(model)
    notes = []
    converted = constants_to_initializers(work)
    if converted:
        notes.append(f"{converted} Constant node(s) turned into initializers so their weights can be quantized")
    if preprocess:
        with scratch_dir("ortpilot-pre-") as tmp:
            src, out = Path(tmp) / "in.onnx", Path(tmp) / "pre.onnx"
            onnx.save(work, str(src))  # a path, not the proto: quant_pre_process moves a proto's weights out
            for skip_symbolic in (False, True):
                try:
                    # It prints whole graphs when shape inference fails, and its symbolic shape
                    # inference then dumps files into the working directory: keep both in tmp.
                    with capture_ort_output(), _working_dir(tmp):
                        quant_pre_process(str(src), str(out), skip_symbolic_shape=skip_symbolic)
                    work = onnx.load(str(out))
                    notes.append(
                        "quant_pre_process: shape inference and basic optimizations"
                        + (" (symbolic shape inference skipped: it failed)" if skip_symbolic else "")
                    )
                    break
                except Exception as exc:  # the pre-processor's failures are its own; quantize without it
                    log.debug("quant_pre_process failed (skip_symbolic_shape=%s): %s", skip_symbolic, exc)
            else:
                notes.append("quant_pre_process failed; quantizing the model as it is")
    name_nodes(work)
    return work, notes


class PrepareForQuantization(Pass):
    """:func:`prepare` as a step of its own (Constant weights to initializers, node names,
    ``quant_pre_process``), so that its result is cached once per model and every INT8 variant of
    that model starts from it (``QuantizePass(preprocess=False)`` on a prepared model writes the
    same bytes as ``QuantizePass()`` on the original)."""

    name = "quantize-prepare"

    def options(self) -> dict[str, Any]:
        return {}

    def label(self) -> str:
        return "prepare"

    def transform(self, source: SourceModel) -> Outcome:
        model, notes = prepare(source.proto)
        return Outcome(model, notes=notes)


def flatten_gemm_biases(model: onnx.ModelProto) -> int:
    """Reshape Gemm biases (``C``) of shape ``[1, ..., 1, N]`` to ``[N]``, in place; return how many.

    ORT's own ``quant_pre_process`` fuses MatMul + Add into a Gemm whose bias keeps the Add's
    ``[1, N]`` shape (Magika's classifier head), and ORT's per-channel quantizers then fail on it
    (QDQ's ``_adjust_weight_scale_for_int32_bias``, QOperator's ``adjust_single_weight_scale_if_needed``
    index the bias per output channel: "The truth value of an array with more than one element is
    ambiguous"; onnxruntime 1.32). Gemm
    broadcasts ``[N]`` and ``[1, N]`` alike, so the reshape changes no result. Only initializers
    that nothing but Gemm biases read are touched.
    """
    readers: dict[str, list[tuple[str, int]]] = {}
    for graph in graphs(model.graph):
        for node in graph.node:
            for slot, name in enumerate(node.input):
                readers.setdefault(name, []).append((node.op_type, slot))
    outputs = {o.name for g in graphs(model.graph) for o in g.output}
    flattened = 0
    for graph in graphs(model.graph):
        for i, init in enumerate(graph.initializer):
            dims = list(init.dims)
            uses = readers.get(init.name, [])
            if len(dims) < 2 or any(d != 1 for d in dims[:-1]) or init.name in outputs:
                continue
            if not uses or any(use != ("Gemm", 2) for use in uses):
                continue
            array = numpy_helper.to_array(init)
            graph.initializer[i].CopyFrom(numpy_helper.from_array(array.reshape(dims[-1]), init.name))
            flattened += 1
    return flattened


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _unknown_to_onnx(model: onnx.ModelProto) -> list[str]:
    """Ops in the default domain that ONNX has no schema for (ORT contrib ops a fusion wrote there, such as
    SimplifiedLayerNormalization): ONNX's version converter cannot upgrade a graph that holds them."""
    return sorted({n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type)})


# --------------------------------------------------------------------------- the pass


class QuantizePass(Pass):
    """Quantize with ORT as a ``QuantizeOptions`` says; calibrated modes need ``calibration`` samples."""

    name = "quantize"

    def __init__(
        self,
        mode: str | QuantizeOptions | None = None,
        *,
        calibration: Sequence[Mapping[str, np.ndarray]] | None = None,
        extra_options: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        """``mode``: one of ``INT8_MODES`` (None: the record's default), or a whole ``QuantizeOptions``;
        ``settings``: its other fields (``per_channel=True``, ``nodes_to_exclude=[...]``; with a record,
        changes to it). ``extra_options`` go to ORT's quantizer as they are."""
        if isinstance(mode, QuantizeOptions):
            self.config = replace(mode, **settings)
        else:
            self.config = QuantizeOptions(**({"mode": mode} if mode is not None else {}), **settings)
        self.calibration = list(calibration) if calibration is not None else None
        self.extra_options = dict(extra_options or {})
        self._prepared: dict[str, tuple[onnx.ModelProto, list[str]]] = {}

    @classmethod
    def from_options(
        cls, options: QuantizeOptions, *, calibration: Sequence[Mapping[str, np.ndarray]] = (), prepared: bool = False
    ) -> QuantizePass:
        """A tune step: its ``QuantizeOptions``; ``prepared`` skips the preparation a ``prepare`` step did."""
        return cls(
            replace(options, preprocess=False) if prepared else options,
            calibration=list(calibration) if options.calibrated else None,
            # fused contrib ops (Attention, SkipLayerNormalization) defeat ONNX shape
            # inference; their tensors are float
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )

    # The settings, read as the pass's own attributes (``config`` holds them).
    mode = Setting()
    per_channel = Setting()
    reduce_range = Setting()
    weight_type = Setting()
    activation_type = Setting()
    method = Setting()
    op_types = Setting()  # a list, or None: per mode
    nodes_to_exclude = Setting()
    preprocess = Setting()
    calibrated = Setting()  # type: ignore[assignment]

    def label(self) -> str:
        """``int8-dynamic``, then ``-w`` (weights only), ``-pc`` (per channel), ``-rr`` (7-bit weights),
        ``-u8u8`` / ``-s8s8`` (weight / activation types off the default) and ``-xN`` (N nodes left float)."""
        label = f"int8-{self.mode}"
        if self.config.weights_only:
            label += "-w"
        if self.per_channel:
            label += "-pc"
        if self.reduce_range:
            label += "-rr"
        if self.weight_type == "quint8":
            label += "-u8u8"
        if self.activation_type == "qint8":
            label += "-s8s8"
        if self.nodes_to_exclude:
            label += f"-x{len(self.nodes_to_exclude)}"
        return label

    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {
            "mode": self.mode,
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
            "weight_type": self.weight_type,
        }
        if self.calibrated:
            opts.update(
                activation_type=self.activation_type,
                method=self.method,
                calibration_samples=len(self.calibration or []),
            )
        if self.op_types:
            opts["op_types"] = self.op_types
        if self.nodes_to_exclude:
            opts["nodes_to_exclude"] = self.nodes_to_exclude
        return opts

    def noise_settings(self) -> dict[str, Any] | None:
        """The weight settings its layers are ranked with by the noise dynamic INT8 adds at each
        (``passes.sensitivity``), or None where they rank otherwise (the calibrated modes: SQNR)."""
        if self.config.ranking != NOISE_RANKING:
            return None
        return {
            "per_channel": bool(self.per_channel),
            "reduce_range": bool(self.reduce_range),
            "weight_type": self.weight_type,
        }

    def with_excluded(self, nodes: Sequence[str]) -> QuantizePass:
        """The same pass, leaving ``nodes`` in float too (shares the prepared-model cache)."""
        return self._sibling(self.config.excluding(nodes))

    def _sibling(self, config: QuantizeOptions) -> QuantizePass:
        """A pass with ``config``, this one's calibration and extra options, sharing its prepared-model cache."""
        clone = QuantizePass(config, calibration=self.calibration, extra_options=self.extra_options)
        clone._prepared = self._prepared
        return clone

    def qdq_twin(self) -> QuantizePass:
        """The same quantization written as QDQ pairs on every op this one quantizes (QOperator ops hide their
        activations; a twin shows them for ranking its layers). Shares the prepared-model cache."""
        return self._sibling(replace(self.config, mode=QDQ, op_types=self.config.op_types or tuple(full_op_types())))

    def prepared(self, source: SourceModel) -> tuple[onnx.ModelProto, list[str]]:
        if source.sha256 not in self._prepared:
            self._prepared[source.sha256] = prepare(source.proto, preprocess=self.preprocess)
        return self._prepared[source.sha256]

    def op_types_for_mode(self) -> list[str] | None:
        if self.op_types:
            return self.op_types
        if self.mode == QDQ:
            return list(QDQ_OPS_DEFAULT)
        if self.mode == FULL:
            return full_op_types()
        return None  # ORT's defaults for dynamic / static

    def transform(self, source: SourceModel) -> Outcome:
        model, notes = self.prepared(source)
        if self.per_channel and self.config.qdq and _default_opset(model) < 13:
            # Per-axis QuantizeLinear/DequantizeLinear needs opset 13; older graphs are upgraded first.
            from onnx import version_converter

            try:
                model = version_converter.convert_version(model, 13)
                notes = [*notes, f"opset {_default_opset(source.proto)} upgraded to 13 for per-channel QDQ"]
            except Exception as exc:
                unknown = _unknown_to_onnx(model)
                why = (
                    f"ONNX's version converter has no schema for {', '.join(unknown)} (ORT ops a fusion wrote); "
                    "quantize before fusing"
                    if unknown
                    else f"ONNX's version converter failed: {exc}"
                )
                raise UsageError(
                    f"Per-channel QDQ needs opset 13 and this model (opset {_default_opset(model)}) "
                    f"could not be upgraded: {why}; or drop --per-channel."
                ) from None
        if self.per_channel and self.calibrated:
            work = onnx.ModelProto()
            work.CopyFrom(model)
            if flatten_gemm_biases(work):  # ORT's per-channel quantizers fail on [1, N] Gemm biases
                model = work
                notes = [
                    *notes,
                    "Gemm biases of shape [1, N] reshaped to [N] (ORT's per-channel quantizers fail on them)",
                ]
        with scratch_dir("ortpilot-quant-") as tmp:
            src, dst = Path(tmp) / "float.onnx", Path(tmp) / "quant.onnx"
            onnx.save(model, str(src))
            with capture_ort_output() as captured:
                self._quantize(src, dst, sum(1 for _ in graphs(model.graph)) > 1)
            for line in captured.log_lines + captured.warnings:
                log.debug("quantizer: %s", line)
            quantized = onnx.load(str(dst))
        count = quantized_node_count(quantized)
        if count == 0:
            ops = ", ".join(f"{k} {v}" for k, v in op_histogram(model).most_common(8))
            wanted = ", ".join(self.op_types_for_mode() or ["ORT's defaults"])
            raise NothingQuantizedError(
                f"Quantization ({self.mode}) changed nothing: no node of the op types it quantizes ({wanted}) has "
                f"quantizable weights or inputs (the model's ops: {ops}). No model was written. Weights held in "
                "Constant nodes are converted automatically; weights computed at run time cannot be quantized. "
                "Try another --mode, or optimize the model instead."
            )
        notes = [*notes, f"{count} node(s) quantized ({self.mode})"]
        if self.nodes_to_exclude:
            notes.append(f"left in float: {', '.join(self.nodes_to_exclude)}")
        return Outcome(
            quantized,
            notes=notes,
            level=None,
            providers=None,
            ep_specific=False,
            extra={"nodes_excluded": list(self.nodes_to_exclude)},
        )

    def _quantize(self, src: Path, dst: Path, has_subgraphs: bool = False) -> None:
        """ORT's quantizer on ``src``; what it raises comes back as a QuantizerError naming where."""
        extra = dict(self.extra_options)
        if self.mode in OPERATOR_MODES and has_subgraphs:
            extra.setdefault("EnableSubgraph", True)  # If/Loop bodies (silero-vad keeps its model in one)
        if self.calibrated and not self.calibration:
            raise UsageError(f"Quantization mode '{self.mode}' is calibrated: it needs calibration samples.")
        try:
            self._run_ort(src, dst, extra)
        except (OrtpilotError, MemoryError, OSError):
            raise  # ours (calibration inputs), or the machine's: they say what they are
        except Exception as exc:
            raise _quantizer_error("quantize_static" if self.calibrated else "quantize_dynamic", exc) from exc

    def _run_ort(self, src: Path, dst: Path, extra: dict[str, Any]) -> None:
        from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static

        from ortpilot.passes.calibration import reader_for

        if not self.calibrated:
            quantize_dynamic(
                str(src),
                str(dst),
                op_types_to_quantize=self.op_types_for_mode(),
                per_channel=self.per_channel,
                reduce_range=self.reduce_range,
                weight_type=_quant_type(self.weight_type),
                nodes_to_exclude=self.nodes_to_exclude,
                extra_options=extra,
            )
            return
        if self.mode == FULL:
            extra.setdefault("ForceQuantizeNoInputCheck", True)
        quantize_static(
            str(src),
            str(dst),
            reader_for(self.calibration),
            quant_format=QuantFormat.QOperator if self.mode == STATIC else QuantFormat.QDQ,
            op_types_to_quantize=self.op_types_for_mode(),
            per_channel=self.per_channel,
            reduce_range=self.reduce_range,
            activation_type=_quant_type(self.activation_type),
            weight_type=_quant_type(self.weight_type),
            nodes_to_exclude=self.nodes_to_exclude,
            calibrate_method=_method(self.method),
            extra_options=extra,
        )


__all__ = [
    "CALIBRATED_MODES",
    "METHODS",
    "QDQ_OPS_DEFAULT",
    "QUANT_TYPES",
    "WEIGHT_OPS",
    "NothingQuantizedError",
    "PrepareForQuantization",
    "QuantizePass",
    "QuantizerError",
    "constants_to_initializers",
    "flatten_gemm_biases",
    "full_op_types",
    "name_nodes",
    "prepare",
]
