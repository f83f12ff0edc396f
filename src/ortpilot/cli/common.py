"""What every command shares: error handling, exit codes, JSON on stdout, logs on stderr."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from ortpilot.errors import Interrupted, OrtpilotError

F = TypeVar("F", bound=Callable[..., Any])

# Logs, tables for humans and progress go to stderr unless a command renders to stdout on
# purpose; --json keeps stdout for exactly one JSON document.
stderr = Console(stderr=True)
stdout = Console()


def setup_logging(debug: bool) -> None:
    from rich.logging import RichHandler

    root = logging.getLogger("ortpilot")
    root.handlers.clear()
    handler = RichHandler(console=stderr, show_time=False, show_path=False, markup=False)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=_json_default) + "\n")
    sys.stdout.flush()


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return str(obj)


def handle_errors(func: F) -> F:
    """Turn OrtpilotError into a one-paragraph message and its exit code; --debug shows tracebacks."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        debug = bool(ctx.find_root().params.get("debug"))
        try:
            return func(*args, **kwargs)
        except OrtpilotError as exc:
            if debug:
                stderr.print_exception()
            stderr.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            ctx.exit(exc.exit_code)
        except OSError as exc:  # a full disk, a read-only folder, no permission: a message, not a traceback
            from ortpilot.artifacts.oserrors import is_environmental, storage_error

            if debug or not is_environmental(exc):
                raise
            stderr.print(f"[bold red]error:[/] {escape(str(storage_error(exc)))}", highlight=False, soft_wrap=True)
            ctx.exit(2)
        except KeyboardInterrupt as exc:
            stderr.print(
                f"[yellow]interrupted[/] ({interrupt_name(exc)}); every file ortpilot writes is renamed "
                "into place only when complete, so nothing half-written was left.",
                highlight=False,
            )
            ctx.exit(interrupt_exit_code(exc))

    return wrapper  # type: ignore[return-value]


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP end a command the way Ctrl-C does: ``Interrupted`` unwinds every ``finally``
    (journal kept, worker children stopped, scratch folders removed), then exit 128 + the signal."""
    import signal

    def raise_interrupted(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupted)


def interrupt_exit_code(exc: BaseException) -> int:
    """130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + getattr(exc, "signum", 2)


def interrupt_name(exc: BaseException) -> str:
    import signal

    return signal.Signals(getattr(exc, "signum", signal.SIGINT)).name


def parse_kv_list(items: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise click.BadParameter(f"'{item}' is not NAME=VALUE")
        out[key] = value
    return out


def resolve_model_arg(text: str) -> str:
    """``demo:NAME`` means a built-in demo model (built on first use); a folder means the model file
    it holds (``data.folder``: optimum, Hugging Face ``onnx/``, onnxruntime-genai layouts; the
    command's ``--model-file`` chooses among several); anything else is a path."""
    if text.startswith("demo:"):
        from ortpilot.models import demo_model_path

        return str(demo_model_path(text.split(":", 1)[1]))
    ctx = click.get_current_context(silent=True)
    model_file = ctx.meta.get("ortpilot.model_file") if ctx is not None else None
    if model_file is not None or os.path.isdir(text):
        from ortpilot.data import model_path_of

        return str(model_path_of(text, model_file))
    return text


def _remember_model_file(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta["ortpilot.model_file"] = value


# MODEL may be a folder: this picks the model file when it holds several (docs/concepts/model-folders.md).
MODEL_FILE_OPTION = click.option(
    "--model-file",
    default=None,
    expose_value=False,
    callback=_remember_model_file,
    is_eager=True,
    help="With MODEL a folder holding several .onnx files: the one to "
    "use (a name in the folder or its onnx/ subfolder).",
)


ISOLATE_HELP = (
    "Create each model's session in a child process first: if ORT crashes or hangs on the model, "
    "only the child dies and the command exits 1 saying so."
)


def preflight_isolated(models: Sequence[str], providers: Sequence[str] | None = None, settings: Any = None) -> None:
    """``--isolate``: ``ortpilot.api.preflight_isolated`` (a session per model in a child process first)."""
    from ortpilot.api import preflight_isolated as preflight

    preflight(models, providers, settings)


def load_input_files(items: tuple[str, ...]) -> dict[str, Any]:
    """``--input NAME=FILE.npy`` (or one ``.npz`` holding every input) into arrays."""
    import numpy as np

    from ortpilot.errors import InputError
    from ortpilot.graph.feeds import read_npz

    feeds: dict[str, Any] = {}
    for item in items:
        name, eq, path = item.partition("=")
        try:
            if not eq and item.endswith(".npz"):
                feeds.update(read_npz(item))
                continue
            if not eq:
                raise InputError(f"--input '{item}' is not NAME=FILE.npy (or one FILE.npz with all inputs).")
            value = np.load(path, allow_pickle=False)
            if not isinstance(value, np.ndarray):  # an .npz given as one input's file
                value.close()
                raise ValueError("it holds named arrays (an .npz), not one array: pass it alone, as --input FILE.npz")
            feeds[name] = value
        except FileNotFoundError:
            raise InputError(f"Input file '{path or item}' does not exist.") from None
        except (ValueError, OSError, EOFError) as exc:  # EOFError: an empty file
            raise InputError(f"Input file '{path or item}' is not a readable .npy/.npz array ({exc}).") from None
    return feeds


PROVIDER_HELP = "Execution provider, in priority order (repeatable): cpu cuda tensorrt openvino coreml dml webgpu qnn, or 'cuda:device_id=1'."
METRIC_HELP = (
    "How outputs are compared: METRIC for every output, or OUTPUT=METRIC for one (repeatable). Metrics: "
    "cosine, top1, rel_l2, exact, pooled_cosine, masked_cosine, masked_top1, masked_rel_l2, masked_exact. "
    "Default: chosen per output on evidence, printed beside it."
)
SHAPE_HELP = "Fix a dynamic shape: NAME=1x3x224x224 for an input, or DIM=64 for a symbolic dim (repeatable)."
