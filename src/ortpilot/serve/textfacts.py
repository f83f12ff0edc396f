"""What a served model does with text, read by the driver before Ray starts: ``TextFacts``.

A model is a text model when it is served from a text-model folder (``tokenizer.json`` beside files that say
what it does: ``data.texttask``) or from a profile whose tune recorded such a folder's task (``profile.json``'s
``text``, the tokenizer copied beside it). Then its replicas take text (OpenAI's ``/v1/embeddings``,
``/v1/rerank``, ``/v1/classify``, KServe v2 ``BYTES`` inputs) besides its tensors; any other model takes
tensors only, and a request that sends it text is told what is missing (``missing``). The record travels to
every replica and to the server-wide application, so each answers the same way; the replica reads the
task again from what it loaded (a bundle's replica, its own class's profile).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from ortpilot.data.texttask import TextTask
from ortpilot.errors import UsageError


@dataclass(frozen=True)
class TextFacts:
    """A served model's text task (``kind`` embed, rerank or classify), or why it takes no text (``missing``,
    one sentence naming what is missing). ``tokenizer``: the ``tokenizer.json`` its replicas load (a folder's;
    a profile's replicas read the profile's own). ``dim``: the width of an embedding, where the graph says."""

    kind: str = ""
    missing: str = ""
    task: TextTask | None = None
    tokenizer: str = ""
    source: str = ""
    dim: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.task, Mapping):
            object.__setattr__(self, "task", TextTask.from_dict(self.task, "text facts"))

    @property
    def text(self) -> bool:
        return bool(self.kind)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.task.labels if self.task is not None else ()

    def public_dict(self, max_tokens: int | None = None) -> dict[str, Any]:
        """What model metadata says (``ortpilot.text``): the task and its KServe v2 text tensors. ``max_tokens``:
        where the replica cuts a text (the task's limit, or the server's lower ``--max-text-tokens``)."""
        if not self.text or self.task is None:
            return {"kind": None, "missing": self.missing}
        task = self.task if max_tokens is None else replace(self.task, max_seq_length=int(max_tokens))
        inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        if self.kind == "rerank":
            inputs.insert(0, {"name": "query", "datatype": "BYTES", "shape": [1]})
        value = {
            "embed": {"name": "embedding", "datatype": "FP32", "shape": [-1, self.dim or -1]},
            "rerank": {"name": "score", "datatype": "FP32", "shape": [-1]},
            "classify": {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(self.labels)]},
        }[self.kind]
        outputs = [
            value,
            {"name": "tokens", "datatype": "INT64", "shape": [-1]},
            {"name": "truncated", "datatype": "BOOL", "shape": [-1]},
        ]
        return {
            "kind": self.kind,
            "task": task.describe(),
            "labels": list(self.labels) or None,
            "max_tokens": task.max_seq_length,
            "dim": self.dim,
            "inputs": inputs,
            "outputs": outputs,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "missing": self.missing,
            "task": self.task.to_dict() if self.task is not None else None,
            "tokenizer": self.tokenizer,
            "source": self.source,
            "dim": self.dim,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> TextFacts:
        return cls(**dict(doc or {}))


def text_facts(spec: Any, model: onnx.ModelProto | None = None) -> TextFacts:
    """The ``TextFacts`` of a ``ModelSpec``: a profile's recorded task (its tokenizer checked: exit 1 when it
    changed), a text folder's task read against ``model``'s outputs, or what a model without text lacks."""
    if spec.kind == "profile":
        from ortpilot.artifacts.profile import read_profile
        from ortpilot.session.text import text_task_of_profile

        doc = read_profile(spec.path)
        if not doc.get("text"):
            return TextFacts(
                missing=f"the profile of model '{spec.name}' records no text model (the model it tuned was not a "
                "folder with a tokenizer.json and a task ortpilot reads); send its tensors to "
                f"/v2/models/{spec.name}/infer, or tune the model's folder and serve that tune",
                source=f"profile '{spec.path}'",
            )
        task, tokenizer = text_task_of_profile(doc, spec.path)
        return _facts(task, str(tokenizer), f"profile '{spec.path}'", model)
    if getattr(spec, "folder", ""):
        folder, task = folder_task(spec.folder, model)
        return _facts(task, str(folder.tokenizer_file), f"folder '{folder.root}'", model)
    return TextFacts(
        missing=f"model '{spec.name}' is served from a model file, which has no tokenizer; send its tensors to "
        f"/v2/models/{spec.name}/infer, or serve the folder it came in (its tokenizer.json and the files that "
        "say what it does)",
        source=spec.source or spec.path,
    )


def folder_task(path: str | Path, model: onnx.ModelProto | None = None) -> tuple[Any, TextTask]:
    """(the ``ModelFolder``, its ``TextTask``) of a text-model folder; a UsageError says what it lacks."""
    from ortpilot.data import resolve_model_folder
    from ortpilot.data.texttask import no_tokenizer_message, text_task
    from ortpilot.graph.outputs import output_facts

    folder = resolve_model_folder(path)
    if folder.tokenizer_file is None:
        raise UsageError(no_tokenizer_message(folder, "serving it as a text model"))
    if model is None:
        from ortpilot.modelio import load_model

        model = load_model(folder.model_file, load_external_data=False)
    return folder, text_task(folder, output_facts(model))


def _facts(task: TextTask, tokenizer: str, source: str, model: onnx.ModelProto | None) -> TextFacts:
    return TextFacts(task.kind, "", task, tokenizer, source, _dim(task, model))


def _dim(task: TextTask, model: onnx.ModelProto | None) -> int | None:
    """An embedding's width as the graph declares it (a pooled output's last dim, or the token vectors'
    times the pooling modes concatenated); None where it does not say."""
    if task.kind != "embed" or model is None:
        return None
    from ortpilot.graph.outputs import output_facts

    facts = {o.name: o for o in output_facts(model)}
    out = facts.get(task.output)
    last = out.last_dim if out is not None else None
    if last is None:
        return None
    return last if task.pooled else last * len(task.pooling)


__all__ = ["TextFacts", "folder_task", "text_facts"]
