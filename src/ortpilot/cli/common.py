"""What every command shares: error handling, exit codes, JSON on stdout, logs on stderr."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

from ortpilot.errors import Interrupted, OrtpilotError
from ortpilot.measure.metrics import METRIC_DESCRIPTIONS
from ortpilot.session import LEVEL_NAMES, POLICIES

F = TypeVar("F", bound=Callable[..., Any])

# Columns a console lays out when it writes to a pipe or file (CI logs): rich's 80 cut table cells short
# ("int8-dynam…"); a terminal keeps its own width, COLUMNS=N sets one.
PIPED_WIDTH = 200


class WideWhenPiped(Console):
    """A console that, writing to something that is not a terminal, is ``PIPED_WIDTH`` columns wide instead of
    80, unless COLUMNS or an explicit width says otherwise; decided at each write, since the stream it writes to
    can be swapped after import (click's test runner, redirection)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and not self.is_terminal:
            return ConsoleDimensions(max(size.width, PIPED_WIDTH), size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


# Logs, tables for humans and progress go to stderr unless a command renders to stdout on
# purpose; --json keeps stdout for exactly one JSON document.
stderr = WideWhenPiped(stderr=True)
stdout = WideWhenPiped()


def setup_logging(debug: bool) -> None:
    from rich.logging import RichHandler

    root = logging.getLogger("ortpilot")
    root.handlers.clear()
    handler = RichHandler(console=stderr, show_time=False, show_path=False, markup=False)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False
    handler.addFilter(_remember)
    warnings.showwarning = _show_warning


_python_showwarning = warnings.showwarning
_logged: set[str] = set()  # messages the console already printed as log lines


def _remember(record: logging.LogRecord) -> bool:
    if len(_logged) < 1000:
        _logged.add(record.getMessage())
    return True


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, *args: Any) -> None:
    """ortpilot's own warnings (NaN in a feed, ...) as one console line, not Python's "file:line: Category"; one
    the log already printed (a machine mismatch is logged and warned, for API callers' filters) not twice."""
    if category.__module__.split(".")[0] != "ortpilot":
        _python_showwarning(message, category, filename, lineno, *args)
    elif str(message) not in _logged:
        stderr.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False)


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


# MODEL may be a folder: this picks the model file when it holds several (docs/concepts/real-data.md).
MODEL_FILE_OPTION = click.option(
    "--model-file",
    default=None,
    expose_value=False,
    callback=_remember_model_file,
    is_eager=True,
    help="With MODEL a folder holding several .onnx files: the one to "
    "use (a name in the folder or its onnx/ subfolder).",
)


def _remember_data(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None and param.name:
        ctx.meta.setdefault("ortpilot.data", {})[param.name] = value


def _data_option(*decls: str, **kwargs: Any) -> Callable[[F], F]:
    return click.option(*decls, default=None, expose_value=False, callback=_remember_data, **kwargs)


# Text and images as calibration and gate data (docs/concepts/real-data.md): one group of options
# for quantize, tune and compare, read back by ``real_data_arg``.
_REAL_DATA = (
    _data_option(
        "--calibration-text",
        metavar="FILE",
        help="UTF-8 text, one sample per line, tokenized with the model folder's tokenizer.json (or "
        "--tokenizer); split into calibration and held-out gate samples.",
    ),
    _data_option(
        "--calibration-images",
        metavar="DIR",
        help="A folder of .jpg/.png/.webp, preprocessed as the folder's preprocessor_config.json says (or "
        "--image-size/--mean/--std/--layout); split into calibration and held-out gate samples.",
    ),
    _data_option(
        "--tokenizer",
        metavar="FILE",
        help="tokenizer.json for --calibration-text (default: the model folder's); decoder pairs and "
        "int4/int8-weights: the tokenizer of real held-out text prompts.",
    ),
    _data_option(
        "--image-size",
        metavar="HxW",
        help="With --calibration-images and no preprocessor_config.json; Hxauto keeps each image's own aspect at "
        "height H (a dynamic width: text lines).",
    ),
    _data_option("--mean", metavar="R,G,B", help="Per-channel mean subtracted after scaling pixels to 0..1."),
    _data_option("--std", metavar="R,G,B", help="Per-channel std divided by after the mean."),
    _data_option(
        "--layout",
        type=click.Choice(["NCHW", "NHWC"], case_sensitive=False),
        help="Image tensor layout with --image-size (default NCHW).",
    ),
)


def REAL_DATA_OPTIONS(func: F) -> F:
    """The ``--calibration-text/--calibration-images/--tokenizer/--image-size/--mean/--std/--layout`` group."""
    for option in reversed(_REAL_DATA):
        func = option(func)
    return func


def data_flags() -> dict[str, str]:
    """The real-data options this command was given (name -> value)."""
    ctx = click.get_current_context()
    return dict(ctx.meta.get("ortpilot.data", {}))


def real_data_arg(model: str | None, *, lone_tokenizer: bool = False) -> Any:
    """The ``TextData`` / ``ImageData`` the options describe, with the tokenizer or preprocessing of
    MODEL's folder when MODEL is one (``data.real_data``); None without data options.
    ``lone_tokenizer``: a --tokenizer without --calibration-text is for the command's decoder prompts."""
    flags = data_flags()
    if lone_tokenizer and set(flags) <= {"tokenizer"}:
        return None
    if not flags:
        return None
    from ortpilot.data import real_data, resolve_model_folder

    folder = None
    if model is not None and not model.startswith("demo:") and os.path.isdir(model):
        folder = resolve_model_folder(model, click.get_current_context().meta.get("ortpilot.model_file"))
    return real_data(
        text=flags.get("calibration_text"),
        images=flags.get("calibration_images"),
        folder=folder,
        tokenizer=flags.get("tokenizer"),
        image_size=flags.get("image_size"),
        mean=flags.get("mean"),
        std=flags.get("std"),
        layout=(flags.get("layout") or "NCHW").upper(),
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
    from ortpilot.errors import InputError
    from ortpilot.graph.feeds import read_npy, read_npz

    feeds: dict[str, Any] = {}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq and item.endswith(".npz"):
            feeds.update(read_npz(item))
            continue
        if not eq:
            raise InputError(f"--input '{item}' is not NAME=FILE.npy (or one FILE.npz with all inputs).")
        feeds[name] = read_npy(path, f"Input file for '{name}'")
    return feeds


POLICY_OPTION = click.option(
    "--policy",
    type=click.Choice(POLICIES),
    default="warn",
    show_default=True,
    help="What a provider fallback does: strict exits 1, warn logs, allow records only.",
)
LEVEL_OPTION = click.option(
    "--level",
    type=click.Choice(LEVEL_NAMES),
    default="all",
    show_default=True,
    help="ORT graph optimization level.",
)
PROVIDER_HELP = "Execution provider, in priority order (repeatable): cpu cuda tensorrt openvino coreml dml webgpu qnn, or 'cuda:device_id=1'."
METRIC_HELP = (
    "How outputs are compared: METRIC for every output, or OUTPUT=METRIC for one (repeatable). Metrics: "
    f"{', '.join(METRIC_DESCRIPTIONS)}. Default: chosen per output on evidence, printed beside it."
)
INPUT_HELP = "NAME=FILE.npy, or one FILE.npz with every input."
SHAPE_HELP = "Fix a dynamic shape: NAME=1x3x224x224 for an input, or DIM=64 for a symbolic dim (repeatable)."


def json_option(help: str = "Print one JSON document on stdout.") -> Callable[[F], F]:
    """``--json``: stdout holds exactly one JSON document; ``help`` where a command says what it holds."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def isolate_option(help: str = ISOLATE_HELP) -> Callable[[F], F]:
    """``--isolate``: sessions built in a child process first (``preflight_isolated``)."""
    return click.option("--isolate", is_flag=True, help=help)


JSON_OPTION = json_option()
ISOLATE_OPTION = isolate_option()
SHAPE_OPTION = click.option("--shape", "shapes", multiple=True, help=SHAPE_HELP)
