"""``ortpilot`` entry point. Each command lives in its own module and is loaded lazily."""

from __future__ import annotations

import importlib

import click

from ortpilot.cli.common import install_signal_handlers, setup_logging

# command name -> module in ortpilot.cli that defines a click command called ``command``.
COMMANDS: dict[str, str] = {
    "doctor": "cmd_doctor",
    "inspect": "cmd_inspect",
    "run": "cmd_run",
    "optimize": "cmd_optimize",
    "quantize": "cmd_quantize",
    "compare": "cmd_compare",
    "bench": "cmd_bench",
    "tune": "cmd_tune",
    "generate": "cmd_generate",
    "verify": "cmd_verify",
    "export": "cmd_export",
    "serve": "cmd_serve",
    "demo-models": "cmd_demo_models",
}


class LazyGroup(click.Group):
    """Imports a command's module only when it runs, so ``ortpilot doctor`` stays fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if self._module(name) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = self._module(name)
        return getattr(module, "command", None) if module else None

    @staticmethod
    def _module(name: str):
        if name not in COMMANDS:
            return None
        try:
            return importlib.import_module(f"ortpilot.cli.{COMMANDS[name]}")
        except ModuleNotFoundError as exc:
            if exc.name == f"ortpilot.cli.{COMMANDS[name]}":
                return None
            raise


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks and ORT's own log lines.")
@click.version_option(package_name="ortpilot")
def cli(debug: bool) -> None:
    """Verified ONNX Runtime sessions, visible placement, measured optimizations."""
    setup_logging(debug)


def main() -> None:
    install_signal_handlers()  # the process's, not the library's: only the command line installs them
    cli(prog_name="ortpilot")


if __name__ == "__main__":
    main()
