"""The ``ortpilot`` group (``cli.main``): every command module is registered, listed and loads; ``--version``.

A command whose module is renamed or missing leaves ``--help`` without a word (the lazy group skips it), so
the list is checked against the ``cmd_*.py`` files themselves.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

import ortpilot.cli
from ortpilot.cli.main import COMMANDS, cli
from ortpilot.version import __version__


def test_every_command_module_is_registered_listed_and_loads():
    modules = sorted(p.stem for p in Path(ortpilot.cli.__file__).parent.glob("cmd_*.py"))
    assert sorted(COMMANDS.values()) == modules
    res = CliRunner().invoke(cli, ["--help"])
    assert res.exit_code == 0, res.output
    listed = [line.split()[0] for line in res.output.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == list(COMMANDS)
    for name in COMMANDS:
        sub = CliRunner().invoke(cli, [name, "--help"])
        assert sub.exit_code == 0 and f"cli {name} [OPTIONS]" in sub.output, (name, sub.output)


def test_version_is_the_packages():
    res = CliRunner().invoke(cli, ["--version"])
    assert res.exit_code == 0 and res.output.split()[-1] == __version__, res.output
