"""Each pass's options as one frozen record: what a pipeline step carries, a journal stores and a recipe asks.

A record holds the settings that decide a pass's output (never data: calibration samples are handed to
``Pass.from_options`` beside it), defines their defaults and choices once, normalises what it is given
(sequences become tuples) and refuses a bad setting with a ``UsageError`` (exit 2) before anything runs.

``to_dict()`` is the step's JSON form, the one tune journals have always held and a candidate's id
hashes: the fields in ``ALWAYS`` at any value, every other field only where it differs from its
default, under its JSON name (``ALIASES``: ``nodes_to_exclude`` is ``exclude`` there). ``from_dict``
reads that form back strictly (an unknown key is a ``UsageError``).

The record also answers what the rest of ortpilot asks of a recipe, so no layer tests mode names:
``calibrated`` (it needs calibration samples), ``ranking`` (how the auto-exclude loop ranks its layers:
``NOISE_RANKING`` or ``SQNR_RANKING``; None where it has no layers to rank) and ``cpu_only`` (its
model runs on the CPU EP alone). ``quantize_options(mode, **settings)`` picks the record of an
``ortpilot quantize --mode``.

This module imports no pass code (and nothing heavy): naming a step or building a command's options
loads neither ORT's quantizer nor its transformer optimizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, ClassVar

from ortpilot.errors import UsageError
from ortpilot.quantmodes import (
    CALIBRATED_MODES,
    DEFAULT_ACCURACY_LEVEL,
    DEFAULT_BLOCK_SIZE,
    DYNAMIC,
    FULL,
    INT4,
    INT8_MODES,
    OPENVINO_INT8,
    QDQ_MODES,
    WEIGHT_ONLY_BITS,
    WEIGHT_ONLY_MODES,
)

QUANT_TYPES = ("qint8", "quint8")  # INT8 weight and activation types (ORT's QuantType)
METHODS = ("minmax", "entropy", "percentile")  # calibration methods (ORT's CalibrationMethod)
DEFAULT_WEIGHT_TYPE = "qint8"
DEFAULT_ACTIVATION_TYPE = "quint8"
DEFAULT_METHOD = "minmax"
# "weights only" (a tune step's ``weights_only``): the op types whose second operand is a weight
# (MatMul with a constant B, which is ORT's default for dynamic mode, Gemm, Conv, and the fused
# Attention's packed QKV projection). Embedding Gathers stay float, and so do activation x activation products.
WEIGHT_OPS = ("MatMul", "Gemm", "Conv", "Attention")
OPENVINO_MODEL_TYPES = ("auto", "transformer", "cnn")  # NNCF's presets: auto picks one from the graph
ACTIVATION_RANGES = ("nncf", "minmax")  # how NNCF reads an activation's range from the calibration samples
QUANTIZE_MODES = (*INT8_MODES, OPENVINO_INT8, *WEIGHT_ONLY_MODES)
"""Every ``ortpilot quantize --mode``: ORT's INT8 modes, NNCF's INT8 for OpenVINO, the weight-only modes."""

NOISE_RANKING = "noise"  # dynamic INT8: layers by the noise each adds, measured on the calibration activations
SQNR_RANKING = "sqnr"  # calibrated INT8: layers by the SQNR lost at each, on the QDQ model the try built

# The decoder fusion checks its output on an empty-past prefill and a step with a filled past; the
# constant rotary tables it stores must cover those positions.
CHECK_TOKENS = 8  # prompt length of the empty-past check
CHECK_PAST = 5  # cached tokens of the second check
CHECK_NEW = 3  # new tokens of the second check
MIN_POSITIONS = max(CHECK_TOKENS, CHECK_PAST + CHECK_NEW)


class PassOptions:
    """What every pass's options record shares: the JSON form, and the recipe questions' defaults."""

    ALWAYS: ClassVar[tuple[str, ...]] = ()  # fields the JSON form names even at their defaults
    ALIASES: ClassVar[Mapping[str, str]] = {}  # field -> its key in the JSON form

    @property
    def calibrated(self) -> bool:
        """The pass's output depends on calibration samples (they must be given, and key its caches)."""
        return False

    @property
    def ranking(self) -> str | None:
        """How the auto-exclude loop ranks the layers of this pass's output (None: it has none to rank)."""
        return None

    @property
    def cpu_only(self) -> bool:
        """The pass writes ops only the CPU EP runs (a candidate on another provider cannot use it)."""
        return False

    def to_dict(self) -> dict[str, Any]:
        """The step's JSON form (module docstring)."""
        doc: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name in self.ALWAYS or value != _default(f):
                doc[self.ALIASES.get(f.name, f.name)] = list(value) if isinstance(value, tuple) else value
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Any:
        """The record a step's JSON form describes; an unknown key is a ``UsageError``."""
        names = {cls.ALIASES.get(f.name, f.name): f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(doc) - set(names))
        if unknown:
            raise UsageError(
                f"A {cls.__name__} step has unknown settings: {', '.join(map(str, unknown))} "
                f"(it takes {', '.join(names)})."
            )
        return cls(**{names[key]: value for key, value in doc.items()})


def _default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING


def _names(items: Iterable[str] | str | None) -> tuple[str, ...]:
    """Node or op names as a tuple (one name alone is one name, not its letters)."""
    if items is None:
        return ()
    if isinstance(items, str):
        return (items,)
    return tuple(str(i) for i in items)


def _set(record: Any, name: str, value: Any) -> None:
    object.__setattr__(record, name, value)


@dataclass(frozen=True)
class QuantizeOptions(PassOptions):
    """ORT's INT8 quantizer (``passes.quantize.QuantizePass``): ``mode`` one of ``INT8_MODES``.

    ``op_types``: the op types quantized (None: per mode, ORT's defaults for dynamic and static, the
    weighted and data-movement ops for qdq, every op ORT knows for full; ``WEIGHT_OPS`` is written
    ``weights_only`` in the JSON form). ``nodes_to_exclude``: nodes left in float. ``preprocess``:
    run ``quant_pre_process`` first (a tune quantizes models it prepared once, ``prepared=True``).
    """

    ALWAYS: ClassVar[tuple[str, ...]] = ("mode", "per_channel")
    ALIASES: ClassVar[Mapping[str, str]] = {"nodes_to_exclude": "exclude"}

    mode: str = DYNAMIC
    per_channel: bool = False
    reduce_range: bool = False  # 7-bit weights (CPUs without VNNI)
    weight_type: str = DEFAULT_WEIGHT_TYPE
    activation_type: str = DEFAULT_ACTIVATION_TYPE  # static, qdq and full
    method: str = DEFAULT_METHOD  # calibration method: static, qdq and full
    op_types: tuple[str, ...] | None = None
    nodes_to_exclude: tuple[str, ...] = ()
    preprocess: bool = True

    def __post_init__(self) -> None:
        if self.mode not in INT8_MODES:
            raise UsageError(f"Unknown quantization mode '{self.mode}'. Choose one of {', '.join(INT8_MODES)}.")
        for name in ("weight_type", "activation_type"):
            value = str(getattr(self, name)).lower()
            if value not in QUANT_TYPES:
                raise UsageError(f"Unknown quantization type '{getattr(self, name)}'; use qint8 or quint8.")
            _set(self, name, value)
        if self.method not in METHODS:
            raise UsageError(f"Unknown calibration method '{self.method}'; use one of {', '.join(METHODS)}.")
        _set(self, "op_types", _names(self.op_types) or None)
        _set(self, "nodes_to_exclude", _names(self.nodes_to_exclude))
        for name in ("per_channel", "reduce_range", "preprocess"):
            _set(self, name, bool(getattr(self, name)))

    @property
    def calibrated(self) -> bool:
        return self.mode in CALIBRATED_MODES

    @property
    def ranking(self) -> str:
        """Dynamic INT8 quantizes activations at run time: its layers are ranked by the noise each adds;
        the calibrated modes' by the SQNR lost at each QDQ pair."""
        return NOISE_RANKING if self.mode == DYNAMIC else SQNR_RANKING

    @property
    def cpu_only(self) -> bool:
        """Dynamic INT8 writes MatMulInteger / DynamicQuantizeLinear, which only the CPU EP has kernels for."""
        return self.mode == DYNAMIC

    @property
    def always_gated(self) -> bool:
        """``full`` leaves no float islands: it is gated even when no ``max_error`` was given."""
        return self.mode == FULL

    @property
    def qdq(self) -> bool:
        """Written as QuantizeLinear/DequantizeLinear pairs (per-channel scales then need opset 13)."""
        return self.mode in QDQ_MODES

    @property
    def weights_only(self) -> bool:
        return self.op_types == WEIGHT_OPS

    def excluding(self, nodes: Iterable[str]) -> QuantizeOptions:
        """The same settings with ``nodes`` left in float too."""
        return _excluding(self, nodes)

    def to_dict(self) -> dict[str, Any]:
        doc = super().to_dict()
        if self.weights_only:
            del doc["op_types"]
            doc["weights_only"] = True
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> QuantizeOptions:
        doc = dict(doc)
        if doc.pop("weights_only", False):
            if doc.get("op_types") is not None:
                raise UsageError("A quantize step gives both weights_only and op_types; give one.")
            doc["op_types"] = WEIGHT_OPS
        return super().from_dict(doc)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class OpenVINOInt8Options(PassOptions):
    """NNCF's INT8 for the OpenVINO EP (``passes.openvino_int8.OpenVINOInt8Pass``): ``model_type`` picks
    NNCF's preset (auto: the transformer preset for attention graphs); ``nodes_to_exclude`` stay float.

    The recipe: ``smooth_quant`` is SmoothQuant's alpha for the MatMuls of the transformer preset (how much of
    an activation channel's outliers move into the weights; None: NNCF's own, 0.95), ``activation_ranges`` how
    the activations' ranges are read from the calibration samples (``nncf``: NNCF's estimator for the preset;
    ``minmax``: the smallest and largest value seen). Which recipe keeps the worst sample accurate is the
    model's to say: a tune measures them (on MiniLM, 0.8 with min-max ranges held the worst of 1,000 real
    sentences at 0.0047-0.0059 cosine error where NNCF's own recipe left 0.013-0.015)."""

    ALIASES: ClassVar[Mapping[str, str]] = {"nodes_to_exclude": "exclude"}
    mode: ClassVar[str] = OPENVINO_INT8  # ``ortpilot quantize --mode openvino``

    model_type: str = "auto"
    nodes_to_exclude: tuple[str, ...] = ()
    fast_bias_correction: bool = True
    smooth_quant: float | None = None
    activation_ranges: str = "nncf"

    def __post_init__(self) -> None:
        if self.model_type not in OPENVINO_MODEL_TYPES:
            raise UsageError(
                f"Unknown model type '{self.model_type}' for OpenVINO INT8; choose one of {OPENVINO_MODEL_TYPES}."
            )
        _set(self, "nodes_to_exclude", _names(self.nodes_to_exclude))
        alpha = self.smooth_quant
        if alpha is not None:
            if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
                raise UsageError(f"smooth_quant is SmoothQuant's alpha, a number from 0 to 1; got {alpha!r}.")
            _set(self, "smooth_quant", float(alpha))
        if self.activation_ranges not in ACTIVATION_RANGES:
            raise UsageError(
                f"Unknown activation ranges '{self.activation_ranges}' for OpenVINO INT8; "
                f"choose one of {', '.join(ACTIVATION_RANGES)}."
            )

    @property
    def calibrated(self) -> bool:
        return True

    @property
    def ranking(self) -> str:
        # NNCF writes QDQ pairs, but ORT's activation matching (the SQNR ranking) finds none of them: it matches by
        # its own QDQ tensor names. Its layers rank by the noise dynamic INT8 adds at each (a proxy: on MiniLM both
        # put the feed-forward projections first).
        return NOISE_RANKING

    def excluding(self, nodes: Iterable[str]) -> OpenVINOInt8Options:
        return _excluding(self, nodes)


def _excluding(record: Any, nodes: Iterable[str]) -> Any:
    kept = record.nodes_to_exclude
    return replace(record, nodes_to_exclude=(*kept, *(n for n in nodes if n not in kept)))


@dataclass(frozen=True)
class FusionOptions(PassOptions):
    """ORT's transformer fusions (``passes.fusion.FusionPass``): ``model_type`` one of
    ``onnxruntime.transformers``' types or auto (checked where the pass imports them); ``num_heads`` and
    ``hidden_size`` 0 let the optimizer (or the model folder's config.json) size the attention.
    ``skip_layer_norm`` False leaves each residual Add and its LayerNormalization apart instead of fusing them
    into SkipLayerNormalization. Which runs faster is the CPU kernels' to say (ORT 1.32, AMD EPYC VNNI, MiniLM
    INT8 on real sentences: the same one per call, the two ops 0.99-1.25x faster at 32 per call), so the tune
    measures both (``tuning.space.fusion_knobs``)."""

    ALWAYS: ClassVar[tuple[str, ...]] = ("model_type", "num_heads", "hidden_size")

    model_type: str = "auto"
    num_heads: int = 0
    hidden_size: int = 0
    skip_layer_norm: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.skip_layer_norm, bool):
            raise UsageError(f"skip_layer_norm must be true or false, got {self.skip_layer_norm!r}.")
        _set(self, "model_type", str(self.model_type))
        for name in ("num_heads", "hidden_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 0:
                raise UsageError(f"{name} must be a whole number >= 0 (0: detect it), got {value!r}.")
            _set(self, name, int(value))


@dataclass(frozen=True)
class DecoderFusionOptions(PassOptions):
    """onnxscript's decoder fusion into GroupQueryAttention (``passes.decoder_fusion.DecoderFusionPass``):
    the fused model must match the source within ``atol + rtol x scale``; ``pack`` joins weight MatMuls
    that read one input; ``max_positions`` rows of constant rotary tables (None: the export's recorded
    context length, else 8192; 0 keeps them computed per step, with no length limit)."""

    atol: float = 1e-3
    rtol: float = 1e-3
    seed: int = 0
    pack: bool = True
    max_positions: int | None = None

    def __post_init__(self) -> None:
        positions = self.max_positions
        if positions is not None and (positions < 0 or 0 < positions < MIN_POSITIONS):
            raise UsageError(
                f"max_positions must be 0 (keep the rotary tables computed) or at least {MIN_POSITIONS} "
                f"(the fusion's output check runs {MIN_POSITIONS} positions), got {positions}."
            )


@dataclass(frozen=True)
class WeightOnlyOptions(PassOptions):
    """Weight-only MatMulNBits (``passes.weight_only.WeightOnlyPass``): ``mode`` one of ``WEIGHT_ONLY_MODES``;
    ``block_size`` weights per block (a power of two, >= 16); ``accuracy_level`` the CPU kernel's compute
    type (4: int8, fast with VNNI; None: ORT's); ``embedding`` the 4-bit embedding Gather too;
    ``nodes_to_exclude`` stay float and ``nodes_in_int8`` stay 8-bit (4-bit mode's mixed precision)."""

    ALWAYS: ClassVar[tuple[str, ...]] = ("mode",)

    mode: str = INT4
    block_size: int = DEFAULT_BLOCK_SIZE
    symmetric: bool = True
    accuracy_level: int | None = DEFAULT_ACCURACY_LEVEL
    embedding: bool = True
    nodes_to_exclude: tuple[str, ...] = ()
    nodes_in_int8: tuple[str, ...] = ()
    pack: bool = True

    def __post_init__(self) -> None:
        if self.mode not in WEIGHT_ONLY_BITS:
            raise UsageError(f"Unknown weight-only mode '{self.mode}'; choose one of {', '.join(WEIGHT_ONLY_MODES)}.")
        size = self.block_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 16 or size & (size - 1):
            raise UsageError(
                f"--block-size must be a power of two and at least 16 (MatMulNBits needs that); got {size}."
            )
        if self.accuracy_level is not None and self.accuracy_level not in (0, 1, 2, 3, 4):
            raise UsageError(
                f"--accuracy-level must be 0..4 (4 = int8 compute, 1 = fp32 compute); got {self.accuracy_level}."
            )
        excluded = tuple(sorted(set(_names(self.nodes_to_exclude))))
        _set(self, "nodes_to_exclude", excluded)
        _set(self, "nodes_in_int8", tuple(sorted(set(_names(self.nodes_in_int8)) - set(excluded))))

    @property
    def bits(self) -> int:
        return WEIGHT_ONLY_BITS[self.mode]

    @property
    def quantizes_embedding(self) -> bool:
        """The embedding Gather is quantized only in 4 bits (the quantizer's GatherBlockQuantized path)."""
        return self.embedding and self.bits == 4


@dataclass(frozen=True)
class NoOptions(PassOptions):
    """A pass that takes no options (``PrepareForQuantization``)."""


@dataclass(frozen=True)
class RawOptions(PassOptions):
    """The options of a pass with no record of its own (one ``registry.register`` added), kept as given:
    its ``Pass.from_options`` receives them as keywords."""

    values: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _set(self, "values", dict(self.values))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.values)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RawOptions:
        return cls(doc)


QuantizeModeOptions = QuantizeOptions | OpenVINOInt8Options | WeightOnlyOptions
"""What ``ortpilot quantize`` quantizes with: the record of its ``--mode``."""


def quantize_options(mode: str, **settings: Any) -> QuantizeModeOptions:
    """The record of ``ortpilot quantize --mode MODE`` with ``settings`` (its fields). A setting only another
    mode takes is refused (``UsageError`` naming its flag) unless it is at that mode's default."""
    if mode in INT8_MODES:
        record: type[PassOptions] = QuantizeOptions
        settings["mode"] = mode
        what = "is ORT's INT8 quantizer"
    elif mode == OPENVINO_INT8:
        record = OpenVINOInt8Options
        what = "takes NNCF's own quantization settings"
    elif mode in WEIGHT_ONLY_MODES:
        record = WeightOnlyOptions
        settings["mode"] = mode
        what = "quantizes weights only (MatMulNBits)"
    else:
        raise UsageError(f"Unknown quantization mode '{mode}'. Choose one of {', '.join(QUANTIZE_MODES)}.")
    own = {f.name for f in fields(record)}  # type: ignore[arg-type]
    others = {
        f.name: _default(f)
        for other in (QuantizeOptions, OpenVINOInt8Options, WeightOnlyOptions)
        for f in fields(other)
        if f.name not in own
    }
    unknown = sorted(k for k in settings if k not in own and k not in others)
    if unknown:
        raise UsageError(f"Unknown quantize settings: {', '.join(unknown)}.")
    refused = sorted(k for k, v in settings.items() if k in others and v not in (None, others[k]))
    if refused:
        flags = ", ".join("--" + k.replace("_", "-") for k in refused)
        hint = " (use --exclude NODE to leave nodes in float)" if mode == OPENVINO_INT8 else ""
        raise UsageError(f"--mode {mode} {what}; {flags} do(es) not apply to it{hint}.")
    return record(**{k: v for k, v in settings.items() if k in own})  # type: ignore[return-value]


__all__ = [
    "ACTIVATION_RANGES",
    "DEFAULT_ACTIVATION_TYPE",
    "DEFAULT_METHOD",
    "DEFAULT_WEIGHT_TYPE",
    "METHODS",
    "MIN_POSITIONS",
    "NOISE_RANKING",
    "OPENVINO_MODEL_TYPES",
    "QUANTIZE_MODES",
    "QUANT_TYPES",
    "SQNR_RANKING",
    "WEIGHT_OPS",
    "DecoderFusionOptions",
    "FusionOptions",
    "NoOptions",
    "OpenVINOInt8Options",
    "PassOptions",
    "QuantizeModeOptions",
    "QuantizeOptions",
    "RawOptions",
    "WeightOnlyOptions",
    "quantize_options",
]
