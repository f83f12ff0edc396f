"""data.textinput: the caller's texts checked item by item, one batch encode with the tokenizer's own padding off,
truncation said per item (or refused), pairs with their type ids."""

from __future__ import annotations

import pytest

from ortpilot.data.textinput import Tokenized, check_texts, configure_tokenizer, tokenize
from ortpilot.errors import InputError
from ortpilot.models.textfolder import make_text_tokenizer

LONG = "the cat sat on the mat " * 10  # 60 words


def test_check_texts_takes_strings_and_utf8_bytes() -> None:
    assert check_texts("one text") == ["one text"]
    assert check_texts(["a", "b"]) == ["a", "b"]
    assert check_texts(("a", "é".encode())) == ["a", "é"]
    assert check_texts(t for t in ["a"]) == ["a"]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([], "are an empty list"),
        (["fine", 3], "Item 1 of the texts is a number, not a string"),
        (["fine", None], "Item 1 of the texts is null, not a string"),
        ([b"ok", b"\xff\xfe"], r"Item 1 of the texts is not UTF-8 \(byte 0"),
        (["a", "", "b", "  \n", "c"], "Items 1, 3 of the texts are empty or only whitespace"),
        (12, "must be a list of strings, not int"),
        (["ok", "a\ud800b"], r"Item 1 of the texts is not valid Unicode \(character 1 is a lone surrogate"),
    ],
)
def test_check_texts_names_the_bad_items(items, message: str) -> None:
    with pytest.raises(InputError, match=message):
        check_texts(items)


def test_many_bad_items_are_counted_not_all_listed() -> None:
    with pytest.raises(InputError, match="Items 0, 1, 2, 3, 4 and 3 more of the documents are"):
        check_texts([""] * 8, "documents")


def test_truncation_is_said_per_item_and_can_be_refused() -> None:
    tok = configure_tokenizer(make_text_tokenizer(), 16)
    got = tokenize(tok, ["the cat", LONG, "a dog"])
    assert got.truncated == (False, True, False)
    assert got.lengths == [4, 16, 4]  # [CLS] the cat [SEP]; the long one cut at 16 with its [SEP]
    assert got.ids[1][-1] == tok.token_to_id("[SEP]")
    with pytest.raises(InputError, match="Item 1 is longer than the model's limit of 16 tokens"):
        tokenize(tok, ["the cat", LONG], truncate=False, max_length=16)
    untruncated = tokenize(configure_tokenizer(make_text_tokenizer(), None), [LONG])
    assert untruncated.lengths == [62] and untruncated.truncated == (False,)


def test_the_tokenizers_own_padding_is_switched_off() -> None:
    tok = make_text_tokenizer()
    tok.enable_padding(length=128, pad_id=0)  # as many exports ship tokenizer.json
    assert len(tok.encode("the cat").ids) == 128
    assert tokenize(configure_tokenizer(tok, 128), ["the cat"]).lengths == [4]


def test_pairs_get_type_ids_and_lowercase_applies_to_both() -> None:
    tok = configure_tokenizer(make_text_tokenizer(), 64)
    got = tokenize(tok, [("Where is the STATION", "the train station")], lowercase=True)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    assert got.ids[0][0] == cls and got.ids[0].count(sep) == 2
    assert got.type_ids[0] == (0,) * 6 + (1,) * 4
    assert tok.id_to_token(got.ids[0][4]) == "station"


def test_an_item_that_gives_no_token_is_refused() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(make_text_tokenizer().to_str())
    tok.post_processor = None  # no [CLS]/[SEP]: text of only dropped characters gives nothing
    with pytest.raises(InputError, match="Item 1 is made only of characters this tokenizer drops"):
        tokenize(configure_tokenizer(tok, 16), ["the cat", "\x00\x01"])
    # with [CLS] and [SEP] around it, a zero-width space gives those two alone: an empty text's vector
    with pytest.raises(InputError, match="Item 1 is made only of characters this tokenizer drops"):
        tokenize(configure_tokenizer(make_text_tokenizer(), 16), ["the cat", "\u200b\u200b"])


def test_tokenized_parts_join_back_into_the_whole() -> None:
    tokenizer = configure_tokenizer(make_text_tokenizer(), 8)
    whole = tokenize(tokenizer, ["the cat", LONG, "a dog runs fast"])
    assert len(whole) == 3 and whole.truncated == (False, True, False)
    first, rest = whole.part(0, 1), whole.part(1, 3)
    assert len(first) == 1 and rest.lengths == whole.lengths[1:]
    assert Tokenized.join([first, rest]) == whole


def test_a_text_far_over_the_limit_is_cut_by_characters_first_and_keeps_the_same_tokens() -> None:
    """A megabyte is not tokenized to keep 16 tokens; a text of mostly spaces that fits is still read whole, and
    truncating too (cut at 1,600 characters, "cat" + 5,000 spaces + "mat" read as [CLS] cat [SEP], a vector of
    another text, said to be truncated; a server refused it under --no-truncate as over 16 tokens with 4)."""
    tok = configure_tokenizer(make_text_tokenizer(), 16)
    huge, short = "the cat sat on the mat " * 50_000, "the cat sat on the mat " * 20
    cut = tokenize(tok, [huge, short], max_length=16)
    assert cut.ids[0] == cut.ids[1] and len(cut.ids[0]) == 16 and cut.truncated == (True, True)
    spaced = "cat" + " " * 5_000 + "mat"  # over 16 x 100 characters, 4 tokens with [CLS] and [SEP]
    whole = tokenize(tok, [spaced], truncate=False, max_length=16)
    assert len(whole.ids[0]) == 4 and whole.truncated == (False,)
    kept = tokenize(tok, [spaced], max_length=16)  # truncating: the same tokens, nothing cut
    assert kept.ids == whole.ids and kept.truncated == (False,)
    # characters the tokenizer drops that are not whitespace (zero-width spaces): the cut is said, not hidden
    hidden = "cat" + "\u200b" * 5_000 + "mat"
    assert tokenize(tok, [hidden], max_length=16).truncated == (True,)
    read = tokenize(tok, [hidden], truncate=False, max_length=16)  # refusing long texts: read whole, it fits
    assert read.truncated == (False,) and len(read.ids[0]) < 16 and read.ids[0][-1] == whole.ids[0][-1]
    with pytest.raises(InputError, match="longer than the model's limit of 16 tokens"):
        tokenize(tok, [huge], truncate=False, max_length=16)
