"""Text in and out of the loops: a Hugging Face ``tokenizer.json``, ChatML prompts, stop ids.

Only the ``tokenizers`` package is needed (no transformers); it is optional, so a missing
package or file is an exit-2 message rather than an ImportError.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ortpilot.data.text import load_tokenizer as load_tokenizer  # the one reader; the loops use it from here
from ortpilot.errors import UsageError

# ChatML, the template of SmolLM2-Instruct (and Qwen): the text a chat model was trained on.
CHATML_USER = "<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
CHATML_SYSTEM = "<|im_start|>system\n{text}<|im_end|>\n"
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>", "<|end_of_text|>", "<eos>")


def chat_prompt(tokenizer: Any, text: str, system: str | None = None) -> str:
    """``text`` as one ChatML user turn, ready for the assistant's answer."""
    if tokenizer.token_to_id("<|im_start|>") is None:
        raise UsageError(
            "--chat applies the ChatML template, but this tokenizer has no <|im_start|> token; "
            "write the template into --prompt yourself."
        )
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


def chat_template(tokenizer_path: str | os.PathLike) -> str | None:
    """The Jinja chat template beside the tokenizer: ``chat_template.jinja`` (as transformers 5 saves
    it), else the ``chat_template`` of ``tokenizer_config.json``; None when there is neither."""
    folder = Path(tokenizer_path)
    folder = folder if folder.is_dir() else folder.parent
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    import json

    try:
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError) as exc:
        raise UsageError(f"'{config}' is not a readable tokenizer config ({exc}).") from None
    if isinstance(template, list):  # several named templates: the default one
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    return template if isinstance(template, str) and template.strip() else None


def render_chat(template: str, messages: list[dict[str, str]], tokenizer: Any = None) -> str:
    """``messages`` through a Hugging Face chat template (Jinja, sandboxed), ready for the answer."""
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise UsageError(
            "The tokenizer's chat template is Jinja: pip install jinja2 (Ray Serve brings it), "
            "or use the built-in ChatML template."
        ) from None

    def raise_exception(message: str) -> None:
        raise UsageError(f"The chat template refused the messages: {message}")

    special = {}
    for name, token in (("bos_token", "<s>"), ("eos_token", "</s>")):
        if tokenizer is not None and tokenizer.token_to_id(token) is not None:
            special[name] = token
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=True, **{"bos_token": "", "eos_token": "", **special}
        )
    except TemplateError as exc:
        raise UsageError(f"The chat template failed on these messages: {exc}") from None


def chatml(messages: list[dict[str, str]]) -> str:
    """The messages as ChatML turns, then the assistant's turn opened."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def stop_prefix_at_end(text: str, stop: str) -> int:
    """The length of the longest proper prefix of ``stop`` that ``text`` ends with: the tail that may still
    become ``stop``. Linear in ``len(stop)`` (KMP: ``stop``'s border table, then a match over the last
    ``len(stop) - 1`` characters), so a long stop string costs each token its length, not its square."""
    pattern = stop[:-1]
    if not pattern:
        return 0
    border = [0] * len(pattern)
    for i in range(1, len(pattern)):
        k = border[i - 1]
        while k and pattern[i] != pattern[k]:
            k = border[k - 1]
        border[i] = k + (pattern[i] == pattern[k])
    matched = 0
    for char in text[-len(pattern) :]:
        while matched and (matched == len(pattern) or char != pattern[matched]):
            matched = border[matched - 1]
        if char == pattern[matched]:
            matched += 1
    return matched


class TextStream:
    """Token ids in, text deltas out: never a half UTF-8 character, never a stop string.

    Each delta is the decoded text so far minus what was handed out. A trailing replacement
    character (a multi-byte character not complete yet) and a tail that could still become a
    stop string wait for the next token; ``finish`` hands out the rest.
    """

    def __init__(self, tokenizer: Any, stop: list[str] = (), skip_ids: frozenset[int] = frozenset()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.skip_ids = skip_ids
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False

    def text(self) -> str:
        return self.tokenizer.decode([t for t in self.ids if t not in self.skip_ids])

    def push(self, token: int) -> str:
        """The delta after ``token``; sets ``stopped`` when a stop string appeared (the text ends before it)."""
        self.ids.append(int(token))
        text = self.text()
        for stop in self.stop:
            at = text.find(stop, max(0, len(self.sent) - len(stop)))
            if at >= 0:
                self.stopped = True
                return self._hand_out(text[:at])
        ready = text.rstrip("\ufffd")
        hold = max((stop_prefix_at_end(ready, s) for s in self.stop), default=0)
        return self._hand_out(ready[: len(ready) - hold])

    def finish(self) -> str:
        return "" if self.stopped else self._hand_out(self.text())

    def _hand_out(self, text: str) -> str:
        if not text.startswith(self.sent) or len(text) <= len(self.sent):
            return ""
        delta = text[len(self.sent) :]
        self.sent = text
        return delta
