"""How a text model's replica answers text: the ``TextModel`` on its verified session, its tokenizer thread,
the request limits, and the text batcher in front of the replica's run thread.

One request goes: its count of texts against ``--max-texts`` (413) -> tokenized on the tokenizer thread
(``TextModel.encode``: the folder's tokenizer, truncation at the model's limit or ``--max-text-tokens``;
bad texts are a 400 naming the items) -> texts that were cut refused when the server refuses long texts
(``--no-truncate``: a 400 naming the items, their token counts and the limit) -> its tokens together
against ``--max-request-tokens`` (413) -> the text batcher, which joins it with the requests waiting beside
it into one ``TextModel.run`` on the run thread (the one the tensor requests use: one session, one thread)
-> its values, tokens and truncation (``TextAnswer``). The event loop only waits: tokenizing and running
happen on threads. The replica's constructor builds it and runs one text through it before the replica
takes traffic, which also measures an embedding's width (``dim``). Plain code, no Ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortpilot.data.textinput import Tokenized, check_texts, exceeds_char_bound
from ortpilot.errors import InputError
from ortpilot.serve.context import DeadlineExceeded, RequestContext
from ortpilot.serve.oip.batcher import Expired
from ortpilot.serve.oip.metrics import TextCounts
from ortpilot.serve.options import ModelSpec, TextOptions
from ortpilot.serve.textfacts import TextFacts
from ortpilot.serve.textwire import texts_of
from ortpilot.session.text import TextModel, TextRun

RUNS_PER_BATCH = 4  # a text batch holds up to this many runs' texts, so sorting by length has more to pick from
WARM_TEXT = "a sentence to check the text model with"


class TextRefused(Exception):
    """A text request the replica does not run: its status (400, 413, 504), the message, the field it names."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass(frozen=True)
class TextAnswer:
    """What one text request got: its values in its texts' order (``[n, dim]`` vectors, ``[n]`` scores or
    ``[n, labels]`` probabilities), the tokens each text kept, and which were truncated."""

    values: np.ndarray
    tokens: tuple[int, ...]
    truncated: tuple[bool, ...]


def text_model(spec: ModelSpec, session: Any, facts: TextFacts, options: TextOptions) -> TextModel:
    """The ``TextModel`` of a replica's verified session: a profile's recorded task and tokenizer (a bundle's,
    its own class's profile), or the folder's that the driver read; a shape plan's buckets as its lengths."""
    from ortpilot.session.text import text_task_of_profile

    if spec.kind == "profile":
        bundle = getattr(session, "bundle", None)
        chosen = bundle.profile if bundle is not None else spec.path
        task, tokenizer = text_task_of_profile(session.profile, chosen)
        source = f"Profile '{chosen}'"
    else:
        assert facts.task is not None
        task, tokenizer, source = facts.task, facts.tokenizer, facts.source
    plan = getattr(session, "plan", None)  # a ShapedSession: pad each run straight to its bucket
    return TextModel(
        session,
        task,
        tokenizer,
        max_batch=options.batch,
        lengths=list(plan.sizes) if plan is not None else None,
        truncate=True,
        source=source,
        max_length=options.max_text_tokens,
    )


class TextRunner:
    """A replica's text side (see the module docstring); ``executor`` is the replica's run thread."""

    def __init__(
        self, model: TextModel, options: TextOptions, executor: Executor, wait_s: float = 0.0, name: str = ""
    ) -> None:
        from ortpilot.serve.oip.textbatcher import TextBatcher

        self.model = model
        self.kind = model.task.kind
        self.options = options
        self.name = name
        self.counts = TextCounts()
        self.tokenizer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortpilot-tokenize")
        self.batcher = TextBatcher(model.run, executor, options.batch * RUNS_PER_BATCH, wait_s, self._observe)
        self._whole: Any = None  # the tokenizer without truncation: token counts of refused texts (lazily)
        warm = model.run(model.encode([(WARM_TEXT, WARM_TEXT)] if self.kind == "rerank" else [WARM_TEXT]))
        self.dim = int(warm.values.shape[1]) if self.kind == "embed" else None

    @property
    def limit(self) -> int | None:
        """Tokens per text: the model's limit, or the server's lower ``--max-text-tokens``."""
        return self.model.max_length

    async def answer(
        self, texts: Sequence[Any], context: RequestContext, *, query: Any = None, field: str = "input"
    ) -> TextAnswer:
        """The values of ``texts`` (documents scored against ``query`` for a cross-encoder) before ``context``'s
        deadline; ``TextRefused`` names a limit or a bad text, ``DeadlineExceeded`` a missed deadline."""
        if len(texts) > self.options.max_texts:
            raise TextRefused(
                413,
                f"The request has {len(texts)} texts in '{field}'; this server takes at most "
                f"{self.options.max_texts} per request (--max-texts). Send them in several requests.",
                field,
            )
        loop = asyncio.get_running_loop()
        try:
            tokens, items = await context.within(
                loop.run_in_executor(self.tokenizer_thread, self._encode, list(texts), query, field)
            )
        except InputError as exc:
            raise TextRefused(400, str(exc), field) from None
        self._check(tokens, items, field)
        try:
            values = await context.within(self.batcher.submit(tokens, context.deadline))
        except Expired:
            raise DeadlineExceeded(context) from None
        except InputError as exc:  # what the session refuses (a shape plan that takes no longer texts)
            raise TextRefused(400, str(exc), field) from None
        return TextAnswer(values, tuple(tokens.lengths), tokens.truncated)

    def _encode(self, texts: list[Any], query: Any, field: str) -> tuple[Tokenized, list[Any]]:
        """(tokens, the checked items) of ``texts`` (UTF-8 bytes decoded; a bad one is an InputError naming it
        in ``field``), paired with ``query`` for a cross-encoder."""
        checked = check_texts(texts, texts_of(field))
        if self.kind == "rerank":
            (first,) = check_texts([query], "query")
            items: list[Any] = [(first, t) for t in checked]
        else:
            items = checked
        return self.model.encode(items, truncate=True), items

    def _check(self, tokens: Tokenized, items: list[Any], field: str) -> None:
        """Refuse cut texts when the server refuses long ones, and a request over its tokens together."""
        cut = [i for i, c in enumerate(tokens.truncated) if c]
        if cut and not self.options.truncate:
            counts = self._whole_counts([items[i] for i in cut[:5]])
            shown = ", ".join(
                f"{i} ({n} tokens)" if n is not None else f"{i} (over {self.limit} tokens)"
                for i, n in zip(cut[:5], counts)
            )
            more = f" and {len(cut) - 5} more" if len(cut) > 5 else ""
            raise TextRefused(
                400,
                f"Text{'s' if len(cut) > 1 else ''} {shown}{more} of '{field}' "
                f"{'are' if len(cut) > 1 else 'is'} over this server's limit of {self.limit} tokens per text "
                "(the model's limit, or --max-text-tokens), and the server refuses long texts (--no-truncate): "
                "shorten or split them.",
                field,
            )
        total = sum(tokens.lengths)
        if total > self.options.max_request_tokens:
            raise TextRefused(
                413,
                f"The request's texts make {total} tokens, over this server's limit of "
                f"{self.options.max_request_tokens} tokens per request (--max-request-tokens). Send them in "
                "several requests.",
                field,
            )

    def _whole_counts(self, items: list[Any]) -> list[int | None]:
        """The tokens each item has uncut (special tokens included): what a refusal names; None for an item longer
        than the characters its limit's tokens could span (``exceeds_char_bound``): counting a megabyte's
        tokens to refuse it held the replica's other requests up for seconds (12 s for 10 MB)."""
        if self._whole is None:
            from tokenizers import Tokenizer

            whole = Tokenizer.from_str(self.model.tokenizer.to_str())
            whole.no_truncation()
            self._whole = whole
        lower = self.model.task.lowercase

        def text(item: Any) -> Any:
            if isinstance(item, tuple):
                return tuple(t.lower() for t in item) if lower else item
            return item.lower() if lower else item

        short = [i for i, item in enumerate(items) if not exceeds_char_bound(item, self.limit)]
        counts: list[int | None] = [None] * len(items)
        for i, encoding in zip(short, self._whole.encode_batch([text(items[i]) for i in short])):
            counts[i] = len(encoding.ids)
        return counts

    def _observe(self, run: TextRun, tokens: Tokenized, requests: int) -> None:
        """Count one batch: each session run's texts, real tokens and padded positions."""
        lengths = tokens.lengths
        runs = [(b.rows, sum(lengths[i] for i in b.items), b.rows * b.length) for b in run.batches]
        self.counts.observe(runs, requests)

    def close(self) -> None:
        self.tokenizer_thread.shutdown(wait=False)


__all__ = ["RUNS_PER_BATCH", "TextAnswer", "TextRefused", "TextRunner", "text_model"]
