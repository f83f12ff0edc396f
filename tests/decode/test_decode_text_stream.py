"""Text deltas from token ids: whole UTF-8 characters only, stop strings cut, chat templates rendered."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from ortpilot.decode.text import TextStream, chat_template, chatml, render_chat
from ortpilot.models import demo_tokenizer_path
from ortpilot.models.tokenizer import make_byte_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüß dich"}]


def _deltas(stream: TextStream, ids: list[int]) -> list[str]:
    out = [stream.push(i) for i in ids]
    return out + [stream.finish()]


def test_multibyte_characters_are_never_split() -> None:
    text = "naïve 世界 🌍!"
    deltas = _deltas(TextStream(make_byte_tokenizer()), list(text.encode()))
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert deltas[list(text.encode()).index(0xF0)] == ""  # the emoji's first byte waits for the rest


def test_random_bytes_concatenate_to_the_full_decode() -> None:
    tok = make_byte_tokenizer()
    ids = np.random.default_rng(3).integers(0, 256, size=300).tolist()
    assert "".join(_deltas(TextStream(tok), ids)) == tok.decode(ids)


def test_stop_string_cuts_the_text_and_is_never_sent() -> None:
    tok = make_byte_tokenizer()
    stream = TextStream(tok, stop=["<END>", "zz"])
    deltas = _deltas(stream, list(b"hello <EN world <END> more"))
    assert "".join(deltas) == "hello <EN world " and stream.stopped
    # A tail that could still become the stop string waits: "<EN" went out only when " w" came.
    assert "<" not in "".join(deltas[:7])


def test_skipped_ids_are_left_out() -> None:
    tok = make_byte_tokenizer()
    stream = TextStream(tok, skip_ids=frozenset({ord("x")}))
    assert "".join(_deltas(stream, list(b"axbxc"))) == "abc"


def test_demo_chat_template_is_chatml() -> None:
    pytest.importorskip("jinja2", reason="chat templates are Jinja (Ray Serve brings jinja2)")
    template = chat_template(demo_tokenizer_path())
    assert template is not None
    assert render_chat(template, MESSAGES, make_byte_tokenizer()) == chatml(MESSAGES)
    assert chatml(MESSAGES).endswith("<|im_start|>assistant\n")


def test_no_config_means_no_template(tmp_path) -> None:
    (tmp_path / "tokenizer.json").write_text(make_byte_tokenizer().to_str())
    assert chat_template(tmp_path / "tokenizer.json") is None
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    from ortpilot.errors import UsageError

    with pytest.raises(UsageError, match="not a readable tokenizer config"):
        chat_template(tmp_path)


def test_chat_template_jinja_file_wins(tmp_path) -> None:
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "config"}')
    assert chat_template(tmp_path / "tokenizer.json") == "config"
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert chat_template(tmp_path / "tokenizer.json") == "{{ messages[0]['content'] }}"
