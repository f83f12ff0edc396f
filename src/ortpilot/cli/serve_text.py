"""``ortpilot serve``'s text-model flags: the argument group that builds ``serve.options.TextOptions`` (its
defaults are the record's), for models served from a text-model folder or a profile of one."""

from __future__ import annotations

import click

from ortpilot.serve.options import TextOptions

TEXT_OPTIONS = (
    click.option(
        "--text-batch",
        "text_batch",
        type=click.IntRange(min=1),
        default=TextOptions.batch,
        show_default=True,
        help="Text models: the most texts in one session run (texts of waiting requests are sorted by length, "
        "cut into runs of at most this many where padding would cost more than another run, and each run padded "
        "to its longest text).",
    ),
    click.option(
        "--max-texts",
        type=click.IntRange(min=1),
        default=TextOptions.max_texts,
        show_default=True,
        help="Text models: the most texts (or documents) in one request; more get 413.",
    ),
    click.option(
        "--max-text-tokens",
        type=click.IntRange(min=2),
        default=None,
        help="Text models: tokens per text, special tokens included (default: the model's own limit); a longer "
        "text is cut and the answer says which, or refused with --no-truncate.",
    ),
    click.option(
        "--max-request-tokens",
        type=click.IntRange(min=1),
        default=TextOptions.max_request_tokens,
        show_default=True,
        help="Text models: the tokens of one request's texts together; more get 413.",
    ),
    click.option(
        "--no-truncate",
        "truncate",
        flag_value=False,
        default=True,
        help="Text models: refuse a text over the limit (400 naming it) instead of cutting it.",
    ),
)


def text_options(
    text_batch: int, max_texts: int, max_text_tokens: int | None, max_request_tokens: int, truncate: bool
) -> TextOptions:
    """The ``TextOptions`` of the group's flags."""
    return TextOptions(
        batch=text_batch,
        max_texts=max_texts,
        max_text_tokens=max_text_tokens,
        max_request_tokens=max_request_tokens,
        truncate=truncate,
    )


def text_params() -> frozenset[str]:
    """The command's parameter names of these flags (what a RayService manifest carries with ServeOptions)."""
    from ortpilot.cli.groups import param_names

    return frozenset(param_names(TEXT_OPTIONS))


__all__ = ["TEXT_OPTIONS", "text_options", "text_params"]
