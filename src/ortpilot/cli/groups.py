"""Argument groups: a group owns its flags and builds the record the API takes.

As Polygraphy's argument groups build loaders, a command here declares the records it needs, and each
group turns its own flags into one (a ``TuneRequest``, a ``QuantizeOptions`` ...): the command body is
then "build records, call the API, render", and a flag is written once, where its group is.

``arg_group(dest, build, *options)`` is a decorator. ``options`` are click option decorators, or tuples of
them (flag sets several groups share, e.g. ``GATE_FLAGS``); their values go to ``build`` as keywords, and
the command receives ``build(...)``'s result as ``dest`` instead of them. ``uses`` names parameters the
command keeps that ``build`` reads too (a command's MODEL argument). Put the group directly above the
function, under ``handle_errors``, so an error ``build`` raises is reported like any other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])
Option = Callable[[F], F]


def flatten(options: Iterable[Any]) -> list[Option]:
    """Option decorators in the order given, with flag sets (tuples) opened in place."""
    out: list[Option] = []
    for option in options:
        if isinstance(option, (tuple, list)):
            out.extend(flatten(option))
        else:
            out.append(option)
    return out


def param_names(options: Iterable[Any]) -> list[str]:
    """The keyword names click passes for ``options`` (flags with ``expose_value=False`` pass none)."""

    def probe() -> None:
        return None

    for option in reversed(flatten(options)):
        probe = option(probe)
    params: list[click.Parameter] = getattr(probe, "__click_params__", [])
    return [p.name for p in params if p.expose_value and p.name]


def arg_group(dest: str, build: Callable[..., Any], *options: Any, uses: Sequence[str] = ()) -> Callable[[F], F]:
    """Add ``options`` to the command and hand it ``build(**their values)`` as ``dest`` (module docstring)."""
    listed = flatten(options)
    own = param_names(listed)

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in own if name in kwargs}
            values.update({name: kwargs[name] for name in uses if name in kwargs})
            kwargs[dest] = build(**values)
            return func(*args, **kwargs)

        # click collects a command's parameters from __click_params__ (each option decorator appends to it);
        # functools.wraps shares the function's list, so the wrapper gets a copy of its own first.
        wrapper.__click_params__ = list(getattr(func, "__click_params__", []))  # type: ignore[attr-defined]
        decorated: Any = wrapper
        for option in reversed(listed):
            decorated = option(decorated)
        return decorated  # type: ignore[no-any-return]

    return decorate


__all__ = ["arg_group", "flatten", "param_names"]
