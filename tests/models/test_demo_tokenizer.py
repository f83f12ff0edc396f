"""The demo decoder's byte-level tokenizer: ids are UTF-8 bytes, written beside the decoder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers", reason="the demo tokenizer is built with the tokenizers package")

from ortpilot.models import DEMO_SPECS, demo_tokenizer_path
from ortpilot.models.tokenizer import (
    CHATML_TEMPLATE,
    byte_to_unicode,
    make_byte_tokenizer,
)

TEXTS = ["hello", "Grüß dich", "世界 🌍", "<|im_start|>user\nhi<|im_end|>\n", "\x00\x01 tab\there", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_the_utf8_bytes_and_decode_back(text: str) -> None:
    tok = make_byte_tokenizer()
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_vocabulary_is_the_decoders() -> None:
    tok = make_byte_tokenizer()
    assert tok.get_vocab_size() == DEMO_SPECS["decoder"].config["vocab_size"] == 256
    assert set(byte_to_unicode().values()) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    # Bytes that are not UTF-8 on their own decode to the replacement character, not an error.
    assert tok.decode([0xC3]) == "\ufffd"


def test_cached_tokenizer_loads_with_the_tokenizers_library() -> None:
    path = demo_tokenizer_path()
    assert path == demo_tokenizer_path()  # built once
    loaded = tokenizers.Tokenizer.from_file(str(path))
    assert loaded.encode("abc").ids == [97, 98, 99]
    config = json.loads((path.parent / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHATML_TEMPLATE


def test_demo_models_writes_it_beside_the_decoder(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "ortpilot.cli.main", "demo-models", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    path = Path(doc["decoder"]["tokenizer"])
    assert path == tmp_path / "tokenizer.json" and Path(doc["decoder"]["path"]).parent == path.parent
    assert tokenizers.Tokenizer.from_file(str(path)).encode("é").ids == [0xC3, 0xA9]
    assert (tmp_path / "tokenizer_config.json").is_file()
