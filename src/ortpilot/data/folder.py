"""Model folders as users have them: which ``.onnx`` file is the model, and what the files beside it say.

Three layouts, and a bare folder:

- **onnxruntime-genai**: ``genai_config.json`` names the decoder's file (``model.decoder.filename``).
- **Hugging Face repository with an ``onnx/`` subfolder**: ``onnx/model.onnx``,
  ``onnx/model_quantized.onnx``, ``onnx/model_q4.onnx``, ... beside the root's ``config.json``.
- **optimum-cli export**: ``model.onnx`` (or ``encoder_model.onnx`` / ``decoder_model_merged.onnx``
  ...) beside ``config.json`` and ``tokenizer.json``.
- **bare**: a folder with ``.onnx`` files and nothing else.

One ``.onnx`` file is the model; several are a choice ortpilot does not guess (exit 2 listing
them; ``model_file`` / ``--model-file NAME`` chooses). Besides the model, the folder is read
for what the tools need, and every value keeps the file it came from: ``config.json``
(``model_type``, heads, hidden size, KV heads, position limit, labels), ``genai_config.json``,
``tokenizer.json``, ``preprocessor_config.json``, and a sentence-transformers model's files:
``1_Pooling/config.json`` (pooling), ``sentence_bert_config.json`` (``max_seq_length``,
``do_lower_case``), ``modules.json`` (its modules: whether ``Normalize`` follows the pooling).
``data.texttask`` turns those into what a text model does. Contradictions that would make a tool wrong (heads that do not
divide the hidden size) are refused here, before a fusion uses them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortpilot.data.pooling import POOLING_ORDER
from ortpilot.errors import UsageError

# config.json keys read, and the name each is known by here.
CONFIG_KEYS = {
    "model_type": "model_type",
    "num_attention_heads": "num_heads",
    "hidden_size": "hidden_size",
    "num_key_value_heads": "num_kv_heads",
    "max_position_embeddings": "max_positions",
    "architectures": "architectures",
    "id2label": "labels",
    "problem_type": "problem_type",
}
POOLING_MODES = (
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)
POOLING_FOLDER = "1_Pooling"
MODULE_PREFIX = "sentence_transformers.models."
# The largest model_max_length tokenizer_config.json may give that means a limit (transformers writes 1e30 for none).
MAX_SANE_LENGTH = 1_000_000
MAX_JSON_BYTES = 8 * 2**20  # configs are a few KB; a tokenizer.json can be a few MB and is read by tokenizers


@dataclass(frozen=True)
class Value:
    """One fact read from the folder, and the file it came from (relative to the folder)."""

    value: Any
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source}


@dataclass
class ModelFolder:
    """A model folder: the chosen model file, its layout, and what the files beside it say."""

    root: Path
    model_file: Path
    layout: str  # genai | hf-onnx | optimum | bare
    candidates: list[str] = field(default_factory=list)  # every .onnx the layout offered
    values: dict[str, Value] = field(default_factory=dict)
    tokenizer_file: Path | None = None
    preprocessor: dict[str, Any] | None = None
    preprocessor_file: Path | None = None

    def get(self, key: str, default: Any = None) -> Any:
        item = self.values.get(key)
        return default if item is None else item.value

    @property
    def task(self) -> str:
        """What the folder says the model does: ``sentence-embedding``, ``classifier``, ``decoder`` or ``""``."""
        if "pooling" in self.values:
            return "sentence-embedding"
        archs = " ".join(self.get("architectures") or [])
        if self.get("labels") or any(
            s in archs for s in ("ForSequenceClassification", "ForImageClassification", "ForAudioClassification")
        ):
            return "classifier"
        if "genai" in self.values or any(s in archs for s in ("ForCausalLM", "LMHeadModel")):
            return "decoder"
        if "ForTokenClassification" in archs:
            return "token-classifier"
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "layout": self.layout,
            "model_file": str(self.model_file),
            "candidates": list(self.candidates),
            "task": self.task,
            "tokenizer": str(self.tokenizer_file) if self.tokenizer_file else None,
            "preprocessor": str(self.preprocessor_file) if self.preprocessor_file else None,
            "values": {k: v.to_dict() for k, v in self.values.items()},
        }


def read_json_value(path: Path, what: str) -> Any:
    """A small JSON document from the folder; a damaged file is a UsageError naming it."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise UsageError(f"{what} '{path}' is larger than {MAX_JSON_BYTES // 2**20} MB; it is not a config file.")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{what} '{path}' cannot be read as JSON ({exc}). Fix or remove the file.") from None


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A small JSON object from the folder; a damaged file is a UsageError naming it."""
    doc = read_json_value(path, what)
    if not isinstance(doc, dict):
        raise UsageError(f"{what} '{path}' holds a JSON {type(doc).__name__}, not an object.")
    return doc


def is_model_folder(path: str | os.PathLike) -> bool:
    return Path(path).is_dir()


def _onnx_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.onnx") if p.is_file())


def _choose(folder: Path, names: list[str], model_file: str | None, layout: str, root: Path) -> Path:
    if model_file is not None:
        path = Path(model_file)
        chosen = path if path.is_absolute() else folder / path
        if not chosen.is_file() and (root / path).is_file():
            chosen = root / path
        if not chosen.is_file():
            raise UsageError(
                f"--model-file '{model_file}' is not in '{folder}'. The folder's models: {', '.join(names) or 'none'}."
            )
        return chosen
    if not names:
        raise UsageError(
            f"'{root}' is a folder with no .onnx model in it (looked in {folder}). Give the model "
            "file, or a folder exported by optimum-cli, a Hugging Face repository with an onnx/ "
            "subfolder, or an onnxruntime-genai folder."
        )
    if len(names) > 1:
        raise UsageError(
            f"'{root}' ({layout} layout) holds several models: {', '.join(names)}. Choose one with "
            f"--model-file NAME (Python: model_file=NAME), e.g. --model-file {names[0]}."
        )
    return folder / names[0]


def resolve_model_folder(path: str | os.PathLike, model_file: str | None = None) -> ModelFolder:
    """The model file of a folder and everything ortpilot reads beside it (see the module docstring)."""
    root = Path(path)
    if not root.is_dir():
        raise UsageError(f"'{root}' is not a folder.")
    values: dict[str, Value] = {}
    genai = root / "genai_config.json"
    if genai.is_file():
        doc = read_json(genai, "genai_config.json")
        decoder = (doc.get("model") or {}).get("decoder") or {}
        filename = decoder.get("filename")
        values["genai"] = Value(True, "genai_config.json")
        for key, name in (
            ("num_attention_heads", "num_heads"),
            ("hidden_size", "hidden_size"),
            ("num_key_value_heads", "num_kv_heads"),
        ):
            if key in decoder:
                values[name] = Value(decoder[key], "genai_config.json")
        if "context_length" in (doc.get("model") or {}):
            values["max_positions"] = Value(doc["model"]["context_length"], "genai_config.json")
        names = _onnx_files(root)
        if model_file is None and isinstance(filename, str):
            model_file = filename
        chosen, layout, folder = _choose(root, names, model_file, "onnxruntime-genai", root), "genai", root
    elif (root / "onnx").is_dir() and _onnx_files(root / "onnx"):
        folder, layout = root / "onnx", "hf-onnx"
        names = _onnx_files(folder)
        chosen = _choose(folder, names, model_file, "Hugging Face onnx/", root)
    else:
        folder = root
        names = _onnx_files(root)
        layout = "optimum" if (root / "config.json").is_file() else "bare"
        chosen = _choose(root, names, model_file, layout, root)
    config = root / "config.json"
    if config.is_file():
        doc = read_json(config, "config.json")
        for key, name in CONFIG_KEYS.items():
            if key in doc and name not in values:
                values[name] = Value(doc[key], "config.json")
        st = doc.get("sentence_transformers")  # a cross-encoder's score function (sentence-transformers >= 4)
        if isinstance(st, dict) and isinstance(st.get("activation_fn"), str):
            values["activation"] = Value(st["activation_fn"], "config.json")
    _read_sentence_transformers(root, values)
    tokenizer = next((p for p in (root / "tokenizer.json", folder / "tokenizer.json") if p.is_file()), None)
    pre_file = next(
        (p for p in (root / "preprocessor_config.json", folder / "preprocessor_config.json") if p.is_file()), None
    )
    pre = read_json(pre_file, "preprocessor_config.json") if pre_file else None
    result = ModelFolder(root, chosen, layout, names, values, tokenizer, pre, pre_file)
    _check_consistent(result)
    return result


def _read_sentence_transformers(root: Path, values: dict[str, Value]) -> None:
    """What a sentence-transformers model's own files say: its modules, pooling, length limit and
    lowercasing (and ``tokenizer_config.json``'s length limit, which a cross-encoder has instead)."""
    pooling_dir = POOLING_FOLDER
    modules = root / "modules.json"
    if modules.is_file():
        entries = _read_modules(modules)
        values["modules"] = Value([kind for kind, _ in entries], "modules.json")
        pooling_dir = next((path for kind, path in entries if kind == "Pooling" and path), pooling_dir)
    pooling = root / pooling_dir / "config.json"
    if pooling.is_file():
        name = f"{pooling_dir}/config.json"
        doc = read_json(pooling, name)
        modes = [m for m in POOLING_MODES if doc.get(m) is True]
        values["pooling"] = Value(modes[0].removeprefix("pooling_mode_") if modes else "mean_tokens", name)
        chosen = {m.removeprefix("pooling_mode_") for m in modes} or {"mean_tokens"}
        values["pooling_modes"] = Value([m for m in POOLING_ORDER if m in chosen], name)
    st_config = root / "sentence_bert_config.json"
    if st_config.is_file():
        doc = read_json(st_config, "sentence_bert_config.json")
        if doc.get("max_seq_length") is not None:
            values["max_seq_length"] = Value(doc["max_seq_length"], "sentence_bert_config.json")
        if "do_lower_case" in doc:
            values["lowercase"] = Value(doc["do_lower_case"], "sentence_bert_config.json")
    tok_config = root / "tokenizer_config.json"
    if tok_config.is_file():
        limit = read_json(tok_config, "tokenizer_config.json").get("model_max_length")
        if type(limit) is int and 0 < limit <= MAX_SANE_LENGTH:
            values["model_max_length"] = Value(limit, "tokenizer_config.json")


def _read_modules(path: Path) -> list[tuple[str, str]]:
    """``modules.json``: (type, path) per module, the type without ``sentence_transformers.models.``
    (``Transformer``, ``Pooling``, ``Normalize``, ``Dense``...); a path is kept only as a plain subfolder."""
    doc = read_json_value(path, "modules.json")
    if not isinstance(doc, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str) for m in doc):
        raise UsageError(
            f"modules.json '{path}' is not a list of modules with a 'type' each, as sentence-transformers "
            "writes it. Fix or remove the file."
        )
    entries = []
    for module in doc:
        sub = module.get("path")
        plain = isinstance(sub, str) and sub and Path(sub).name == sub and sub not in (".", "..")
        entries.append((module["type"].removeprefix(MODULE_PREFIX), sub if plain else ""))
    return entries


def _check_consistent(folder: ModelFolder) -> None:
    """Refuse what would make a fusion or a pad length silently wrong."""
    heads, hidden, kv = folder.get("num_heads"), folder.get("hidden_size"), folder.get("num_kv_heads")
    for name in ("num_heads", "hidden_size", "num_kv_heads", "max_positions", "max_seq_length"):
        value = folder.get(name)
        if value is not None and (type(value) is not int or value <= 0):
            raise UsageError(
                f"{folder.values[name].source} in '{folder.root}' gives {name} = {value!r}; it must be a "
                "positive integer. Fix the file."
            )
    lowercase = folder.get("lowercase")
    if lowercase is not None and not isinstance(lowercase, bool):
        raise UsageError(
            f"sentence_bert_config.json in '{folder.root}' gives do_lower_case = {lowercase!r}; it must be true "
            "or false. Fix the file."
        )
    if heads and hidden and hidden % heads:
        raise UsageError(
            f"{folder.values['num_heads'].source} in '{folder.root}' says num_attention_heads={heads} "
            f"and hidden_size={hidden}, but {heads} does not divide {hidden}: the files contradict each "
            "other (a fusion built from them would compute the wrong attention). Fix config.json."
        )
    if heads and kv and heads % kv:
        raise UsageError(
            f"'{folder.root}': num_key_value_heads={kv} does not divide num_attention_heads={heads}; fix config.json."
        )


def folder_of(path: str | os.PathLike) -> ModelFolder | None:
    """The model folder a model *file* sits in (beside ``config.json`` / ``genai_config.json``, or in
    the ``onnx/`` subfolder of one), with that file chosen; None for a file on its own. Passes that
    were handed the file (``FusionPass``, ``tune``) still read what its folder says. A folder whose
    files cannot be read gives None here: the file was given, not the folder."""
    p = Path(path)
    if p.is_dir():
        return resolve_model_folder(p)
    if not p.is_file() or p.suffix != ".onnx":
        return None
    roots = [p.parent] + ([p.parent.parent] if p.parent.name == "onnx" else [])
    for root in roots:
        names = (
            "config.json",
            "genai_config.json",
            "1_Pooling/config.json",
            "sentence_bert_config.json",
            "modules.json",
        )
        if any((root / name).is_file() for name in names):
            try:
                return resolve_model_folder(root, str(p.resolve()))
            except UsageError:
                return None
    return None


def model_path_of(path: str | os.PathLike, model_file: str | None = None) -> Path:
    """A model argument as a file: the file itself, or the model file of a folder."""
    p = Path(path)
    if p.is_dir():
        return resolve_model_folder(p, model_file).model_file
    if model_file is not None:
        raise UsageError(f"--model-file chooses a model inside a folder, but '{p}' is a file.")
    return p


__all__ = [
    "CONFIG_KEYS",
    "ModelFolder",
    "Value",
    "folder_of",
    "is_model_folder",
    "model_path_of",
    "read_json",
    "resolve_model_folder",
]
