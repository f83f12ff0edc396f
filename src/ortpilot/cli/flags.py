"""Flag sets several commands share, each defined once (``cli.groups`` turns them into records).

A flag set is a tuple of click option decorators; an ``arg_group`` takes it as one of its options. Where
commands word a shared flag's help for themselves (quantize's gate applies to its INT8 modes only), the
set is a function of that wording; the flag's name, type and default are still written here only, the
defaults read from the record the flag fills (``passes.options``, ``gate.options``, ``measure.options``).
The single options ``cli.common`` holds (``SHAPE_OPTION``, ``POLICY_OPTION``, ``LEVEL_OPTION``, the
real-data group) are the same kind of thing, older.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

from ortpilot.cli.common import INPUT_HELP, METRIC_HELP, PROVIDER_HELP
from ortpilot.gate.generation import DEFAULT_MIN_TOP1
from ortpilot.gate.options import DEFAULT_MAX_ROUNDS

Option = Callable[[Any], Any]

OUTPUTS_HELP = (
    "An output the deployment reads (repeatable): the model is pruned to these before anything else, "
    "and only they are gated, timed and written. Default: all of the model's outputs."
)
MAX_POSITIONS_HELP = (
    "With --fuse: positions the fused model's constant rotary tables cover, its length limit "
    "(default: the export's recorded context length, else 8192; 0 keeps them computed per step)."
)


def choice_option(flag: str, choices: Sequence[str], default: str, help: str | None = None) -> Option:
    """A flag that takes one of ``choices`` (a record's), its default (the record's) shown in ``--help``."""
    return click.option(flag, type=click.Choice(list(choices)), default=default, show_default=True, help=help)


def count_option(flag: str, default: int, help: str, *, least: int = 1, dest: str | None = None) -> Option:
    """A flag that takes a whole number of at least ``least``, its default (a record's) shown in ``--help``."""
    decls = (flag, dest) if dest else (flag,)
    return click.option(*decls, type=click.IntRange(least), default=default, show_default=True, help=help)


def provider_option(help: str = PROVIDER_HELP) -> Option:
    """``-p/--provider`` (repeatable, in priority order) into ``providers``."""
    return click.option("-p", "--provider", "providers", multiple=True, help=help)


PROVIDER_OPTION = provider_option()
INPUT_OPTION = click.option("--input", "inputs", multiple=True, help=INPUT_HELP)


def gate_flags(max_error_help: str, *, applies: str = "") -> tuple[Option, ...]:
    """``--max-error``, ``--metric``, ``--outputs``: the output gate's limit, metrics and the outputs a
    deployment reads (``GateOptions``' fields of those names); ``applies`` ends the help of the last two
    where only some of a command's modes read them."""
    suffix = f" {applies}" if applies else ""
    return (
        click.option("--max-error", type=float, default=None, help=max_error_help),
        click.option("--metric", "metric", multiple=True, help=METRIC_HELP + suffix),
        click.option("--outputs", "outputs", multiple=True, metavar="NAME", help=OUTPUTS_HELP + suffix),
    )


AUTO_EXCLUDE_FLAGS = (
    click.option("--auto-exclude", is_flag=True, help="Leave the worst layers in float until --max-error passes."),
    count_option("--max-rounds", DEFAULT_MAX_ROUNDS, "Rounds of --auto-exclude."),
)


def min_top1_option(help: str) -> Option:
    """``--min-top1``: the generation gate's least top-1 next-token agreement (``GateOptions.min_top1``)."""
    return click.option(
        "--min-top1", type=click.FloatRange(0, 1), default=DEFAULT_MIN_TOP1, show_default=True, help=help
    )


def fusion_flags(fuse_help: str, positions_help: str = MAX_POSITIONS_HELP, *, dest: str = "fuse") -> tuple[Option, ...]:
    """``--fuse`` (into ``dest``) and ``--max-positions``: the decoder fusion into GroupQueryAttention and the
    rows of its constant rotary tables (``DecoderFusionOptions.max_positions``)."""
    return (
        click.option("--fuse", dest, is_flag=True, help=fuse_help),
        click.option("--max-positions", type=click.IntRange(min=0), default=None, help=positions_help),
    )


__all__ = [
    "AUTO_EXCLUDE_FLAGS",
    "INPUT_OPTION",
    "MAX_POSITIONS_HELP",
    "OUTPUTS_HELP",
    "PROVIDER_OPTION",
    "choice_option",
    "count_option",
    "fusion_flags",
    "gate_flags",
    "min_top1_option",
    "provider_option",
]
