"""What a text-model folder means: which task, which output, and what turns that output into the answer.

A folder with a ``tokenizer.json`` is a text model when its files say what it does:

- **embed** (a sentence encoder): sentence-transformers' files (``modules.json``,
  ``1_Pooling/config.json``, ``sentence_bert_config.json``), or an output named
  ``sentence_embedding``. Token vectors (``token_embeddings``/``last_hidden_state``,
  ``[batch, sequence, dim]``) are pooled as ``1_Pooling/config.json`` says and normalized when
  ``modules.json`` lists ``Normalize``; an output that already holds one vector per sentence
  (``sentence_embedding``, ``[batch, dim]``) is used as is.
- **rerank** (a cross-encoder): ``config.json`` says ``...ForSequenceClassification`` with one label;
  its input is a (query, document) pair, its score the logit through a sigmoid (or the
  ``sentence_transformers.activation_fn`` its config names).
- **classify**: ``...ForSequenceClassification`` with several labels (``id2label``); softmax over the
  logits (sigmoid for ``problem_type: multi_label_classification``).

A folder that says nothing about pooling is not guessed at (an embedding server that guessed CLS
for a mean-pooled model returned wrong vectors without a word): the caller names the pooling.
``TextTask`` is the frozen record of that reading, with where each fact came from; a profile
records it (``to_dict``/``from_dict``) so every process that loads the profile reads it the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ortpilot.data.folder import ModelFolder
from ortpilot.data.pooling import ACTIVATIONS, POOLING_MODES, pooling_modes
from ortpilot.errors import UsageError
from ortpilot.graph.outputs import OutputFacts

KINDS = ("embed", "rerank", "classify")
POOLED_NAMES = ("sentence_embedding", "sentence_embeddings")  # exports that pool inside the graph
TOKEN_NAMES = ("token_embeddings", "last_hidden_state")
LOGIT_NAMES = ("logits",)
NOT_POOLED = ("pooler_output",)  # BERT's pooler (dense + tanh on CLS): not a sentence embedding
# modules.json entries whose work ortpilot does itself (the Transformer is the ONNX graph).
APPLIED_MODULES = ("Transformer", "Pooling", "Normalize")
_ACTIVATION_NAMES = {"sigmoid": "sigmoid", "softmax": "softmax", "identity": "none"}


@dataclass(frozen=True)
class TextTask:
    """How text becomes feeds and outputs become answers, for one text model.

    ``output`` is the model output read; ``pooled`` says it already holds one vector per text
    (used as is) rather than token vectors to pool with ``pooling``. ``labels`` are the class
    names in id order (a cross-encoder has one); ``activation`` turns logits into scores.
    ``max_seq_length`` is where texts are truncated (None: no limit known). ``sources`` says which
    file gave each fact (``{"pooling": "1_Pooling/config.json", ...}``).
    """

    kind: str
    output: str
    pooled: bool = False
    pooling: tuple[str, ...] = ()
    normalize: bool = False
    max_seq_length: int | None = None
    lowercase: bool = False
    labels: tuple[str, ...] = ()
    activation: str = "none"
    sources: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"text task kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "embed" and not self.pooled and not self.pooling:
            raise ValueError("an embed task on token vectors needs a pooling mode")
        if any(m not in POOLING_MODES for m in self.pooling):
            raise ValueError(f"pooling {list(self.pooling)} is not made of {', '.join(POOLING_MODES)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.kind != "embed" and not self.labels:
            raise ValueError(f"a {self.kind} task needs its labels")
        if self.max_seq_length is not None and self.max_seq_length < 1:
            raise ValueError(f"max_seq_length must be positive, got {self.max_seq_length}")

    @property
    def source_of(self) -> dict[str, str]:
        return dict(self.sources)

    def describe(self) -> str:
        """One sentence: what the model does and where that was read."""
        said = self.source_of
        if self.kind == "embed":
            how = "used as is" if self.pooled else f"{'+'.join(self.pooling)} pooling of its token vectors"
            text = f"sentence embeddings from output '{self.output}' ({how}{', normalized' if self.normalize else ''})"
        elif self.kind == "rerank":
            text = f"relevance scores of (query, document) pairs from output '{self.output}' ({self.activation})"
        else:
            text = f"{len(self.labels)} labels ({', '.join(self.labels[:5])}{'...' * (len(self.labels) > 5)}) "
            text += f"from output '{self.output}' ({self.activation})"
        limit = f"; texts truncated at {self.max_seq_length} tokens" if self.max_seq_length else ""
        files = sorted(set(said.values()))
        return f"{text}{limit}{' (read from ' + ', '.join(files) + ')' if files else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "output": self.output,
            "pooled": self.pooled,
            "pooling": list(self.pooling),
            "normalize": self.normalize,
            "max_seq_length": self.max_seq_length,
            "lowercase": self.lowercase,
            "labels": list(self.labels),
            "activation": self.activation,
            "sources": dict(self.sources),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = "text task") -> TextTask:
        """Strictly: every field typed as ``to_dict`` writes it; anything else is a UsageError naming it."""
        if not isinstance(doc, Mapping):
            raise UsageError(f"{where} is not a JSON object; regenerate the file that holds it.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        missing = [k for k in ("kind", "output") if k not in doc]
        if unknown or missing:
            raise UsageError(
                f"{where} has {'unknown field(s) ' + ', '.join(unknown) if unknown else ''}"
                f"{' and ' if unknown and missing else ''}{'no ' + ', '.join(missing) if missing else ''}; "
                "regenerate the file that holds it."
            )
        checks = {
            "kind": str,
            "output": str,
            "pooled": bool,
            "pooling": list,
            "normalize": bool,
            "max_seq_length": (int, type(None)),
            "lowercase": bool,
            "labels": list,
            "activation": str,
            "sources": dict,
        }
        for key, value in doc.items():
            bad = not isinstance(value, checks[key]) or (key == "max_seq_length" and isinstance(value, bool))
            items = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else []
            if bad or any(not isinstance(item, str) for item in items):
                raise UsageError(f"{where}: field '{key}' holds {value!r}, not what ortpilot writes there.")
        values = dict(doc)
        values["pooling"] = tuple(values.get("pooling", ()))
        values["labels"] = tuple(values.get("labels", ()))
        values["sources"] = tuple(sorted((values.get("sources") or {}).items()))
        try:
            return cls(**values)
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}.") from None


def no_tokenizer_message(folder: ModelFolder, what: str = "embed") -> str:
    return (
        f"The model folder '{folder.root}' has no tokenizer.json; {what} needs one to turn text into token "
        "ids. Copy the tokenizer.json saved with the model into the folder (sentence-transformers and "
        "optimum-cli write it beside the model), or tokenize yourself and run the model on "
        "input_ids/attention_mask."
    )


def names_text_task(folder: ModelFolder, outputs: Sequence[OutputFacts]) -> bool:
    """Whether the folder's files (or the graph's outputs) say it holds a text model: sentence-transformers
    files, an output named ``sentence_embedding``, or a ``...ForSequenceClassification`` config (a server
    tells such a folder from a decoder's, which also has a tokenizer.json)."""
    archs = " ".join(str(a) for a in folder.get("architectures") or [])
    sentence_files = any(k in folder.values for k in ("pooling", "modules", "max_seq_length"))
    return sentence_files or any(o.name in POOLED_NAMES for o in outputs) or "ForSequenceClassification" in archs


def text_task(
    folder: ModelFolder, outputs: Sequence[OutputFacts], *, pooling: str | Sequence[str] | None = None
) -> TextTask:
    """The folder's text task for a model with these outputs (see the module docstring); ``pooling``
    replaces or supplies the pooling of token vectors. A folder that is no text model, or one whose
    files cannot be followed exactly, is a UsageError saying what is missing."""
    if folder.tokenizer_file is None:
        raise UsageError(no_tokenizer_message(folder, "a text model"))
    archs = " ".join(str(a) for a in folder.get("architectures") or [])
    sentence_files = any(k in folder.values for k in ("pooling", "modules", "max_seq_length"))
    by_name = {o.name: o for o in outputs}
    if sentence_files or any(n in by_name for n in POOLED_NAMES) or pooling is not None:
        return _embed_task(folder, outputs, pooling)
    if "ForSequenceClassification" in archs:
        return _scoring_task(folder, outputs)
    raise UsageError(
        f"The model folder '{folder.root}' does not say what its text model does: no sentence-transformers "
        "files (modules.json, 1_Pooling/config.json), no output named sentence_embedding, and config.json "
        f"names {'architectures ' + archs if archs else 'no architectures'}, not ...ForSequenceClassification. "
        "For a sentence encoder, add the 1_Pooling/config.json it was trained with or name the pooling "
        "(pooling='mean', 'cls', ...): guessing it gives wrong vectors without any error."
    )


LENGTH_KEYS = ("max_seq_length", "model_max_length")  # where a folder says texts are cut, in this order


def text_length_limit(folder: ModelFolder) -> int | None:
    """Where a deployment of the folder cuts a text (``max_seq_length``, else the tokenizer's
    ``model_max_length``, never past the position limit): what ``text_model`` and serving truncate at, so
    the length a tune's text samples are cut at too. None: no limit known."""
    return _limit(folder, LENGTH_KEYS)[0]


def _limit(folder: ModelFolder, keys: Sequence[str]) -> tuple[int | None, list[tuple[str, str]]]:
    """The first length limit the folder gives among ``keys``, capped at the position limit."""
    found = next((k for k in keys if folder.get(k) is not None), None)
    limit = folder.get(found) if found else None
    source = [("max_seq_length", folder.values[found].source)] if found else []
    positions = folder.get("max_positions")
    if positions is not None and (limit is None or positions < limit):
        limit, source = positions, [("max_seq_length", folder.values["max_positions"].source)]
    return limit, source


def _embed_task(folder: ModelFolder, outputs: Sequence[OutputFacts], pooling: str | Sequence[str] | None) -> TextTask:
    output, pooled = _embedding_output(folder, outputs)
    modules = [str(m) for m in folder.get("modules") or []]
    sources: list[tuple[str, str]] = []
    modes: tuple[str, ...] = ()
    if not pooled:
        others = [m for m in modules if m not in APPLIED_MODULES]
        if others:
            raise UsageError(
                f"modules.json in '{folder.root}' lists {', '.join(others)} after the transformer; ortpilot applies "
                f"only {', '.join(APPLIED_MODULES)}, so its vectors would differ from the model's. Export the model "
                "with its sentence_embedding output (the whole sentence-transformers pipeline in the graph)."
            )
        if pooling is not None:
            try:
                modes = pooling_modes(pooling)
            except ValueError as exc:
                raise UsageError(f"pooling: {exc}.") from None
            sources.append(("pooling", "pooling="))
        elif folder.get("pooling_modes"):
            modes = tuple(folder.get("pooling_modes"))
            sources.append(("pooling", folder.values["pooling_modes"].source))
        else:
            raise UsageError(
                f"The model folder '{folder.root}' has token vectors in output '{output}' but no "
                "1_Pooling/config.json saying how to pool them; add the one the model was trained with, or name "
                "the pooling (pooling='mean', 'cls', 'max', 'lasttoken', ...). Guessing gives wrong vectors "
                "without any error."
            )
    normalize = "Normalize" in modules
    if "modules" in folder.values:
        sources.append(("normalize", folder.values["modules"].source))
    limit, limit_source = _limit(folder, LENGTH_KEYS)
    lowercase = bool(folder.get("lowercase") or False)
    if "lowercase" in folder.values:
        sources.append(("lowercase", folder.values["lowercase"].source))
    return TextTask(
        "embed",
        output,
        pooled=pooled,
        pooling=modes,
        normalize=normalize,
        max_seq_length=limit,
        lowercase=lowercase,
        sources=tuple(sorted(sources + limit_source)),
    )


def _embedding_output(folder: ModelFolder, outputs: Sequence[OutputFacts]) -> tuple[str, bool]:
    """(output name, already pooled): a pooled output by name first, then token vectors, then the one
    float output of rank 2 (not BERT's pooler)."""
    floats = [o for o in outputs if o.floating]
    for name in POOLED_NAMES + TOKEN_NAMES:
        found = next((o for o in floats if o.name == name and o.rank in (None, 2 if name in POOLED_NAMES else 3)), None)
        if found:
            return found.name, name in POOLED_NAMES
    tokens = [o for o in floats if o.rank == 3]
    vectors = [o for o in floats if o.rank == 2 and o.name not in NOT_POOLED]
    if len(tokens) == 1:
        return tokens[0].name, False
    if not tokens and len(vectors) == 1:
        return vectors[0].name, True
    listed = ", ".join(f"{o.name}{o.describe_dims()}" for o in outputs) or "none"
    raise UsageError(
        f"The model in '{folder.root}' has no output ortpilot can read sentence embeddings from (outputs: "
        f"{listed}): it looks for sentence_embedding [batch, dim], or token vectors token_embeddings / "
        "last_hidden_state [batch, sequence, dim] (or a single output of that rank)."
    )


def _labels(folder: ModelFolder, width: int | None) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
    raw = folder.get("labels")
    if raw is None:
        if width is None:
            raise UsageError(
                f"config.json in '{folder.root}' has no id2label and the model's logits have no fixed width: "
                "the number of labels is unknown. Add id2label to config.json."
            )
        return tuple(f"LABEL_{i}" for i in range(width)), []
    ok = isinstance(raw, dict) and raw and all(isinstance(v, str) for v in raw.values())
    keys = sorted(int(k) for k in raw if str(k).isdigit()) if ok else []
    if not ok or keys != list(range(len(raw))):
        raise UsageError(
            f"config.json in '{folder.root}' gives id2label = {raw!r}; it must map the ids 0..N-1 to label names. "
            "Fix the file."
        )
    labels = tuple(raw[str(i)] for i in keys)
    if width is not None and width != len(labels):
        raise UsageError(
            f"config.json in '{folder.root}' names {len(labels)} labels (id2label), but the model's logits have "
            f"{width}: the files contradict each other. Fix id2label."
        )
    return labels, [("labels", folder.values["labels"].source)]


def _scoring_task(folder: ModelFolder, outputs: Sequence[OutputFacts]) -> TextTask:
    """A ...ForSequenceClassification folder: a cross-encoder (one label) or a classifier."""
    floats = [o for o in outputs if o.floating]
    logits = [o for o in floats if o.name in LOGIT_NAMES] or [o for o in floats if o.rank == 2]
    if len(logits) != 1 and not any(o.name in LOGIT_NAMES for o in logits):
        listed = ", ".join(f"{o.name}{o.describe_dims()}" for o in outputs) or "none"
        raise UsageError(
            f"The classifier in '{folder.root}' has no output ortpilot can read logits from (outputs: {listed}): "
            "it looks for logits [batch, labels]."
        )
    output = logits[0]
    labels, sources = _labels(folder, output.last_dim)
    kind = "rerank" if len(labels) == 1 else "classify"
    said = str(folder.get("activation") or "")
    name = said.rsplit(".", 1)[-1].lower()
    multi_label = folder.get("problem_type") == "multi_label_classification"
    if said and name in _ACTIVATION_NAMES:
        activation = _ACTIVATION_NAMES[name]
        sources.append(("activation", folder.values["activation"].source))
    elif said:
        raise UsageError(
            f"config.json in '{folder.root}' names the score function {said!r}; ortpilot applies Sigmoid, "
            "Softmax or Identity. Fix the file, or run the model yourself for its logits."
        )
    elif kind == "rerank" or multi_label:
        activation = "sigmoid"  # sentence-transformers' CrossEncoder default for one label
        if multi_label:
            sources.append(("activation", folder.values["problem_type"].source))
    else:
        activation = "softmax"
    limit, limit_source = _limit(folder, LENGTH_KEYS)
    lowercase = bool(folder.get("lowercase") or False)
    return TextTask(
        kind,
        output.name,
        labels=labels,
        activation=activation,
        max_seq_length=limit,
        lowercase=lowercase,
        sources=tuple(sorted(dict(sources + limit_source).items())),
    )


__all__ = [
    "APPLIED_MODULES",
    "KINDS",
    "LENGTH_KEYS",
    "POOLED_NAMES",
    "TOKEN_NAMES",
    "TextTask",
    "names_text_task",
    "no_tokenizer_message",
    "text_length_limit",
    "text_task",
]
