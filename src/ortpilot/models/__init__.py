"""Built-in demo models, generated in code (no downloads).

They give tests, ``ortpilot tune`` without a model and ``ortpilot demo-models`` something
realistic to run in milliseconds on a small CPU: an MLP, a Conv+BN CNN, a BERT-style
encoder that ORT's transformer optimizer fuses like a real BERT, and a Llama-style decoder
with a KV cache that onnxscript fuses into GroupQueryAttention; and text-model folders around
the encoder (``text_folder``: a sentence encoder, a cross-encoder, a classifier, with a WordPiece
``tokenizer.json``). Every model is
deterministic in its seed (byte-identical for equal seeds and code), IR version
``SAFE_IR_VERSION`` and opset ``DEFAULT_OPSET``.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ortpilot.artifacts.atomic import save_model
from ortpilot.errors import UsageError
from ortpilot.modelio import DEFAULT_OPSET, SAFE_IR_VERSION
from ortpilot.models.cnn import make_cnn
from ortpilot.models.decoder import make_decoder
from ortpilot.models.encoder import make_encoder
from ortpilot.models.mlp import make_mlp
from ortpilot.models.textfolder import TEXT_KINDS, text_folder

__all__ = [
    "BUILDER_VERSION",
    "DEMO_MODELS",
    "DEMO_SPECS",
    "TEXT_KINDS",
    "DemoSpec",
    "builder_hash",
    "demo_model_path",
    "demo_tokenizer_path",
    "make_cnn",
    "make_decoder",
    "make_encoder",
    "make_mlp",
    "text_folder",
    "write_demo_models",
    "write_demo_text_folders",
    "write_demo_tokenizer",
]

# Bump when a builder changes in a way its source hash would not show (e.g. a dependency).
BUILDER_VERSION = 1

DEMO_MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "mlp": make_mlp,
    "cnn": make_cnn,
    "encoder": make_encoder,
    "decoder": make_decoder,
}


@dataclass(frozen=True)
class DemoSpec:
    """What a caller needs to run a demo model without reading its graph.

    ``dims`` are suggested values for the named dynamic dimensions (consistent with each
    other: for the decoder ``total_sequence == past_sequence + sequence``). ``config`` holds
    architecture numbers (layers, heads, ...) of the default build; ``model_type`` is the
    ``onnxruntime.transformers`` model type where one applies.
    """

    name: str
    description: str
    dims: Mapping[str, int]
    config: Mapping[str, int | float] = field(default_factory=dict)
    model_type: str | None = None


DEMO_SPECS: dict[str, DemoSpec] = {
    "mlp": DemoSpec("mlp", "MLP classifier, x[batch,64] -> y[batch,10] (Gemm, MatMul+Add, Relu)", {"batch": 1}),
    "cnn": DemoSpec(
        "cnn",
        "CNN classifier, image[batch,3,32,32] -> logits[batch,10] "
        "(Conv+BatchNormalization+Relu blocks, MaxPool, GlobalAveragePool, Gemm)",
        {"batch": 1},
    ),
    "encoder": DemoSpec(
        "encoder",
        "BERT-style encoder, 2 layers, hidden 128, 4 heads, vocab 1000; fuses into "
        "EmbedLayerNormalization/Attention/SkipLayerNormalization/BiasGelu",
        {"batch": 1, "sequence": 128},
        {"num_layers": 2, "hidden_size": 128, "num_heads": 4, "head_dim": 32, "vocab_size": 1000, "max_positions": 512},
        model_type="bert",
    ),
    "decoder": DemoSpec(
        "decoder",
        "Llama-style decoder with KV cache, 2 layers, hidden 64, 4 heads, 2 KV heads, "
        "vocab 256; fuses into GroupQueryAttention with onnxscript",
        {"batch": 1, "sequence": 16, "past_sequence": 112, "total_sequence": 128},
        {
            "num_layers": 2,
            "hidden_size": 64,
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_dim": 16,
            "vocab_size": 256,
            "max_positions": 2048,
        },
        model_type="llama",
    ),
}


def _spec(name: str) -> DemoSpec:
    if name not in DEMO_SPECS:
        raise UsageError(f"Unknown demo model '{name}'. Valid names: {', '.join(DEMO_MODELS)}.")
    return DEMO_SPECS[name]


def write_demo_models(outdir: str | Path) -> dict[str, Path]:
    """Build every demo model (seed 0) and write ``<outdir>/<name>.onnx`` atomically."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    return {name: save_model(build(), out / f"{name}.onnx") for name, build in DEMO_MODELS.items()}


def write_demo_tokenizer(outdir: str | Path) -> Path:
    """The demo decoder's byte-level ``tokenizer.json`` (and ``tokenizer_config.json``) in ``outdir``."""
    from ortpilot.models.tokenizer import write_byte_tokenizer

    return write_byte_tokenizer(outdir)


def write_demo_text_folders(outdir: str | Path) -> dict[str, Path]:
    """The three demo text folders (``text_folder``) as ``<outdir>/text-<kind>/``; needs ``tokenizers``."""
    return {f"text-{kind}": text_folder(Path(outdir) / f"text-{kind}", kind) for kind in TEXT_KINDS}


def demo_tokenizer_path() -> Path:
    """``tokenizer.json`` of the demo decoder, built once into ``<cache root>/demo/tokenizer-HASH/``."""
    from ortpilot.artifacts.cache import cache_root
    from ortpilot.models import tokenizer

    try:
        import tokenizers
    except ImportError:
        tokenizer.make_byte_tokenizer()  # raises the message that names the package
        raise
    digest = hashlib.sha256(f"{tokenizers.__version__}|".encode() + Path(tokenizer.__file__).read_bytes())
    folder = cache_root() / "demo" / f"tokenizer-{digest.hexdigest()[:16]}"
    path = folder / tokenizer.TOKENIZER_FILE
    if not (path.is_file() and (folder / tokenizer.CONFIG_FILE).is_file()):
        tokenizer.write_byte_tokenizer(folder)
    return path


def builder_hash(name: str) -> str:
    """Hash of everything that decides the bytes of demo model ``name``: its builder's source,
    the shared graph helper, the IR/opset constants and ``BUILDER_VERSION``."""
    _spec(name)
    builder = DEMO_MODELS[name]
    digest = hashlib.sha256(f"{name}|{BUILDER_VERSION}|{SAFE_IR_VERSION}|{DEFAULT_OPSET}|{onnx.__version__}".encode())
    for module_name in (builder.__module__, "ortpilot.models._graph"):
        source = getattr(sys.modules.get(module_name), "__file__", None)
        if source and Path(source).is_file():
            digest.update(Path(source).read_bytes())
    return digest.hexdigest()[:16]


def demo_model_path(name: str) -> Path:
    """Path of demo model ``name`` (seed 0), built once into the per-user cache.

    The cache lives in ``<cache root>/demo/`` (``$ORTPILOT_CACHE_DIR``, else
    ``~/.cache/ortpilot``); the file name carries :func:`builder_hash`, so changed builder
    code gets a fresh file instead of a stale one.
    """
    _spec(name)
    from ortpilot.artifacts.cache import cache_root

    path = cache_root() / "demo" / f"{name}-{builder_hash(name)}.onnx"
    if not path.is_file():
        save_model(DEMO_MODELS[name](), path)
    return path
