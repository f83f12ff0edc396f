"""``ortpilot serve``'s OpenAI side: the flags of ``serve.options.DecoderOptions`` (their defaults are its).

Kept apart from the command so the options can decorate any ``serve`` command: ``openai_options``
adds them, ``decoder_options`` turns their values into the record the library takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ortpilot.decode.options import SPECULATION_MODES
from ortpilot.serve.options import CHAT_TEMPLATES, DecoderOptions

DECODER_OPTIONS = (
    click.option(
        "--tokenizer",
        default=None,
        type=click.Path(dir_okay=True),
        help="tokenizer.json for a decoder (default: the one in the model's folder; demo:decoder has its own).",
    ),
    click.option(
        "--chat-template",
        type=click.Choice(CHAT_TEMPLATES),
        default=DecoderOptions.chat_template,
        show_default=True,
        help="auto: the tokenizer's own template (tokenizer_config.json), else ChatML if it knows "
        "<|im_start|>; chatml: always ChatML.",
    ),
    click.option(
        "--max-streams",
        type=click.IntRange(min=1),
        default=DecoderOptions.max_streams,
        show_default=True,
        help="Sequences one replica decodes together (slots of its KV buffer).",
    ),
    click.option(
        "--max-queue",
        type=click.IntRange(min=0),
        default=DecoderOptions.max_queue,
        show_default=True,
        help="Requests a replica queues beyond its streams; more get 429 with Retry-After.",
    ),
    click.option(
        "--max-length",
        type=click.IntRange(min=2),
        default=None,
        help="Tokens per stream, prompt included (default: the model's positions, at most 1024).",
    ),
    click.option(
        "--formats",
        default=",".join(DecoderOptions.formats),
        show_default=True,
        help="Weight formats each replica holds on its one KV buffer, comma-separated (base, int4, int8-weights, "
        "NAME=PATH); each step runs on the one measured fastest for its row count, every format gated against base.",
    ),
    click.option(
        "--format-min-top1",
        type=click.FloatRange(0.0, 1.0),
        default=DecoderOptions.format_min_top1,
        show_default=True,
        help="Top-1 agreement with base every other format must reach in the generation gate.",
    ),
    click.option(
        "--prefix-cache-mb",
        type=click.FloatRange(min=0.0),
        default=DecoderOptions.prefix_cache_mb,
        show_default=True,
        help="Memory for KV rows of prompt prefixes requests share (system prompts, chat history); 0: off.",
    ),
    click.option(
        "--speculation",
        type=click.Choice(SPECULATION_MODES),
        default=DecoderOptions.speculation,
        show_default=True,
        help="Prompt-lookup speculative decoding: auto (per stream, off while its drafts do not pay), on, off.",
    ),
    click.option(
        "--draft-tokens",
        type=click.IntRange(min=1),
        default=DecoderOptions.draft_tokens,
        show_default=True,
        help="Tokens per prompt-lookup draft.",
    ),
    click.option(
        "--prefill-chunk",
        type=click.IntRange(min=0),
        default=DecoderOptions.prefill_chunk,
        show_default=True,
        help="Prefill long prompts this many tokens at a time between decode steps (0: whole prompts).",
    ),
)


def openai_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(DECODER_OPTIONS):
        command = option(command)
    return command


def decoder_options(values: dict[str, Any]) -> Any:
    """The DecoderOptions record of a command's parsed values (the keys ``openai_options`` adds)."""
    fields = {name: values[name] for name in DECODER_FIELDS}
    fields["formats"] = tuple(f.strip() for f in str(fields["formats"]).split(",") if f.strip())
    return DecoderOptions(**fields)


DECODER_FIELDS = (
    "tokenizer",
    "chat_template",
    "max_streams",
    "max_queue",
    "max_length",
    "prefill_chunk",
    "formats",
    "format_min_top1",
    "prefix_cache_mb",
    "speculation",
    "draft_tokens",
)
