"""The demo decoder's tokenizer: byte-level, one token per byte, token id = byte value.

The demo decoder's vocabulary is 256, so every byte is a token and any text encodes (UTF-8).
It is an ordinary Hugging Face ``tokenizer.json`` built with the ``tokenizers`` library
(byte-level BPE with no merges: GPT-2's byte-to-character table as the vocabulary), so the
code that reads a real model's tokenizer reads this one, offline. ``tokenizer_config.json``
beside it carries a ChatML chat template, as SmolLM2's does; with 256 ids there is no room for
special tokens, so the template's markers are plain bytes and there is no end-of-turn id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortpilot.errors import UsageError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
# SmolLM2-Instruct's template (ChatML), in the Jinja form Hugging Face tokenizers ship.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's table from bytes to printable characters, the alphabet of byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {byte: chr(code) for byte, code in zip(printable, codes)}


def make_byte_tokenizer() -> Any:
    """A ``tokenizers.Tokenizer`` whose ids are the UTF-8 bytes of the text."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise UsageError(
            "The demo tokenizer needs the 'tokenizers' package: pip install tokenizers (or ortpilot[generate])."
        ) from None
    vocab = {char: byte for byte, char in byte_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 2048,
        "chat_template": CHATML_TEMPLATE,
        "bos_token": None,
        "eos_token": None,
    }


def write_byte_tokenizer(folder: str | Path) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder`` (atomically); the first's path."""
    from ortpilot.artifacts.atomic import atomic_write_text

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    path = out / TOKENIZER_FILE
    atomic_write_text(path, make_byte_tokenizer().to_str())
    atomic_write_text(out / CONFIG_FILE, json.dumps(tokenizer_config(), indent=2) + "\n")
    return path
