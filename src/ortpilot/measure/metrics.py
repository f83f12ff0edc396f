"""Which error measure each output is judged by, on what evidence, and the measures themselves.

A gate holds every output to one limit, so each output needs the one number that says whether
it still means the same: top-1 disagreement for class scores, cosine distance for vectors,
the share of changed elements for integers (ids, masks, passthroughs), relative L2 otherwise.
The choice is made on evidence, never on shape alone (an embedding ``[batch, 384]`` gated by
top-1 rejects every INT8 variant for nothing):

- the graph: the output comes out of Softmax / LogSoftmax / Sigmoid (through Identity,
  Reshape, Cast...), or out of a softmax built from separate ops (Exp / ReduceSum over the last
  axis, with or without x - ReduceMax first), its element type is an integer or bool
  (``graph.outputs``);
- its name: logits, scores, probs, class;
- the model folder: ``config.json`` says classifier (``*ForSequenceClassification``,
  ``id2label``), ``1_Pooling/config.json`` says sentence embedding with mean pooling;
- the user: ``--metric METRIC`` (every output) or ``--metric OUTPUT=METRIC`` (one).

What the model really returns has the last word (``choose_from_outputs``, on the reference outputs
a gate already has): a declared shape can be wrong (a text recognizer declares ``[1, seqlen]`` and
returns ``[20, 1, 8210]``), and then the actual one is used and the evidence says so. Class scores
over steps (rank >= 3, a step axis, ``MIN_CLASSES`` or more classes, rows that are probabilities or
log-probabilities, or class evidence from the graph) whose class 0 is the top class on at least
``BLANK_SHARE`` of the steps are a CTC recognizer's: they are gated on ``ctc``, per-step top-1
agreement and the decoded sequences (greedy: argmax per step, repeats collapsed, blank 0
dropped), because a cosine or top-1 figure over all steps hides one changed character per string.

Token-level outputs (``[batch, sequence, ...]`` laid out like the model's ``attention_mask``)
are compared under the mask: padding positions say nothing about the model and are left out
(``masked_*``). A sentence-transformers folder with mean pooling compares what the user gets,
the mean of the token embeddings under the mask (``pooled_cosine``). Every choice carries its
evidence as a short string; the commands print it beside the metric.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ortpilot.errors import UsageError
from ortpilot.graph.outputs import CLASS_SCORE_OPS, OutputFacts, mask_input, output_facts, same_leading_dims

BASE_METRICS = {
    "cosine": "cosine distance (1 - norm-weighted mean cosine similarity of the last-axis vectors)",
    "top1": "top-1 disagreement (share of rows whose argmax changed)",
    "rel_l2": "relative L2 error (||test - ref|| / ||ref||)",
    "exact": "share of elements that differ (integers, ids, masks: any change is an error)",
}
METRIC_DESCRIPTIONS = {
    **BASE_METRICS,
    "ctc": (
        "the larger of per-step top-1 disagreement and the share of decoded sequences that changed "
        "(greedy CTC: argmax per step, repeats collapsed, blank class 0 dropped)"
    ),
    "pooled_cosine": "cosine distance of the mean-pooled embedding (token vectors averaged under the attention mask)",
    **{
        f"masked_{k}": f"{v.split(' (')[0]} per token, padding positions (attention mask 0) left out"
        for k, v in BASE_METRICS.items()
    },
}
MIN_VECTOR = 8  # a last axis shorter than this holds a few numbers (box coordinates), not a vector
_CLASS_NAME = re.compile(r"(logit|score|prob|class)", re.I)
_VECTOR_NAME = re.compile(r"(hidden|embed|pool|feature|encoder_out|sentence|vector|present|past_key)", re.I)
# Class scores over steps need this many classes (a CTC alphabet: blank and characters); fewer are a
# few numbers per step (box coordinates, a 2-way flag), for which per-step decoding means nothing.
MIN_CLASSES = 8
# CTC puts its blank between and around the characters, so it is the top class on most steps (on
# PP-OCR's recognizer 60-90 %); a language model's or a tagger's class 0 is top on few of them.
BLANK_SHARE = 0.3
_STEP_NAME = re.compile(r"(seq|step|time|len|frame|width|^t$)", re.I)
_BATCH_NAME = re.compile(r"(batch|^n$|^b$)", re.I)
_CLASSIFIER_ARCHS = ("ForSequenceClassification", "ForImageClassification", "ForAudioClassification")


@dataclass(frozen=True)
class MetricChoice:
    """The metric one output is judged by, why, and the input whose mask it reads (masked/pooled metrics)."""

    metric: str
    evidence: str
    mask: str | None = None
    step_axis: int | None = None  # ``ctc``: the axis of the steps in each sample's array (classes: the last)

    @property
    def needs_mask(self) -> bool:
        return needs_mask(self.metric)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"metric": self.metric, "evidence": self.evidence}
        if self.mask:
            doc["mask"] = self.mask
        if self.step_axis is not None:
            doc["step_axis"] = self.step_axis
        return doc


def needs_mask(metric: str) -> bool:
    return metric == "pooled_cosine" or metric.startswith("masked_")


def check_metric(metric: str, what: str = "--metric") -> str:
    if metric not in METRIC_DESCRIPTIONS:
        raise UsageError(
            f"Unknown {what} '{metric}'. Valid metrics: {', '.join(METRIC_DESCRIPTIONS)} (give METRIC for every "
            "output or OUTPUT=METRIC for one; docs/concepts/gates.md says what each compares)."
        )
    return metric


# --------------------------------------------------------------------------- the user's word


@dataclass(frozen=True)
class MetricOverrides:
    """``--metric METRIC`` (``every`` output) and ``--metric OUTPUT=METRIC`` (``per_output``, which wins)."""

    every: str | None = None
    per_output: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.every or self.per_output)

    def get(self, name: str) -> str | None:
        return self.per_output.get(name) or self.every

    def describe(self) -> str | None:
        """One canonical string (journals compare it on resume), None when nothing was set."""
        parts = ([self.every] if self.every else []) + [f"{k}={v}" for k, v in sorted(self.per_output.items())]
        return ",".join(parts) or None

    @classmethod
    def parse(cls, items: str | Sequence[str] | Mapping[str, str] | MetricOverrides | None) -> MetricOverrides:
        """``"cosine"``, ``["cosine", "logits=top1"]``, ``"cosine,logits=top1"`` or ``{"logits": "top1"}``."""
        if isinstance(items, MetricOverrides):
            return items
        if not items:
            return cls()
        if isinstance(items, Mapping):
            return cls(None, {str(k): check_metric(str(v)) for k, v in items.items()})
        every: str | None = None
        per: dict[str, str] = {}
        for item in [items] if isinstance(items, str) else items:
            for part in str(item).split(","):
                name, eq, metric = part.strip().rpartition("=")
                if not metric:
                    raise UsageError(f"--metric '{item}' is empty; give METRIC or OUTPUT=METRIC.")
                check_metric(metric)
                if eq and not name:
                    raise UsageError(f"--metric '{item}' names no output; give OUTPUT=METRIC or METRIC.")
                if eq:
                    per[name] = metric
                else:
                    every = metric
        return cls(every, per)


# --------------------------------------------------------------------------- the choice


def refuse_unknown_outputs(
    flag: str, named: Sequence[str], outputs: Sequence[str], per_output: str, alone: str
) -> None:
    """A per-output setting (``--metric OUTPUT=METRIC``, ``--atol NAME:VALUE``) for an output the model does not
    have would hold nothing to it, so a typo passes: refused, listing the outputs it has."""
    unknown = [n for n in named if n not in outputs]
    if unknown:
        raise UsageError(
            f"{flag} names output(s) {', '.join(repr(n) for n in unknown)} that the model does not have. "
            f"Its outputs: {', '.join(outputs) or 'none'}. Use {per_output} with one of those, or {alone} alone "
            "for every output."
        )


def choose_metrics(
    model: onnx.ModelProto,
    folder: Any = None,
    overrides: str | Sequence[str] | Mapping[str, str] | MetricOverrides | None = None,
) -> dict[str, MetricChoice]:
    """Output name -> ``MetricChoice`` for every output of ``model``, from the evidence the module
    docstring lists. ``folder``: a ``data.folder.ModelFolder`` (or None). ``overrides`` naming an
    output the model lacks, or a masked metric on a model without a mask input, raise UsageError."""
    user = MetricOverrides.parse(overrides)
    facts = output_facts(model)
    refuse_unknown_outputs("--metric", user.per_output, [f.name for f in facts], "OUTPUT=METRIC", "METRIC")
    mask = mask_input(model)
    choices = {}
    for f in facts:
        forced = user.get(f.name)
        if forced is None:
            choices[f.name] = choose(f, mask.dims if mask else None, mask.name if mask else None, folder)
            continue
        if needs_mask(forced) and mask is None:
            raise UsageError(
                f"--metric {f.name}={forced} compares under the attention mask, but the model has no mask input "
                f"(its inputs are none of attention_mask / input_mask). Use one of "
                f"{', '.join(BASE_METRICS)} for '{f.name}'."
            )
        choices[f.name] = MetricChoice(forced, "set by --metric", mask.name if mask and needs_mask(forced) else None)
    return choices


def choose(
    facts: OutputFacts, mask_dims: Sequence[Any] | None = None, mask_name: str | None = None, folder: Any = None
) -> MetricChoice:
    """The metric for one output (see the module docstring for the evidence, in the order it is weighed)."""
    shown = facts.describe_dims()
    if not facts.floating:
        return MetricChoice("exact", f"{facts.dtype} output: compared exactly")
    token = mask_dims is not None and (facts.rank or 0) >= 3 and same_leading_dims(facts.dims, tuple(mask_dims))
    under = f", per token under {mask_name}" if token else ""
    masked = "masked_" if token else ""
    task = getattr(folder, "task", "") if folder is not None else ""
    evidence = _class_evidence(facts, folder)
    if evidence:
        if facts.rank in (2, 3) and facts.last_dim != 1:
            return MetricChoice(f"{masked}top1", evidence + under, mask_name if token else None)
        evidence += ", but not one row of scores per class"
    if token and task == "sentence-embedding":
        pooling = folder.get("pooling")
        if pooling == "mean_tokens":
            return MetricChoice(
                "pooled_cosine", f"1_Pooling/config.json: mean pooling of {shown} under {mask_name}", mask_name
            )
        return MetricChoice(
            "masked_cosine", f"1_Pooling/config.json: {pooling} pooling; token vectors{under}", mask_name
        )
    vector_name = bool(_VECTOR_NAME.search(facts.name))
    long_rows = facts.last_dim is None or facts.last_dim >= MIN_VECTOR
    prefix = evidence + "; " if evidence else ""
    keep = mask_name if token else None
    if long_rows and facts.rank in (2, 3):
        why = f"token vectors {shown} under {mask_name}" if token else f"float vector {shown}, no class evidence"
        return MetricChoice(f"{masked}cosine", prefix + why, keep)
    if long_rows and vector_name and (facts.rank or 0) >= 2:
        return MetricChoice(
            f"{masked}cosine", prefix + f"name '{facts.name}': vectors along the last axis{under}", keep
        )
    what = "map" if (facts.rank or 0) >= 4 else "values"
    return MetricChoice(f"{masked}rel_l2", prefix + f"float {what} {shown}{under}", keep)


def _class_evidence(facts: OutputFacts, folder: Any) -> str:
    """Why this output holds class scores, or "" when nothing says so."""
    if facts.producer in CLASS_SCORE_OPS and facts.last_axis is not False:
        through = f" through {', '.join(facts.via)}" if facts.via else ""
        if facts.built_from:
            return f"produced by a Softmax built from {', '.join(facts.built_from)} over the last axis{through}"
        return f"produced by {facts.producer}{through}"
    found = _CLASS_NAME.search(facts.name)
    if found:
        return f"name '{facts.name}'"
    if folder is None or getattr(folder, "task", "") not in ("classifier", "token-classifier"):
        return ""
    labels = folder.get("labels")
    count = len(labels) if isinstance(labels, Mapping) else None
    if count is not None and facts.last_dim is not None and facts.last_dim != count:
        return ""  # the folder's classifier has another number of classes than this output has scores
    archs = [a for a in folder.get("architectures") or [] if isinstance(a, str)]
    named = next((a for a in archs if any(s in a for s in (*_CLASSIFIER_ARCHS, "ForTokenClassification"))), None)
    return f"config.json: {named}" if named else f"config.json: id2label ({count} labels)"


def choice_for_array(name: str, array: np.ndarray) -> MetricChoice:
    """The choice from a value alone, for outputs a caller holds without their graph (no producer, no mask)."""
    return choose(OutputFacts.of_array(name, array))


def choose_metric(name: str, shape: Sequence[int], dtype: Any = np.float32) -> str:
    """The metric for an output known only by name, shape and dtype (``choice_for_array``'s rule)."""
    return choose(OutputFacts(name, np.dtype(dtype), tuple(int(d) for d in shape))).metric


def choose_from_outputs(
    name: str, arrays: Sequence[np.ndarray], declared: OutputFacts | None = None, choice: MetricChoice | None = None
) -> MetricChoice:
    """The metric for one output from what the model returned (``arrays``: the reference's, one per
    sample), beside what its graph declared (``declared``, and ``choice`` made from it). A declared shape
    the arrays contradict is replaced by the actual one and the evidence says so; class scores over
    steps get ``ctc`` (or per-step ``top1`` without a CTC blank). A masked or pooled choice stays."""
    if not arrays or (choice is not None and (choice.needs_mask or choice.metric == "exact")):
        return choice or (choice_for_array(name, arrays[0]) if arrays else MetricChoice("rel_l2", "no samples"))
    actual = actual_dims(arrays)
    if actual is None:  # samples of different ranks: nothing steady to read
        return choice or choice_for_array(name, arrays[0])
    facts = declared or OutputFacts.of_array(name, arrays[0])
    note = ""
    if declared is not None and not _agrees(declared.dims, actual):
        shown = "[" + ", ".join("?" if d is None else str(d) for d in actual) + "]"
        if declared.dims is not None:
            note = f"declared {declared.describe_dims()} but returns {shown}; "
        # The graph's claims about the last axis were made for the declared rank: the values decide.
        facts = replace(declared, dims=actual, last_axis=None)
        choice = None
    graph_classes = choice.metric == "top1" if choice is not None else bool(_class_evidence(facts, None))
    steps = _classes_over_steps(facts, arrays, graph_classes)
    if steps is not None:
        return MetricChoice(steps.metric, note + steps.evidence, step_axis=steps.step_axis)
    chosen = choice or choose(facts)
    return replace(chosen, evidence=note + chosen.evidence) if note else chosen


def actual_dims(arrays: Sequence[np.ndarray]) -> tuple[int | None, ...] | None:
    """The dims every sample's array has (None where they differ, e.g. steps growing with the image's
    width); None when the samples differ in rank."""
    shapes = {np.shape(a) for a in arrays}
    if len({len(s) for s in shapes}) != 1:
        return None
    first = next(iter(shapes))
    return tuple(first[i] if len({s[i] for s in shapes}) == 1 else None for i in range(len(first)))


def _agrees(declared: Sequence[Any] | None, actual: Sequence[int | None]) -> bool:
    """Whether the declared dims allow the actual ones (a symbolic dim allows any size)."""
    if declared is None or len(declared) != len(actual):
        return False
    return all(not isinstance(d, int) or d <= 0 or a is None or d == a for d, a in zip(declared, actual))


def step_axis_of(arrays: Sequence[np.ndarray], declared: Sequence[Any] | None = None) -> int | None:
    """The axis of the steps in class scores ``[..., classes]``: the one non-class axis longer than 1;
    of several, the one whose length varies between samples, else the one named like steps in the
    declared dims. None when there is no such axis or no telling which."""
    rank = np.ndim(arrays[0])
    long = [i for i in range(rank - 1) if any(np.shape(a)[i] > 1 for a in arrays)]
    if len(long) == 1:
        return long[0]
    varying = [i for i in long if len({np.shape(a)[i] for a in arrays}) > 1]
    if len(varying) == 1:
        return varying[0]
    if declared is not None and len(declared) == rank:
        named = [i for i in long if isinstance(declared[i], str) and _STEP_NAME.search(declared[i])]
        named = [i for i in named if not _BATCH_NAME.search(str(declared[i]))]
        if len(named) == 1:
            return named[0]
    return None


def _score_kind(arrays: Sequence[np.ndarray]) -> str:
    """ "probabilities" when every row is >= 0 and sums to 1, "log-probabilities" when every row's
    exponentials do, "" otherwise (logits, vectors: the values alone cannot tell those apart)."""
    rows = np.concatenate(_rows(arrays))
    if rows.size == 0 or not np.isfinite(rows).all():
        return ""
    if rows.min() >= -1e-6 and np.allclose(rows.sum(axis=1), 1.0, atol=1e-3):
        return "probabilities"
    if rows.max() <= 1e-6:
        top = rows.max(axis=1, keepdims=True)
        if np.allclose(np.log(np.exp(rows - top).sum(axis=1)) + top[:, 0], 0.0, atol=1e-3):
            return "log-probabilities"
    return ""


def _classes_over_steps(facts: OutputFacts, arrays: Sequence[np.ndarray], graph_classes: bool) -> MetricChoice | None:
    """``ctc`` (or per-step ``top1``) when the arrays hold class scores over steps, else None."""
    if not facts.floating or np.ndim(arrays[0]) < 3:
        return None
    classes = int(np.shape(arrays[0])[-1])
    axis = step_axis_of(arrays, facts.dims if facts.dims is not None else None)
    if classes < MIN_CLASSES or axis is None:
        return None
    kind = _score_kind(arrays)
    if not kind and not graph_classes:
        return None
    steps = sorted({int(np.shape(a)[axis]) for a in arrays})
    at = f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
    why = f"{classes} classes at {at} steps (axis {axis})"
    why += f", rows are {kind}" if kind else ", class scores by the graph"
    tops = np.concatenate([np.asarray(a).reshape(-1, classes).argmax(axis=1) for a in arrays])
    counts = np.bincount(tops, minlength=classes)
    blank = float(counts[0]) / max(1, tops.size)
    if blank >= BLANK_SHARE and counts[0] == counts.max():
        return MetricChoice(
            "ctc", f"{why}; class 0 is the top class at {blank:.0%} of steps (a CTC blank)", step_axis=axis
        )
    return MetricChoice("top1", f"{why}; per-step class scores (class 0 top at {blank:.0%} of steps: no CTC blank)")


def folder_near(model_path: str | os.PathLike | None) -> Any:
    """The model folder a model *file* sits in (``data.folder_of``), for its metric evidence; None for a
    file on its own, a folder path, or no path."""
    if model_path is None or not Path(model_path).is_file():
        return None
    from ortpilot.data.folder import folder_of

    return folder_of(model_path)


def describe_choices(choices: Mapping[str, MetricChoice]) -> str:
    """``name: metric (evidence)`` for each output, one line."""
    return "; ".join(f"{n}: {c.metric} ({c.evidence})" for n, c in choices.items())


# --------------------------------------------------------------------------- the measures


def _rows(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = []
    for a in arrays:
        a = np.asarray(a, dtype=np.float64)
        if a.ndim == 0:
            a = a.reshape(1, 1)
        out.append(a.reshape(-1, a.shape[-1]) if a.shape[-1] else a.reshape(-1, 1))
    return out


def flatten(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Every sample's values as one float64 vector."""
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays]) if arrays else np.zeros(0)


def topk_agreement(ref: Sequence[np.ndarray], test: Sequence[np.ndarray], k: int) -> float:
    """Share of rows whose reference argmax is in the test's top k."""
    a, b = np.concatenate(_rows(ref)), np.concatenate(_rows(test))
    if a.shape[0] == 0:
        return 1.0
    k = min(k, a.shape[1])
    top_ref = np.argmax(a, axis=1)
    top_test = np.argpartition(-np.nan_to_num(b, nan=-np.inf), k - 1, axis=1)[:, :k]
    return float((top_test == top_ref[:, None]).any(axis=1).mean())


def _check_mask(output: np.ndarray, mask: np.ndarray, metric: str) -> np.ndarray:
    mask = np.asarray(mask)
    if output.shape[: mask.ndim] != mask.shape or output.ndim < mask.ndim + (metric == "pooled_cosine"):
        raise UsageError(
            f"Metric {metric} compares [batch, sequence, ...] outputs under the attention mask, but an output of "
            f"shape {list(output.shape)} does not start with the mask's shape {list(mask.shape)}. Choose another "
            f"metric for it (--metric OUTPUT=METRIC: {', '.join(BASE_METRICS)})."
        )
    return mask.astype(bool)


def masked(arrays: Sequence[np.ndarray], masks: Sequence[np.ndarray], metric: str = "masked") -> list[np.ndarray]:
    """Each sample's output at the real positions only (mask 1): ``[kept positions, ...]``."""
    return [np.asarray(a)[_check_mask(np.asarray(a), m, metric)] for a, m in zip(arrays, masks)]


def mean_pooled(arrays: Sequence[np.ndarray], masks: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each sample's token vectors averaged over the real positions, as sentence-transformers pools them."""
    out = []
    for a, m in zip(arrays, masks):
        a = np.asarray(a, dtype=np.float64)
        keep = _check_mask(a, m, "pooled_cosine").astype(np.float64)
        weights = keep.reshape(*keep.shape, *([1] * (a.ndim - keep.ndim)))
        count = np.maximum(weights.sum(axis=tuple(range(1, keep.ndim))), 1e-9)
        out.append((a * weights).sum(axis=tuple(range(1, keep.ndim))) / count)
    return out


def metric_error(
    metric: str,
    ref: Sequence[np.ndarray],
    test: Sequence[np.ndarray],
    masks: Sequence[np.ndarray] | None = None,
    step_axis: int | None = None,
) -> float:
    """One number, 0 = identical, for ``metric`` over all samples of one output. ``masks``: each sample's
    attention mask, for the masked and pooled metrics; ``step_axis``: the steps' axis, for ``ctc``
    (None: the longest non-class axis)."""
    if needs_mask(metric):
        if masks is None or len(masks) != len(ref):
            raise UsageError(
                f"Metric {metric} needs each sample's attention mask, and the inputs the outputs came from were "
                f"not given. Use one of {', '.join(BASE_METRICS)} here."
            )
        if metric == "pooled_cosine":
            return metric_error("cosine", mean_pooled(ref, masks), mean_pooled(test, masks))
        base = metric.removeprefix("masked_")
        return metric_error(base, masked(ref, masks, metric), masked(test, masks, metric))
    if metric == "top1":
        return 1.0 - topk_agreement(ref, test, 1)
    if metric == "ctc":
        figures = sequence_figures(ref, test, step_axis)
        return max(1.0 - figures["step_top1_agreement"], 1.0 - figures["sequence_exact_match"])
    if metric == "cosine":
        # Rows weighted by their norms (sum of dots / sum of norm products): near-zero rows, whose
        # direction is noise, cannot dominate the way they would in a plain mean of cosines.
        a, b = np.concatenate(_rows(ref)), np.concatenate(_rows(test))
        norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        total = float(norms.sum())
        if not math.isfinite(total):
            return math.inf
        return max(0.0, 1.0 - float((a * b).sum()) / total) if total > 0 else (0.0 if np.array_equal(a, b) else 1.0)
    if metric == "rel_l2":
        a, b = flatten(ref), flatten(test)
        denom = float(np.linalg.norm(a))
        diff = float(np.linalg.norm(a - b))
        if not math.isfinite(diff):
            return math.inf
        return diff / denom if denom > 0 else (0.0 if diff == 0 else math.inf)
    if metric == "exact":
        total = sum(int(np.size(r)) for r in ref)
        if total == 0:
            return 0.0
        differ = sum(int(np.count_nonzero(_differs(np.asarray(r), np.asarray(t)))) for r, t in zip(ref, test))
        return differ / total
    check_metric(metric)
    raise AssertionError(metric)  # pragma: no cover - every known metric is handled above


def ctc_decode(array: np.ndarray, step_axis: int | None = None, blank: int = 0) -> list[tuple[int, ...]]:
    """Greedy CTC decoding of one sample's class scores ``[..., classes]``: the argmax per step, repeats
    collapsed, ``blank`` dropped; one sequence per position of the other axes (the batch)."""
    a = np.asarray(array)
    if a.ndim < 2:
        a = a.reshape(1, -1)
    axis = _step_axis_or_longest(a) if step_axis is None else step_axis
    ids = np.moveaxis(np.argmax(a, axis=-1), axis, -1)
    out = []
    for row in ids.reshape(-1, ids.shape[-1]):
        keep = np.ones(row.shape, bool)
        keep[1:] = row[1:] != row[:-1]
        out.append(tuple(int(c) for c in row[keep & (row != blank)]))
    return out


def _step_axis_or_longest(a: np.ndarray) -> int:
    """Without a recorded step axis (a profile's ``ctc`` read back): the longest non-class axis."""
    return int(np.argmax(a.shape[:-1])) if a.ndim >= 2 else 0


def sequence_figures(
    ref: Sequence[np.ndarray], test: Sequence[np.ndarray], step_axis: int | None = None
) -> dict[str, float]:
    """What ``ctc`` weighs: ``step_top1_agreement`` (share of steps whose top class stayed),
    ``sequence_exact_match`` (share of decoded sequences that stayed identical), ``sequences`` and
    ``identical`` (their counts). A non-finite value in ``test`` where ``ref`` has none changes its sample."""
    steps = 1.0 - metric_error("top1", ref, test)
    same = total = 0
    for r, t in zip(ref, test):
        decoded_r = ctc_decode(r, step_axis)
        broken = not np.isfinite(t).all() and np.isfinite(r).all()
        decoded_t = [None] * len(decoded_r) if broken else ctc_decode(t, step_axis)
        total += len(decoded_r)
        same += sum(int(x == y) for x, y in zip(decoded_r, decoded_t))
    return {
        "step_top1_agreement": steps,
        "sequence_exact_match": same / total if total else 1.0,
        "sequences": float(total),
        "identical": float(same),
    }


def describe_figures(figures: Mapping[str, float]) -> str:
    """A check's figures as one clause: ``ctc``'s per-step top-1 agreement and identical decoded sequences, or
    the worst sample's index and the mean over samples (the error is the worst sample's)."""
    if "worst_sample" in figures:
        return f"worst of the samples: #{int(figures['worst_sample'])}; mean over samples {figures['mean_error']:.3g}"
    if "sequence_exact_match" not in figures:
        return ""
    return (
        f"per-step top-1 agreement {figures['step_top1_agreement']:.2%}, decoded sequences identical "
        f"{int(figures['identical'])}/{int(figures['sequences'])} ({figures['sequence_exact_match']:.1%})"
    )


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    differ = a != b
    if np.issubdtype(a.dtype, np.floating) and np.issubdtype(b.dtype, np.floating):
        differ &= ~(np.isnan(a) & np.isnan(b))
    return differ


def masks_of(choice: MetricChoice, samples: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray] | None:
    """The attention mask of each sample, when ``choice`` reads one (None otherwise, or when not given)."""
    if not choice.needs_mask or not choice.mask or not samples:
        return None
    missing = [i for i, s in enumerate(samples) if choice.mask not in s]
    if missing:
        raise UsageError(f"The held-out samples lack input '{choice.mask}' that metric {choice.metric} reads.")
    return [np.asarray(s[choice.mask]) for s in samples]


__all__ = [
    "BASE_METRICS",
    "BLANK_SHARE",
    "METRIC_DESCRIPTIONS",
    "MIN_CLASSES",
    "MIN_VECTOR",
    "MetricChoice",
    "MetricOverrides",
    "actual_dims",
    "check_metric",
    "choice_for_array",
    "choose",
    "choose_from_outputs",
    "choose_metric",
    "choose_metrics",
    "ctc_decode",
    "describe_choices",
    "describe_figures",
    "flatten",
    "folder_near",
    "masked",
    "masks_of",
    "mean_pooled",
    "metric_error",
    "needs_mask",
    "refuse_unknown_outputs",
    "sequence_figures",
    "step_axis_of",
    "topk_agreement",
]
