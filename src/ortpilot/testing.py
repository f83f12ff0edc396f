"""The ortpilot pytest plugin: verified profiles, strict sessions and provider requirements in a
project's own test suite (installed with ortpilot as a ``pytest11`` entry point).

Inert unless used: it adds options, a fixture and a marker, and does nothing else.

- ``pytest --ortpilot-profile OUT/profile.json`` (repeatable): each profile is a collected test
  item that runs ``ortpilot.verify`` (model hash, ORT build, providers, placement in strict mode,
  the machine, the reference outputs) and fails with its message. ``--ortpilot-max-slowdown PCT``
  adds the latency check to those items.
- fixture ``ortpilot_load``: a factory, ``ortpilot_load("m.onnx", providers=["cuda"],
  min_coverage=0.95)`` -> a strict ``VerifiedSession`` (a fallback fails the test instead of
  quietly running on the CPU), released after the test.
- marker ``@pytest.mark.requires_provider("cuda", ...)``: skips the test with the reason the
  doctor's probe gives when a provider cannot run here; ``--ortpilot-strict-providers`` turns
  those skips into failures, for the GPU runner of a CI matrix, where a skip would hide a broken
  install.

It calls only ortpilot's public API (``ortpilot.load``, ``ortpilot.verify``, ``ortpilot.probe``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

MARKER = "requires_provider"
_MISSING = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ortpilot", "ortpilot: verified ONNX Runtime sessions")
    group.addoption(
        "--ortpilot-profile",
        action="append",
        default=[],
        metavar="PATH",
        help="A tune profile (profile.json or its folder) to verify as a test item; repeatable.",
    )
    group.addoption(
        "--ortpilot-max-slowdown",
        default=None,
        metavar="PCT",
        help="With --ortpilot-profile: also time each profile against ORT's default (fails when slower "
        "than recorded by more than PCT percent beyond the noise).",
    )
    group.addoption(
        "--ortpilot-strict-providers",
        action="store_true",
        default=False,
        help="Fail, instead of skipping, tests marked requires_provider whose provider cannot run here.",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*providers): skip unless every provider (short or full ORT name) "
        "runs here; fail instead with --ortpilot-strict-providers",
    )
    pct = config.getoption("--ortpilot-max-slowdown", default=None)
    if pct is not None:
        try:
            if not float(pct) > 0:
                raise ValueError
        except ValueError:
            raise pytest.UsageError(f"--ortpilot-max-slowdown must be a positive percentage, got {pct!r}.") from None
    for path in config.getoption("--ortpilot-profile", default=[]):
        if not (Path(path).is_file() or (Path(path) / "profile.json").is_file()):
            raise pytest.UsageError(
                f"--ortpilot-profile '{path}' is neither a profile.json nor a folder holding one. "
                "Write one with 'ortpilot tune MODEL -o DIR'."
            )


class ProfileItem(pytest.Item):
    """One profile, verified as a test."""

    def __init__(self, *, profile: str, max_slowdown: float | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.profile = profile
        self.max_slowdown = max_slowdown

    def runtest(self) -> None:
        import ortpilot

        result = ortpilot.verify(self.profile, max_slowdown_pct=self.max_slowdown)
        failure = result.failure()
        if failure is not None:
            raise failure

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from ortpilot.errors import OrtpilotError

        if isinstance(excinfo.value, OrtpilotError):
            return f"ortpilot verify {self.profile}: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return Path(self.profile), None, f"ortpilot verify {self.profile}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    pct = config.getoption("--ortpilot-max-slowdown", default=None)
    for path in config.getoption("--ortpilot-profile", default=[]):
        items.append(
            ProfileItem.from_parent(
                session,
                name=f"ortpilot-verify[{path}]",
                profile=path,
                max_slowdown=float(pct) if pct is not None else None,
            )
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    import ortpilot
    from ortpilot.errors import ProviderError

    for marker in item.iter_markers(name=MARKER):
        if not marker.args:
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.{MARKER}() needs at least one provider name, "
                'e.g. @pytest.mark.requires_provider("cuda").'
            )
        for name in marker.args:
            try:
                probe = ortpilot.probe(str(name))
            except ProviderError as exc:
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER}({name!r}): {exc}") from None
            if probe.status != "ok":
                reason = f"{probe.provider} cannot run here: {probe.reason or probe.status}"
                if not item.config.getoption("--ortpilot-strict-providers"):
                    pytest.skip(reason)
                item.stash[_MISSING] = f"{reason} (--ortpilot-strict-providers: a missing provider fails)"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Under --ortpilot-strict-providers a missing provider fails the test itself (not its setup)."""
    missing = item.stash.get(_MISSING, None)
    if missing:
        pytest.fail(missing, pytrace=False)


@pytest.fixture
def ortpilot_load() -> Iterator[Callable[..., Any]]:
    """``ortpilot_load(model, providers=None, min_coverage=None, **kwargs)``: a strict verified session."""
    import ortpilot

    sessions: list[Any] = []

    def load(model: Any, providers: Any = None, *, min_coverage: float | None = None, **kwargs: Any) -> Any:
        session = ortpilot.load(model, providers, policy="strict", min_coverage=min_coverage, **kwargs)
        sessions.append(session)
        return session

    yield load
    sessions.clear()  # the sessions (and their ORT memory) go with the last reference


__all__ = ["MARKER", "ProfileItem", "ortpilot_load"]
