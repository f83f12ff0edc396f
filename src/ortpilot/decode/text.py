"""Text in and out of the loops: a Hugging Face ``tokenizer.json``, ChatML prompts, stop ids.

Only the ``tokenizers`` package is needed (no transformers); it is optional, so a missing
package or file is an exit-2 message rather than an ImportError.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ortpilot.errors import UsageError

# ChatML, the template of SmolLM2-Instruct (and Qwen): the text a chat model was trained on.
CHATML_USER = "<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
CHATML_SYSTEM = "<|im_start|>system\n{text}<|im_end|>\n"
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>", "<|end_of_text|>", "<eos>")


def load_tokenizer(path: str | os.PathLike) -> Any:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json`` (or a folder holding one)."""
    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise UsageError(f"Tokenizer file '{file}' does not exist; pass the tokenizer.json saved with the model.")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("--tokenizer needs the 'tokenizers' package: pip install tokenizers.") from None
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:
        raise UsageError(f"'{file}' is not a Hugging Face tokenizer.json ({exc}).") from None


def chat_prompt(tokenizer: Any, text: str, system: str | None = None) -> str:
    """``text`` as one ChatML user turn, ready for the assistant's answer."""
    if tokenizer.token_to_id("<|im_start|>") is None:
        raise UsageError("--chat applies the ChatML template, but this tokenizer has no <|im_start|> token; "
                         "write the template into --prompt yourself.")
    head = CHATML_SYSTEM.format(text=system) if system else ""
    return head + CHATML_USER.format(text=text)


def stop_ids(tokenizer: Any) -> list[int]:
    """End-of-turn and end-of-text ids the tokenizer knows."""
    ids = [tokenizer.token_to_id(t) for t in STOP_TOKENS]
    return [i for i in ids if i is not None]


def encode(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    if not ids:
        raise UsageError("The prompt encodes to no tokens; give some text.")
    return list(ids)
