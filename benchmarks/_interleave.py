"""Interleaving decode steps of several configurations in one process, in turns.

Each configuration runs ``turn`` decode steps in a row, then the next one does; the order of
configurations reverses every round. Turns of a few steps (rather than one) matter on a small
machine: ORT's intra-op threads spin-wait for a while after a run, and with one-step turns the
spinning threads of the session that just ran steal the cores from the next one. Spinning stays
on (it is ORT's default and what users run); its tail lands on the first step of each turn only,
and the medians are over all steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Config = TypeVar("Config")


def interleave_steps(configs: Sequence[Config], steps: int, turn: int, step: Callable[[Config], None]) -> None:
    """Call ``step(config)`` ``steps`` times for every configuration, ``turn`` at a time each."""
    done = 0
    rounds = 0
    while done < steps:
        count = min(turn, steps - done)
        for config in configs if rounds % 2 == 0 else list(configs)[::-1]:
            for _ in range(count):
                step(config)
        done += count
        rounds += 1
