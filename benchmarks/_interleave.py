"""Interleaving decode steps of several configurations in one process, in turns.

Each configuration runs ``turn`` decode steps in a row, then the next one does; every round the
order rotates by one, so over ``len(configs)`` rounds each configuration holds each position
once. Both matter on a small machine with ORT's default thread spinning: after a run, a
session's intra-op threads spin-wait for a while and slow whatever runs next on the same cores.
Measured on the 2-vCPU box with four SmolLM2 int4 sessions (two pairs of identical models) and
turns of 4 steps in a fixed back-and-forth order: the configurations at the two ends of the
order ran at 10.8-12.0 ms/token, the ones in the middle at 16.0-16.9 ms (same models); with
spinning off all four ran at 12.2-12.7 ms. Spinning stays on here (ORT's default, and
onnxruntime-genai offers no switch for it); the rotation spreads its cost evenly, the first step
of each turn takes most of it, and the reported figures are medians over all steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Config = TypeVar("Config")


def interleave_steps(configs: Sequence[Config], steps: int, turn: int, step: Callable[[Config], None]) -> None:
    """Call ``step(config)`` ``steps`` times for every configuration, ``turn`` at a time each."""
    order = list(configs)
    done = 0
    while done < steps:
        count = min(turn, steps - done)
        for config in order:
            for _ in range(count):
                step(config)
        done += count
        order = order[1:] + order[:1]
