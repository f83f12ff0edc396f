"""Texts from a caller, checked and tokenized for a text model: one batch encode, truncation said per item.

The caller's list is checked before any work, so one bad item is named instead of failing a whole
run later: a list of strings (``bytes`` must be UTF-8), none empty or only whitespace (an empty
text has nothing to embed: its vector would be that of the special tokens alone, the same for
every empty input). Tokenization is the folder's own ``tokenizer.json`` through the ``tokenizers``
library's batch encode, with the tokenizer's own padding switched off (many exports pad every text
to 128, which is what batching by length avoids) and truncation at the task's ``max_seq_length``.
Which items were truncated is reported per item; ``truncate=False`` refuses them instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ortpilot.errors import InputError

SHOWN = 5  # items named in a message before "and N more"


def _items(indexes: Sequence[int], of: str = "") -> str:
    """``Item 3 is`` or ``Items 1, 4 and 7 more are``: the subject of a message about these items."""
    shown = ", ".join(str(i) for i in indexes[:SHOWN])
    shown += f" and {len(indexes) - SHOWN} more" if len(indexes) > SHOWN else ""
    one = len(indexes) == 1
    return f"Item{'' if one else 's'} {shown}{' of the ' + of if of else ''} {'is' if one else 'are'}"


def check_texts(items: Any, what: str = "texts") -> list[str]:
    """The caller's texts as a list of strings: a single string is a list of one; ``bytes`` are decoded as
    UTF-8. An empty list, an item that is no text, undecodable bytes, or an empty or whitespace-only
    text is an InputError naming the items (numbered from 0)."""
    if isinstance(items, (str, bytes)):
        items = [items]
    if isinstance(items, (Mapping, set, frozenset)):  # no order to answer in (a dict would give its keys)
        raise InputError(f"The {what} must be a list of strings, not {type(items).__name__}.")
    try:
        values = list(items)
    except TypeError:
        raise InputError(f"The {what} must be a list of strings, not {type(items).__name__}.") from None
    if not values:
        raise InputError(f"The {what} are an empty list; give at least one string.")
    texts: list[str] = []
    for index, item in enumerate(values):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"{_items([index], what)} not UTF-8 (byte {exc.start}: {exc.reason}); send text as UTF-8."
                ) from None
        if not isinstance(item, str):
            raise InputError(f"{_items([index], what)} {json_kind(item)}, not a string; every item must be a text.")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800" in JSON): no text a tokenizer takes
            raise InputError(
                f"{_items([index], what)} not valid Unicode (character {exc.start} is a lone surrogate, "
                f"{item[exc.start]!a}); send text that UTF-8 can encode."
            ) from None
        texts.append(item)
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise InputError(
            f"{_items(empty, what)} empty or only whitespace; an empty text has nothing to "
            "embed or score (its result would be that of the special tokens alone). Leave such items out."
        )
    return texts


_JSON_KINDS = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "a list",
    tuple: "a list",
    dict: "an object",
}


def json_kind(value: Any) -> str:
    """What a value is, in a client's words (JSON's), not a Python type name: messages about text and tensors
    sent over HTTP, and texts given from Python, say "a number", "null", "an object"."""
    return _JSON_KINDS.get(type(value), f"a {type(value).__name__}")


def configure_tokenizer(tokenizer: Any, max_length: int | None) -> Any:
    """The tokenizer set up for batching by length: its own padding off, truncation at ``max_length``
    (None: none). It changes the object, so a text model configures its own copy once."""
    tokenizer.no_padding()
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length=int(max_length))
    return tokenizer


@dataclass(frozen=True)
class Tokenized:
    """Token ids per item (special tokens included), their type ids, and whether truncation cut the item."""

    ids: tuple[tuple[int, ...], ...]
    type_ids: tuple[tuple[int, ...], ...]
    truncated: tuple[bool, ...]

    @property
    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.ids]

    def __len__(self) -> int:
        return len(self.ids)

    def part(self, start: int, stop: int) -> Tokenized:
        """Items ``start`` to ``stop`` (a server splits a long list across runs)."""
        return Tokenized(self.ids[start:stop], self.type_ids[start:stop], self.truncated[start:stop])

    @classmethod
    def join(cls, parts: Sequence[Tokenized]) -> Tokenized:
        """The items of ``parts`` one after another, as one call takes them (a server joins requests)."""
        return cls(
            tuple(i for p in parts for i in p.ids),
            tuple(t for p in parts for t in p.type_ids),
            tuple(c for p in parts for c in p.truncated),
        )


# A token covers at most this many characters (WordPiece's max_input_chars_per_word: a longer word is one [UNK]).
# A text longer than max_length x this is cut to it before tokenizing: the tokenizer would cut it at max_length
# tokens anyway, and tokenizing a megabyte to keep 128 tokens held up every other request on a server's replica.
CHARS_PER_TOKEN_BOUND = 100


def _cut_chars(item: Any, bound: int | None) -> Any:
    """``item`` (a text or a pair) with each text cut to ``bound`` characters; the same object when none is longer."""
    if bound is None:
        return item
    if isinstance(item, tuple):
        return tuple(x[:bound] for x in item) if any(len(x) > bound for x in item) else item
    return item[:bound] if len(item) > bound else item


def exceeds_char_bound(item: Any, max_length: int | None) -> bool:
    """Whether a text (or a pair) is longer than ``max_length`` tokens could span (``CHARS_PER_TOKEN_BOUND``
    characters a token): ``tokenize`` cuts such a text by characters first, and counts nothing past the cut."""
    return bool(max_length) and _cut_chars(item, max_length * CHARS_PER_TOKEN_BOUND) is not item


def _encode(tokenizer: Any, item: Any) -> Any:
    """One text, or one (first, second) pair, through ``tokenizer``."""
    return tokenizer.encode(*item) if isinstance(item, tuple) else tokenizer.encode(item)


def _squeezed(item: Any) -> Any:
    """``item`` (a text or a pair) with each run of whitespace one space and none at the ends."""
    if isinstance(item, tuple):
        return tuple(" ".join(x.split()) for x in item)
    return " ".join(item.split())


def tokenize(
    tokenizer: Any,
    items: Sequence[str] | Sequence[tuple[str, str]],
    *,
    lowercase: bool = False,
    truncate: bool = True,
    max_length: int | None = None,
) -> Tokenized:
    """One batch encode of texts, or of (first, second) pairs, with a tokenizer from ``configure_tokenizer``.
    ``lowercase``: lower-case first (sentence-transformers' ``do_lower_case``). ``truncate=False``: an item
    the tokenizer cut is an InputError naming it and ``max_length`` instead. An item that gives no token
    at all is an InputError."""

    def lower(item: Any) -> Any:
        return item if not lowercase else tuple(x.lower() for x in item) if isinstance(item, tuple) else item.lower()

    bound = max_length * CHARS_PER_TOKEN_BOUND if max_length else None
    given = [lower(item) for item in items]
    shortened = [_cut_chars(item, bound) for item in given]
    encodings = tokenizer.encode_batch(shortened)
    precut = {i for i, (whole, cut) in enumerate(zip(given, shortened)) if whole is not cut}
    unsure = set()  # cut before tokenizing, and whether the rest held more tokens is not known
    for i in precut:
        if encodings[i].overflowing:
            continue  # the cut part alone fills the limit: what the whole text would give
        # Within the limit after the cut: the tokenizer dropped most of those characters (spaces, with WordPiece
        # and other tokenizers that split on them), so the cut may have left a text's words behind. Runs of
        # whitespace squeezed to one space give that tokenizer the same tokens, from far fewer characters.
        squeezed = _squeezed(given[i])
        again = _cut_chars(squeezed, bound)
        encodings[i] = _encode(tokenizer, again)
        if again is not squeezed and not encodings[i].overflowing:
            if truncate:
                unsure.add(i)  # characters it drops other than whitespace (zero-width ones): said as cut
            else:  # refused only if the whole text is over the limit: the whole text, however long
                encodings[i] = _encode(tokenizer, given[i])
    truncated = tuple(bool(e.overflowing) or i in unsure for i, e in enumerate(encodings))
    cut = [i for i, t in enumerate(truncated) if t]
    if cut and not truncate:
        raise InputError(
            f"{_items(cut)} longer than the model's limit of {max_length} tokens and truncation is "
            "off; shorten them, split them, or allow truncation (truncate=True cuts them at the limit and "
            "says which were cut)."
        )
    # nothing but the tokenizer's own special tokens ([CLS] [SEP]): the vector of an empty text, which is refused
    silent = [i for i, e in enumerate(encodings) if all(e.special_tokens_mask)]
    if silent:
        raise InputError(
            f"{_items(silent)} made only of characters this tokenizer drops: it gives no tokens of its own (only the special ones an empty text gets). Leave such items out."
        )
    return Tokenized(tuple(tuple(e.ids) for e in encodings), tuple(tuple(e.type_ids) for e in encodings), truncated)


__all__ = [
    "CHARS_PER_TOKEN_BOUND",
    "Tokenized",
    "check_texts",
    "configure_tokenizer",
    "exceeds_char_bound",
    "json_kind",
    "tokenize",
]
