"""A text model: strings in, sentence vectors, relevance scores or labels out, on one session.

``TextModel`` holds a session (an ortpilot ``VerifiedSession``, or anything with ORT's
``run(output_names, feeds)``, ``get_inputs()`` and ``get_outputs()``), the folder's ``TextTask``
and its tokenizer. One call tokenizes the whole list (one batch encode, truncation at the
task's limit, said per item), sorts the items by length, cuts them into runs of at most
``max_batch``, pads each run to its longest item (or to the smallest of ``lengths``, the length
buckets, that holds it) with attention mask 0 on the padding, runs, pools under that mask,
normalizes where the folder says so, and puts the results back in the caller's order. It is
built once (its own copy of the tokenizer configured then) and keeps no state between calls, so
a serving replica builds one and calls it from its run thread.

``text_task_of_profile`` reads what a tune recorded about the folder (``profile.json``'s
``text``: the task and the tokenizer copied beside the profile), so a profile embeds as its
folder did, on any machine that loads it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.data.folder import ModelFolder
from ortpilot.data.padding import RUN_COST_TOKENS, Batch, attention_mask, check_buckets, pad_ids, plan_batches
from ortpilot.data.pooling import activate, normalize, pool
from ortpilot.data.text import TEXT_INPUTS, load_tokenizer, pad_id
from ortpilot.data.textinput import Tokenized, check_texts, configure_tokenizer, tokenize
from ortpilot.data.texttask import TextTask, text_task
from ortpilot.errors import InputError, StampMismatchError, UsageError
from ortpilot.graph.outputs import OutputFacts

log = logging.getLogger("ortpilot")
DEFAULT_MAX_BATCH = 32
TOKENIZER_FILE = "tokenizer.json"
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(bfloat16)": None,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}
_KIND_USE = {
    "embed": "a sentence encoder: use embed(texts)",
    "rerank": "a cross-encoder: use rerank(query, documents)",
    "classify": "a sequence classifier: use classify(texts)",
}


def _dims(arg: Any) -> tuple[int | str | None, ...] | None:
    shape = getattr(arg, "shape", None)
    if shape is None:
        return None
    return tuple(d if isinstance(d, (int, str)) else None for d in shape)


def session_outputs(session: Any) -> list[OutputFacts]:
    """The session's outputs as ``OutputFacts`` (name, dtype, declared dims), from ORT's ``get_outputs()``."""
    facts = []
    for arg in session.get_outputs():
        dtype = _ORT_TYPES.get(str(getattr(arg, "type", "")))
        facts.append(OutputFacts(arg.name, np.dtype(dtype) if dtype is not None else None, _dims(arg)))
    return facts


def task_of_folder(folder: ModelFolder, session: Any, pooling: str | Sequence[str] | None = None) -> TextTask:
    """The folder's ``TextTask`` for the outputs this session returns."""
    return text_task(folder, session_outputs(session), pooling=pooling)


def text_task_of_profile(doc: Mapping[str, Any], profile_path: str | os.PathLike) -> tuple[TextTask, Path]:
    """(task, tokenizer file) a tune recorded in a profile's ``text`` section; the tokenizer must be the
    file beside the profile with the recorded sha256 (exit 1 when it is missing or changed)."""
    from ortpilot.modelio import file_sha256

    section = doc.get("text")
    if not section:
        raise UsageError(
            f"Profile '{profile_path}' records no text model: the tuned model was not a folder with a "
            "tokenizer.json and a task ortpilot reads (sentence-transformers files, or a sequence classifier's "
            "config.json), or the profile predates text models. Tune the model's folder (ortpilot tune FOLDER), "
            "or embed with the folder itself."
        )
    task = TextTask.from_dict(section["task"], f"Profile '{profile_path}' text.task")
    tokenizer = Path(profile_path).parent / section["tokenizer"]["file"]
    if not tokenizer.is_file():
        raise StampMismatchError(
            f"The tokenizer '{tokenizer}' named by profile '{profile_path}' is missing. Keep the tokenizer.json "
            "the tune wrote next to its profile, or re-run 'ortpilot tune'."
        )
    if file_sha256(tokenizer) != section["tokenizer"]["sha256"]:
        raise StampMismatchError(
            f"The tokenizer '{tokenizer}' changed since it was tuned (its sha256 is not the one profile "
            f"'{profile_path}' records): other token ids would reach the model. Restore it or re-run 'ortpilot tune'."
        )
    return task, tokenizer


@dataclass(frozen=True)
class TextRun:
    """What one call gave and did: ``values`` in the caller's order (``[n, dim]`` vectors, ``[n]`` scores or
    ``[n, labels]`` probabilities), the tokens each item kept (special tokens included: a reply's
    ``prompt_tokens``), which items truncation cut, and the runs (items and padded length each)."""

    values: np.ndarray
    tokens: tuple[int, ...]
    truncated: tuple[bool, ...]
    batches: tuple[Batch, ...]

    @property
    def fill(self) -> float:
        """The share of all padded positions that held real tokens (1.0: no padding)."""
        padded = sum(b.rows * b.length for b in self.batches)
        return sum(self.tokens) / padded if padded else 1.0


class TextModel:
    """Tokenize, batch by length, run, pool: the in-process core ``ortpilot.embed`` and the server share.

    ``tokenizer``: a ``tokenizers.Tokenizer`` or the path of a ``tokenizer.json`` (a copy is configured:
    the caller's object is not changed). ``max_batch``: the most texts in one run. ``lengths``: length
    buckets to pad up to (None: pad to the longest in each run). ``truncate``: cut texts longer than
    the task's limit (and say which), or refuse them (False); each call may override it. ``max_length``:
    a lower limit than the task's (a server's tokens per text), never a higher one. ``run_cost``: what
    one more run costs in padded tokens, where a call's texts are cut into runs (``plan_batches``; infinite:
    as few runs as ``max_batch`` allows, every text padded to its run's longest).

    A call is ``encode`` (check and tokenize) then ``run`` (batch, run, pool): a server tokenizes each
    request on its own and runs several requests' tokens in one ``run``.
    """

    def __init__(
        self,
        session: Any,
        task: TextTask,
        tokenizer: Any,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        lengths: Sequence[int] | None = None,
        truncate: bool = True,
        source: str = "",
        max_length: int | None = None,
        run_cost: float = RUN_COST_TOKENS,
    ) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise UsageError(f"max_batch must be a positive integer, got {max_batch!r}.")
        if isinstance(run_cost, bool) or not isinstance(run_cost, (int, float)) or not run_cost >= 0:
            raise UsageError(
                f"run_cost must be a number of tokens, 0 or more (math.inf: fewest runs), got {run_cost!r}."
            )
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2
        ):
            raise UsageError(
                f"max_length must be an integer of at least 2 (special tokens and a word), got {max_length!r}."
            )
        try:
            buckets = check_buckets(lengths)
        except ValueError as exc:
            raise UsageError(f"lengths: {exc}.") from None
        self.session = session
        self.task = task
        self.source = source or "the text model"
        self.truncate = bool(truncate)
        self._inputs = self._text_inputs(session)
        outputs = [o.name for o in session.get_outputs()]
        if task.output not in outputs:
            raise UsageError(
                f"{self.source} reads output '{task.output}', but the model returns {', '.join(outputs) or 'nothing'}; "
                "the task and the model do not belong together."
            )
        ids_dims = self._inputs["input_ids"][1]
        static_batch = ids_dims[0] if ids_dims and isinstance(ids_dims[0], int) and ids_dims[0] > 0 else None
        static_length = ids_dims[1] if len(ids_dims) > 1 and isinstance(ids_dims[1], int) and ids_dims[1] > 0 else None
        self.max_length = task.max_seq_length
        if static_length is not None:  # a model exported at one length takes that length only
            self.max_length = min(self.max_length or static_length, static_length)
            buckets = (static_length,)
        if max_length is not None:
            self.max_length = min(self.max_length or max_length, max_length)
        self.static_batch = static_batch
        self.max_batch = min(max_batch, static_batch) if static_batch else max_batch
        self.run_cost = math.inf if static_batch else float(run_cost)  # a static batch's run costs its full rows
        if "attention_mask" not in self._inputs:  # padding would be visible: every text runs alone, unpadded
            self.max_batch, buckets = 1, None
        self.lengths = buckets
        own = self._own_tokenizer(tokenizer)
        self.pad_id = pad_id(own)  # before its padding setting is switched off
        self.tokenizer = configure_tokenizer(own, self.max_length)

    # -- setup ---------------------------------------------------------------------------
    @staticmethod
    def _own_tokenizer(tokenizer: Any) -> Any:
        if isinstance(tokenizer, (str, os.PathLike)):
            return load_tokenizer(tokenizer)
        from tokenizers import Tokenizer

        return Tokenizer.from_str(tokenizer.to_str())

    def _text_inputs(self, session: Any) -> dict[str, tuple[np.dtype, tuple[int | str | None, ...]]]:
        """Each model input a tokenizer fills: its dtype and dims; any other input is a UsageError."""
        found: dict[str, tuple[np.dtype, tuple[int | str | None, ...]]] = {}
        unknown = []
        for arg in session.get_inputs():
            dtype = _ORT_TYPES.get(str(getattr(arg, "type", "")))
            if arg.name not in TEXT_INPUTS or dtype is None or not np.issubdtype(dtype, np.integer):
                unknown.append(f"{arg.name} ({getattr(arg, 'type', '?')})")
                continue
            found[arg.name] = (np.dtype(dtype), _dims(arg) or ())
        if unknown or "input_ids" not in found:
            raise UsageError(
                f"{self.source} takes {', '.join(unknown) or 'no input_ids'}, which text cannot fill: a text model's "
                f"inputs are integer {', '.join(TEXT_INPUTS)} (the tokenizer's ids, mask and type ids). Run this "
                "model with arrays instead (ortpilot.load(...).run)."
            )
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task.to_dict(),
            "inputs": sorted(self._inputs),
            "max_batch": self.max_batch,
            "lengths": list(self.lengths) if self.lengths else None,
            "max_length": self.max_length,
            "truncate": self.truncate,
        }

    # -- one call ------------------------------------------------------------------------
    def __call__(self, items: Sequence[str] | Sequence[tuple[str, str]], *, truncate: bool | None = None) -> TextRun:
        """The folder's task on ``items``: texts (embed, classify) or (query, document) pairs (rerank)."""
        return self.run(self.encode(items, truncate=truncate))

    def encode(self, items: Sequence[str] | Sequence[tuple[str, str]], *, truncate: bool | None = None) -> Tokenized:
        """``items`` checked and tokenized in one batch encode (an InputError names a bad item)."""
        if self.task.kind == "rerank":
            pairs = list(items)
            bad = next((i for i, p in enumerate(pairs) if not (isinstance(p, (tuple, list)) and len(p) == 2)), None)
            if bad is not None or not pairs:
                raise InputError(
                    f"{self.source} is a cross-encoder: it scores (query, document) pairs, and item "
                    f"{bad if bad is not None else 0} is not a pair of two strings. Use rerank(query, documents)."
                )
            firsts = check_texts([p[0] for p in pairs], "queries")
            seconds = check_texts([p[1] for p in pairs], "documents")
            return self._tokenize(list(zip(firsts, seconds)), truncate)
        return self._tokenize(check_texts(items), truncate)

    def run(self, tokens: Tokenized) -> TextRun:
        """The task on tokenized items: sorted by length, cut into runs of at most ``max_batch`` where padding
        costs more than a run (``plan_batches``), each padded to its longest item (or its bucket), run,
        pooled, and put back in the items' order."""
        batches = plan_batches(tokens.lengths, self.max_batch, self.lengths, self.run_cost)
        values: np.ndarray | None = None
        for batch in batches:
            result = self._run_batch(tokens, batch)
            if values is None:
                values = np.empty((len(tokens.ids), *result.shape[1:]), dtype=np.float32)
            values[list(batch.items)] = result
        assert values is not None
        return TextRun(values, tuple(tokens.lengths), tokens.truncated, tuple(batches))

    def _tokenize(self, items: Sequence[Any], truncate: bool | None) -> Tokenized:
        allow = self.truncate if truncate is None else bool(truncate)
        return tokenize(
            self.tokenizer, items, lowercase=self.task.lowercase, truncate=allow, max_length=self.max_length
        )

    def feeds(self, tokens: Tokenized, batch: Batch) -> dict[str, np.ndarray]:
        """The model's feeds for one run: ids padded to the batch's length, the mask, the type ids."""
        rows = list(batch.items)
        if self.static_batch and len(rows) < self.static_batch:  # fill a static batch with copies, dropped after
            rows += [rows[0]] * (self.static_batch - len(rows))
        lengths = [len(tokens.ids[i]) for i in rows]
        feeds = {}
        for name, (dtype, _) in self._inputs.items():
            if name == "input_ids":
                feeds[name] = pad_ids([tokens.ids[i] for i in rows], batch.length, self.pad_id, dtype)
            elif name == "token_type_ids":
                feeds[name] = pad_ids([tokens.type_ids[i] for i in rows], batch.length, 0, dtype)
            else:
                feeds[name] = attention_mask(lengths, batch.length, dtype)
        return feeds

    def _run_batch(self, tokens: Tokenized, batch: Batch) -> np.ndarray:
        feeds = self.feeds(tokens, batch)
        (value,) = self.session.run([self.task.output], feeds)
        value = np.asarray(value)[: batch.rows]
        task = self.task
        if task.kind == "embed":
            if task.pooled:
                vectors = self._expect(value, 2, "[batch, dim]").astype(np.float32)
            else:
                tokens_out = self._expect(value, 3, "[batch, sequence, dim]")
                mask = feeds.get("attention_mask")
                mask = mask[: batch.rows] if mask is not None else np.ones(tokens_out.shape[:2], np.int64)
                vectors = pool(tokens_out, mask, task.pooling)
            return normalize(vectors) if task.normalize else vectors
        logits = self._expect(value, 2, "[batch, labels]")
        if logits.shape[1] != len(task.labels):
            raise UsageError(
                f"{self.source}'s output '{task.output}' has {logits.shape[1]} logits per text, but the folder names "
                f"{len(task.labels)} label(s); config.json's id2label and the model disagree."
            )
        scores = activate(logits, task.activation)
        return scores[:, 0] if task.kind == "rerank" else scores

    def _expect(self, value: np.ndarray, rank: int, layout: str) -> np.ndarray:
        if value.ndim != rank:
            raise UsageError(
                f"{self.source}'s output '{self.task.output}' has shape {list(value.shape)}, not {layout}: it is "
                "not the output this task reads."
            )
        return value

    # -- the three tasks -----------------------------------------------------------------
    def check_kind(self, kind: str) -> None:
        """A UsageError unless this model does ``kind`` (embed, rerank, classify), naming what it does."""
        if self.task.kind != kind:
            raise UsageError(f"{self.source} is {_KIND_USE[self.task.kind]}; it does not {kind}.")

    def _say_truncated(self, run: TextRun) -> None:
        cut = sum(run.truncated)
        if cut:
            log.warning(
                "%d of %d text(s) were longer than %s tokens and were truncated (pass truncate=False to refuse them).",
                cut,
                len(run.truncated),
                self.max_length,
            )

    def embed(self, texts: Sequence[str], *, truncate: bool | None = None) -> np.ndarray:
        """``[len(texts), dim]`` float32 sentence vectors (unit length where the folder normalizes)."""
        self.check_kind("embed")
        run = self(texts, truncate=truncate)
        self._say_truncated(run)
        return run.values

    def rerank(self, query: str, documents: Sequence[str], *, truncate: bool | None = None) -> np.ndarray:
        """``[len(documents)]`` float32 relevance scores of each document for the query (higher: more relevant)."""
        self.check_kind("rerank")
        (query,) = check_texts([query], "query")
        docs = check_texts(documents, "documents")
        run = self([(query, d) for d in docs], truncate=truncate)
        self._say_truncated(run)
        return run.values

    def classify(self, texts: Sequence[str], *, truncate: bool | None = None) -> list[tuple[str, float]]:
        """The most likely label of each text and its score."""
        self.check_kind("classify")
        run = self(texts, truncate=truncate)
        self._say_truncated(run)
        best = run.values.argmax(axis=1)
        return [(self.task.labels[int(b)], float(run.values[i, b])) for i, b in enumerate(best)]


__all__ = [
    "DEFAULT_MAX_BATCH",
    "TOKENIZER_FILE",
    "TextModel",
    "TextRun",
    "session_outputs",
    "task_of_folder",
    "text_task_of_profile",
]
