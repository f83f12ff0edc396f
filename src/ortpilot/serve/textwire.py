"""The wire format of a text model's OpenAI-style endpoints: requests checked into records, answers shaped.

Three endpoints, each in the shape the clients of embedding servers already send:

- ``POST /v1/embeddings``: OpenAI's (``input`` a string or a list of strings, ``encoding_format`` ``float`` or
  ``base64``, ``dimensions``, ``user``), answered with ``{"object": "list", "data": [{"object": "embedding",
  "index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``;
- ``POST /v1/rerank``: Cohere's, as Infinity serves it (``query``, ``documents``, ``top_n``,
  ``return_documents``), answered with ``{"object": "rerank", "results": [{"index", "relevance_score",
  "document"}], "model", "usage"}``, the results most relevant first;
- ``POST /v1/classify``: Infinity's (``input``), answered with ``{"object": "classify", "data": [[{"label",
  "score"}, ...]], "model", "usage"}``, each text's labels most likely first.

Every answer also says which texts the server truncated (``truncated``: their indexes, ``[]`` when none),
as OpenAI's own answers do not. A field an endpoint does not take is refused with a 400 naming it, not
ignored (a client that asked for something gets it or hears why not). Plain data, no Ray and no HTTP server:
the Open Inference Protocol stack's replicas and server-wide application call it (``serve.oip.textroutes``).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ortpilot.data.textinput import json_kind
from ortpilot.errors import InputError
from ortpilot.serve.http import Reply, printable
from ortpilot.serve.jsonbody import not_json_reason
from ortpilot.serve.openaiapi import ApiError, json_answer

try:  # orjson (the serve extra) writes numpy vectors straight from their buffers
    import orjson
except ImportError:  # pragma: no cover - the json module writes them through lists, slower
    orjson = None

ROUTE_PREFIX = "/v1"
ENDPOINTS = {"/embeddings": "embed", "/rerank": "rerank", "/classify": "classify"}  # path -> the task it needs
ENCODINGS = ("float", "base64")
# The fields each endpoint takes (``user``: OpenAI's end-user id, taken and not used; ``raw_scores`` only false).
_FIELDS = {
    "embed": frozenset({"model", "input", "encoding_format", "dimensions", "user"}),
    "rerank": frozenset({"model", "query", "documents", "top_n", "return_documents", "raw_scores", "user"}),
    "classify": frozenset({"model", "input", "raw_scores", "user"}),
}
_TEXTS_FIELD = {"embed": "input", "rerank": "documents", "classify": "input"}
_USE = {
    "embed": "POST /v1/embeddings",
    "rerank": "POST /v1/rerank",
    "classify": "POST /v1/classify",
}


@dataclass(frozen=True)
class TextRequest:
    """One text request, checked: what a text model's replica needs to answer it. ``texts``: the inputs
    (embed, classify) or documents (rerank), in order; ``query``: rerank's query."""

    kind: str  # "embed" | "rerank" | "classify": the task the endpoint needs
    model: str
    texts: tuple[str, ...]
    query: str = ""
    encoding_format: str = "float"
    dimensions: int | None = None
    top_n: int | None = None
    return_documents: bool = False

    @property
    def field(self) -> str:
        """The request field that holds the texts (what a message about them names)."""
        return _TEXTS_FIELD[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "texts": list(self.texts)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TextRequest:
        return cls(**{**doc, "texts": tuple(doc["texts"])})


def endpoint_kind(path: str) -> str | None:
    """The task an API path needs (``/embeddings`` -> ``embed``), or None for a path that is not one."""
    return ENDPOINTS.get(path)


def use_of(kind: str) -> str:
    """The endpoint a model of ``kind`` answers (what a message about the wrong endpoint points to)."""
    return _USE[kind]


def parse_text_request(kind: str, body: bytes, model: str | None = None) -> TextRequest:
    """Check the JSON ``body`` of the endpoint that needs ``kind`` into a ``TextRequest``; every problem is an
    ApiError 400 naming the field. ``model``: the model the path names (a model's own route), which the
    body's ``model`` may repeat; without it the body must name one."""
    try:
        doc = orjson.loads(body) if orjson is not None else json.loads(body)
    except RecursionError:
        raise _bad("The request body nests JSON too deeply.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"The request body is not valid JSON ({printable(not_json_reason(body, exc), 160)}).") from None
    if not isinstance(doc, dict):
        raise _bad(f"The request body must be a JSON object, not {json_kind(doc)}.")
    unknown = sorted(set(doc) - _FIELDS[kind])
    if unknown:
        raise _bad(
            f"{_USE[kind]} does not take {', '.join(repr(printable(k, 40)) for k in unknown)}; it takes "
            f"{', '.join(sorted(_FIELDS[kind]))}.",
            param=printable(unknown[0], 40),
            code="unknown_parameter",
        )
    named = _model(doc, model)
    if doc.get("raw_scores") not in (None, False):
        raise _bad("raw_scores: only false; the scores are the model's activated ones.", param="raw_scores")
    _string(doc, "user", required=False)
    field = _TEXTS_FIELD[kind]
    texts = _texts(doc, field, allow_string=kind != "rerank")
    if kind == "embed":
        encoding = doc.get("encoding_format")
        encoding = "float" if encoding is None else encoding  # null, as every optional field: the default
        if encoding not in ENCODINGS:
            raise _bad(f"encoding_format must be 'float' or 'base64', got {_short(encoding)}.", param="encoding_format")
        dimensions = _positive(doc, "dimensions")
        return TextRequest(kind, named, texts, encoding_format=encoding, dimensions=dimensions)
    if kind == "rerank":
        query = _string(doc, "query", required=True)
        if not query.strip():
            raise _bad("query is empty or only whitespace; give the text to rank the documents for.", param="query")
        _check([query], "query")
        returned = doc.get("return_documents", False)
        if not isinstance(returned, bool):
            raise _bad(f"return_documents must be true or false, got {_short(returned)}.", param="return_documents")
        return TextRequest(kind, named, texts, query=query, top_n=_positive(doc, "top_n"), return_documents=returned)
    return TextRequest(kind, named, texts)


def _bad(message: str, *, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _model(doc: dict[str, Any], model: str | None) -> str:
    named = doc.get("model")
    if named is None and model is not None:
        return model
    if not isinstance(named, str) or not named:
        raise _bad("The request must name its model ('model': a name from GET /v1/models).", param="model")
    if model is not None and named != model:
        raise _bad(
            f"This route belongs to model '{model}', and the body names {printable(named, 80)!r} (a body with the "
            f"'model' key twice is read by its last). Leave 'model' out or name '{model}' once.",
            param="model",
        )
    return named


def _string(doc: dict[str, Any], field: str, *, required: bool) -> str:
    value = doc.get(field)
    if value is None and not required:
        return ""
    if value is None:
        raise _bad(f"The request has no '{field}'; give it as a string.", param=field)
    if not isinstance(value, str):
        raise _bad(f"{field} must be a string, got {json_kind(value)}.", param=field)
    return value


def _positive(doc: dict[str, Any], field: str) -> int | None:
    value = doc.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"{field} must be a positive integer, got {_short(value)}.", param=field)
    return value


def _texts(doc: dict[str, Any], field: str, *, allow_string: bool) -> tuple[str, ...]:
    """The texts of ``field``: a string (where the endpoint takes one) or a non-empty list of strings. Token
    ids (OpenAI lets /v1/embeddings take them) are refused by name: this server tokenizes with the model's
    own tokenizer, and ids of another would embed other text."""
    if field not in doc:
        raise _bad(f"The request has no '{field}': give the texts as {_shape(allow_string)}.", param=field)
    value = doc[field]
    if isinstance(value, str) and allow_string:
        value = [value]
    if not isinstance(value, list):
        raise _bad(f"'{field}' must be {_shape(allow_string)}, not {json_kind(value)}.", param=field)
    if value and (all(_is_int(v) for v in value) or all(_is_ids(v) for v in value)):  # OpenAI's two token forms
        raise _bad(
            f"'{field}' holds token ids; this server takes text only and tokenizes it with the model's own "
            "tokenizer. Send the strings.",
            param=field,
        )
    return tuple(_check(value, field))


def texts_of(field: str) -> str:
    """How a message names the texts of a request field ("Item 2 of the input texts is ...")."""
    return {"input": "input texts", "documents": "documents", "query": "query", "text": "texts of input 'text'"}.get(
        field, f"'{field}' texts"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_ids(value: Any) -> bool:
    """One text as token ids (a non-empty list of integers); a list of strings is not one."""
    return isinstance(value, list) and bool(value) and all(_is_int(v) for v in value)


def _check(items: Sequence[Any], field: str) -> list[str]:
    """``data.textinput.check_texts`` (strings, none empty, valid Unicode) as a 400 naming ``field``."""
    from ortpilot.data.textinput import check_texts

    try:
        return check_texts(list(items), texts_of(field))
    except InputError as exc:
        raise _bad(str(exc), param=field) from None


def _shape(allow_string: bool) -> str:
    return "a string or a list of strings" if allow_string else "a list of strings"


def _short(value: Any, limit: int = 60) -> str:
    """A value cut to ``limit`` characters; null, true and false as the client wrote them (JSON), not Python's."""
    text = "null" if value is None else ("true" if value else "false") if isinstance(value, bool) else repr(value)
    return printable(text if len(text) <= limit else text[: limit - 3] + "...", limit + 20)


# -- answers ----------------------------------------------------------------------------------------------
def _usage(tokens: Sequence[int]) -> dict[str, int]:
    total = int(sum(tokens))
    return {"prompt_tokens": total, "total_tokens": total}


def _truncated(truncated: Sequence[bool]) -> list[int]:
    return [i for i, cut in enumerate(truncated) if cut]


def _answer(doc: dict[str, Any], model: str) -> Reply:
    """The compact JSON answer; vectors written from their buffers where orjson is there."""
    if orjson is None:
        return json_answer(200, doc, model=model)
    return Reply(200, orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), model=model)


def embeddings_reply(
    request: TextRequest, values: np.ndarray, tokens: Sequence[int], truncated: Sequence[bool]
) -> Reply:
    """OpenAI's embeddings answer of ``values`` (``[n, dim]`` float32, in the request's order)."""
    vectors = np.ascontiguousarray(values, dtype="<f4")
    if request.encoding_format == "base64":
        encoded: list[Any] = [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors]
    else:
        encoded = list(vectors) if orjson is not None else vectors.tolist()
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encoded)]
    doc = {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": _usage(tokens),
        "truncated": _truncated(truncated),
    }
    return _answer(doc, request.model)


def rerank_reply(request: TextRequest, scores: np.ndarray, tokens: Sequence[int], truncated: Sequence[bool]) -> Reply:
    """The rerank answer: each document's index and relevance score, most relevant first (ties keep the
    documents' order), the first ``top_n``; each document's text too with ``return_documents``."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    if request.top_n is not None:
        order = order[: request.top_n]
    results = []
    for i in order:
        entry: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if request.return_documents:
            entry["document"] = request.texts[i]
        results.append(entry)
    doc = {
        "object": "rerank",
        "id": f"rerank-{uuid.uuid4().hex[:24]}",
        "created": int(time.time()),
        "model": request.model,
        "results": results,
        "usage": _usage(tokens),
        "truncated": _truncated(truncated),
    }
    return json_answer(200, doc, model=request.model)


def classify_reply(
    request: TextRequest,
    probabilities: np.ndarray,
    labels: Sequence[str],
    tokens: Sequence[int],
    truncated: Sequence[bool],
) -> Reply:
    """The classify answer: for each text every label with its score, most likely first."""
    data = []
    for row in np.asarray(probabilities, dtype=np.float64):
        order = sorted(range(len(labels)), key=lambda j: -row[j])
        data.append([{"label": labels[j], "score": float(row[j])} for j in order])
    doc = {
        "object": "classify",
        "id": f"classify-{uuid.uuid4().hex[:24]}",
        "created": int(time.time()),
        "model": request.model,
        "data": data,
        "usage": _usage(tokens),
        "truncated": _truncated(truncated),
    }
    return json_answer(200, doc, model=request.model)


__all__ = [
    "ENCODINGS",
    "ENDPOINTS",
    "ROUTE_PREFIX",
    "TextRequest",
    "classify_reply",
    "embeddings_reply",
    "endpoint_kind",
    "parse_text_request",
    "rerank_reply",
    "texts_of",
    "use_of",
]
