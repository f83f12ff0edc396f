"""What a decoder replica loads, decided once in the driver before Ray starts: ``prepare_decoder`` checks
the model, fuses it into GroupQueryAttention when it has none yet (content-addressed cache, so only the
first start pays), finds its tokenizer and refuses a decoder that cannot be batched, and returns the
``DecoderSpec`` record every replica receives. ``is_decoder_target`` is ``plan``'s test of a target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortpilot.errors import UsageError
from ortpilot.serve.options import DecoderOptions

MODEL_NAMES = ("model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx", "decoder.onnx")


@dataclass(frozen=True)
class DecoderSpec:
    """A served decoder: its URL name, the fused model a replica loads, its tokenizer, and the engine's limits."""

    name: str
    model: str  # the .onnx a replica loads (fused into GroupQueryAttention)
    tokenizer: str  # tokenizer.json
    source: str = ""
    options: DecoderOptions = field(default_factory=DecoderOptions)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> DecoderSpec:
        """The spec of its plain-data form (``to_dict``)."""
        return cls(
            **{**doc, "options": DecoderOptions.from_dict(doc.get("options")), "notes": tuple(doc.get("notes", ()))}
        )


def find_model_file(folder: Path) -> Path:
    """The decoder file in a model folder: a known name, else the only .onnx (also under onnx/)."""
    for base in (folder, folder / "onnx"):
        for name in MODEL_NAMES:
            if (base / name).is_file():
                return base / name
        found = sorted(base.glob("*.onnx")) if base.is_dir() else []
        if len(found) == 1:
            return found[0]
    raise UsageError(
        f"'{folder}' has no decoder model (looked for {', '.join(MODEL_NAMES)} or a single .onnx "
        "file, also under onnx/)."
    )


def is_decoder_target(source: str, tokenizer: str | None = None) -> bool:
    """Whether ``ortpilot serve`` serves ``source`` behind the OpenAI API: ``demo:decoder``, a folder
    without a profile that holds a tokenizer.json (unless it is a text-model folder: a model without a KV
    cache whose files say it embeds, reranks or classifies), or a model file with a KV cache (past inputs)."""
    if source == "demo:decoder":
        return True
    path = Path(source)
    if path.is_dir():
        if (path / "profile.json").is_file() or not (tokenizer is not None or (path / "tokenizer.json").is_file()):
            return False
        return not _text_folder(path)
    if not path.is_file() or path.suffix != ".onnx":
        return False
    from ortpilot.decode.signature import detect_signature
    from ortpilot.modelio import load_model

    try:
        return detect_signature(load_model(path, load_external_data=False)).has_cache
    except Exception:  # not readable as a decoder: the usual serve path reports what is wrong with it
        return False


def _text_folder(path: Path) -> bool:
    """A folder whose model has no KV cache and whose files say it is a text model (served over the Open
    Inference Protocol with its text endpoints); any folder that cannot be read so is left to the decoder path,
    which says what is wrong with it."""
    from ortpilot.data import resolve_model_folder
    from ortpilot.data.texttask import names_text_task
    from ortpilot.decode.signature import detect_signature
    from ortpilot.graph.outputs import output_facts
    from ortpilot.modelio import load_model

    try:
        folder = resolve_model_folder(path)
        model = load_model(folder.model_file, load_external_data=False)
        facts = output_facts(model)
    except Exception:  # not readable as a text folder: the decoder path reports what is wrong with it
        return False
    try:
        if detect_signature(model).has_cache:
            return False
    except Exception:  # no decoder's signature at all (an encoder's token_type_ids have no decoder role)
        pass
    return names_text_task(folder, facts)


def _locate(source: str) -> tuple[Path, str, list[Path]]:
    """(the model file, its default URL name, the folders its tokenizer may sit in) for ``source``."""
    if source.startswith("demo:"):
        from ortpilot.models import demo_model_path

        return Path(demo_model_path(source.split(":", 1)[1])), source.split(":", 1)[1], []
    path = Path(source)
    if path.is_dir():
        return find_model_file(path), path.resolve().name, [path, path.parent]
    if path.is_file():
        return path, path.stem, [path.parent, path.parent.parent]
    raise UsageError(
        f"'{source}' does not exist. Serve a decoder model file, a folder holding one with its "
        "tokenizer.json, or demo:decoder."
    )


def prepare_decoder(source: str, name: str | None = None, options: DecoderOptions | None = None) -> DecoderSpec:
    """Check ``source`` (a model file, a folder with a model and tokenizer, ``demo:decoder``) in the driver.

    A decoder without GroupQueryAttention is fused first (onnxscript, content-addressed cache, so
    only the first start pays); one that cannot be batched is a UsageError naming why, before
    any replica starts.
    """
    from ortpilot.decode.batched import check_batchable, check_kv_memory
    from ortpilot.decode.prepare import prepare
    from ortpilot.decode.scheduler import resolve_max_length
    from ortpilot.decode.signature import detect_signature
    from ortpilot.modelio import load_model

    options = options or DecoderOptions()
    path, default, folders = _locate(source)
    sig = detect_signature(load_model(path, load_external_data=False))  # not a decoder: say that first
    ready = prepare(
        source,
        path,
        tokenizer=options.tokenizer,
        folders=folders,
        fuse_attention=sig.has_cache and not sig.supports_shared_buffer,
        require_tokenizer=True,
    )
    if ready.cache_path is not None:
        path = ready.cache_path
        sig = detect_signature(ready.model)
    check_batchable(sig)
    check_kv_memory(sig, options.max_streams, resolve_max_length(sig, options.max_length))
    return DecoderSpec(name or default, str(path.resolve()), str(ready.tokenizer), source, options, ready.notes)


__all__ = ["MODEL_NAMES", "DecoderSpec", "find_model_file", "is_decoder_target", "prepare_decoder"]
