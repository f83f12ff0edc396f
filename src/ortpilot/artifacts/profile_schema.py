"""What a ``profile.json`` may hold: the fields ortpilot writes, each checked by type and range.

A profile is read by deployment code, often copied from elsewhere, so it is an input, not
trusted state. :func:`check_profile` accepts only the fields :func:`write_profile` and ``tune``
write and raises ``UsageError`` (exit 2) naming the first field that is missing, unknown or of
the wrong type. :func:`file_settings` lists what would make ORT write or load a file (an
optimized-model path, a provider option naming a path or a library, a session config entry
outside :data:`SAFE_CONFIG_ENTRIES`): ``load_profile`` refuses those unless its caller accepts
them by name. The ``machine`` section is checked where the machine is compared.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ortpilot.artifacts.fields import Bad as _Bad
from ortpilot.artifacts.fields import Check
from ortpilot.artifacts.fields import boolean as _bool
from ortpilot.artifacts.fields import dict_of as _dict_of
from ortpilot.artifacts.fields import fields as _fields
from ortpilot.artifacts.fields import integer as _int
from ortpilot.artifacts.fields import json_value as _json_value
from ortpilot.artifacts.fields import kind as _kind
from ortpilot.artifacts.fields import list_of as _list_of
from ortpilot.artifacts.fields import number as _number
from ortpilot.artifacts.fields import optional as _optional
from ortpilot.artifacts.fields import sha256 as _sha256
from ortpilot.artifacts.fields import string as _string
from ortpilot.errors import UsageError

MAX_PROFILE_BYTES = 16 * 2**20  # an ortpilot profile is a few KB; a bigger file is not one
MAX_THREADS = 4096
MAX_DIM = 2**31 - 1
# Session config entries ortpilot writes or that only steer threads and numerics. Anything else
# may name a file ORT writes or loads (ep.context_file_path, session.optimized_model_external_
# initializers_file_name, session.load_model_format, ...) and is refused in a profile.
SAFE_CONFIG_ENTRIES = frozenset(
    {
        "session.intra_op.allow_spinning",
        "session.inter_op.allow_spinning",
        "session.disable_cpu_ep_fallback",
        "session.record_ep_graph_assignment_info",
        "session.set_denormal_as_zero",
        "session.disable_prepacking",
        "session.dynamic_block_base",
        "session.use_env_allocators",
        "session.disable_quant_qdq",
        "session.enable_quant_qdq_cleanup",
        "session.qdq_matmulnbits_accuracy_level",
    }
)
# Provider options whose value is a path: where an EP writes caches or loads libraries from (OpenVINO's
# load_config holds its properties, CACHE_DIR among them).
_PATH_OPTION = re.compile(r"(path|dir|file|folder|librar|cache_location|load_config)", re.I)


def check_profile(doc: Any, where: str) -> None:
    """Raise ``UsageError`` naming the first field of ``doc`` that ortpilot would not have written."""
    if not isinstance(doc, dict):
        raise UsageError(f"'{where}' is not an ortpilot profile: it holds a JSON {_kind(doc)}, not an object.")
    try:
        _TOP_LEVEL(doc, "")
    except _Bad as bad:
        raise UsageError(
            f"Profile '{where}' has an invalid field '{bad.field}': {bad.problem}. ortpilot reads only "
            "what its own 'tune' writes; regenerate the profile with 'ortpilot tune' instead of editing "
            "it."
        ) from None


def file_settings(doc: Mapping[str, Any]) -> list[str]:
    """Fields of a checked profile that make ORT write or load files, named as ``check_profile`` names fields.

    A provider option naming a folder inside ortpilot's own cache (the TensorRT and OpenVINO cache
    folders ortpilot's provider defaults choose) is not listed; a library path always is.
    """
    found = []
    settings = doc.get("session_settings") or {}
    if settings.get("optimized_model_filepath"):
        found.append("session_settings.optimized_model_filepath")
    found += [
        f"session_settings.config_entries.{key}"
        for key in (settings.get("config_entries") or {})
        if key not in SAFE_CONFIG_ENTRIES
    ]
    for i, spec in enumerate(doc.get("providers") or []):
        for key, value in (spec.get("options") or {}).items():
            if _PATH_OPTION.search(key) and ("librar" in key.lower() or not _in_own_cache(str(value))):
                found.append(f"providers[{i}].options.{key}")
    return found


def model_outside_folder(doc: Mapping[str, Any], profile_path: str | os.PathLike) -> Path | None:
    """The profile's model file when it resolves outside the profile's folder (absolute, ``..``, a link out)."""
    folder = Path(os.path.realpath(Path(profile_path).parent))
    file = Path(doc["model"]["file"])
    target = Path(os.path.realpath(folder / file))
    return None if target.is_relative_to(folder) and not file.is_absolute() else target


def _in_own_cache(value: str) -> bool:
    from ortpilot.artifacts.cache import cache_root

    try:
        return Path(os.path.realpath(value)).is_relative_to(os.path.realpath(cache_root()))
    except (OSError, ValueError):
        return False


# --------------------------------------------------------------------------- field checks


def _model_file(value: Any, name: str) -> None:
    _string(value, name, nonempty=True)


def _file_name(value: Any, name: str) -> None:
    """A file beside the profile: a plain name, no folder part (``verify`` reads it, nothing else)."""
    _string(value, name, nonempty=True, limit=255)
    if "/" in value or "\\" in value or value in (".", "..") or "\0" in value:
        raise _Bad(name, f"must be a file name beside the profile, got {value!r}")


def _option_value(value: Any, name: str) -> None:
    if isinstance(value, float):
        _number(value, name)
    elif not isinstance(value, (str, int, bool)):
        raise _Bad(name, f"expected a string, number or boolean, got a {_kind(value)}")
    elif isinstance(value, str):
        _string(value, name)


def _level(value: Any, name: str) -> None:
    _string(value, name, nonempty=True, limit=64)  # which names exist is SessionSettings' to say


def _execution_mode(value: Any, name: str) -> None:
    _string(value, name)
    if value not in ("sequential", "parallel"):
        raise _Bad(name, f"'{value}' is neither sequential nor parallel")


def _threads(value: Any, name: str) -> None:
    _int(value, name, 0, MAX_THREADS)


def _dim(value: Any, name: str) -> None:
    _int(value, name, 0, MAX_DIM)


def _placement(value: Any, name: str) -> None:
    if value is not None:
        _dict_of(lambda v, n: _int(v, n, 0, 2**40))(value, name)


def _machine(value: Any, name: str) -> None:
    if not isinstance(value, dict):  # its contents are checked against this machine by the profile loader
        raise _Bad(name, f"expected an object, got a {_kind(value)}")
    _json_value(value, name)


_SETTINGS: dict[str, Check] = {
    "level": _level,
    "intra_op_threads": _threads,
    "inter_op_threads": _threads,
    "execution_mode": _execution_mode,
    "enable_cpu_mem_arena": _bool,
    "enable_mem_pattern": _bool,
    "free_dimension_overrides": _dict_of(_dim),
    "config_entries": _dict_of(lambda v, n: _string(v, n)),
    "optimized_model_filepath": lambda v, n: _string(v, n),
    "log_severity": lambda v, n: _int(v, n, 0, 4),
}
_PROVIDER = _fields(
    {
        "name": lambda v, n: _string(v, n, nonempty=True, limit=256),
        "short": _string,
        "options": _dict_of(_option_value),
    },
    required=("name",),
)


def _data_source(value: Any, name: str) -> None:
    if value not in ("text", "images", "files", "synthetic"):
        raise _Bad(name, f"{value!r} is not one of text, images, files, synthetic")


# Where the gate's held-out samples and the calibration samples came from (data.DataSource.describe).
_DATA = _fields(
    {
        "source": _data_source,
        "samples": lambda v, n: _int(v, n, 0, 2**40),
        "total": lambda v, n: _int(v, n, 0, 2**40),
        "path": _optional(_string),
        "sha256": _optional(_sha256),
        "reading": _optional(_string),
    },
    required=("source", "samples"),
)
_TOP: dict[str, Check] = {
    "format": lambda v, n: _string(v, n),
    "version": lambda v, n: _int(v, n, 1, 2**31),
    "model": _fields({"file": _model_file, "sha256": _sha256}, required=("file", "sha256")),
    "onnxruntime": _fields(
        {
            "version": lambda v, n: _string(v, n, limit=256),
            "distribution": _string,
            "available_providers": _list_of(lambda v, n: _string(v, n, limit=256)),
        }
    ),
    "providers": _list_of(_PROVIDER, nonempty=True, limit=64),
    "session_settings": _fields(_SETTINGS),
    "iobinding": _bool,
    "passes": _list_of(_json_value),
    "accuracy": _json_value,
    "latency": _json_value,
    "machine": _machine,
    # The class a fleet tune files the machine under (providers.machineclass checks its key and id).
    "machine_class": _fields(
        {"name": lambda v, n: _string(v, n, nonempty=True, limit=256), "id": _string, "key": _json_value},
        required=("name", "id", "key"),
    ),
    "ortpilot_version": lambda v, n: _string(v, n, limit=256),
    "candidate": _json_value,
    "reference_outputs": _fields(
        {
            "heldout_seed": lambda v, n: _int(v, n, 0, 2**63 - 1),
            "inputs_sha256": _string,
            "sha256": _dict_of(lambda v, n: _string(v, n)),
            "file": _file_name,
        }
    ),
    "source_model": _fields({"path": _string, "sha256": _string}),
    "shapes": _dict_of(_list_of(_dim, limit=64)),
    # --outputs: the outputs the deployment reads; the model is pruned to them (load_profile checks it has them).
    "outputs": _list_of(lambda v, n: _string(v, n, nonempty=True, limit=4096), nonempty=True, limit=4096),
    # What the tune timed (data.workload.Workload.to_dict), and the replay set verify --bench times (``file``).
    "workload": _fields(
        {
            "source": lambda v, n: _string(v, n, limit=256),
            "requests": lambda v, n: _int(v, n, 0, 2**40),
            "dims": _list_of(_json_value, limit=64),
            "batches": _list_of(lambda v, n: _int(v, n, 1, MAX_DIM), limit=64),
            "replay": lambda v, n: _int(v, n, 1, 4096),
            "sha256": _string,
            "shapes": _dict_of(_list_of(_dim, limit=64)),
            "summary": _string,
            "file": _file_name,
            "file_sha256": _sha256,
        },
        required=("source", "requests"),
    ),
    # The winner's first-run cost at a new size, and the sizes load_profile warms (session.warmup.WarmupPlan).
    "warmup": _fields(
        {
            "dim": lambda v, n: _string(v, n, nonempty=True, limit=256),
            "axes": _list_of(_json_value, nonempty=True, limit=64),
            "sizes": _list_of(lambda v, n: _int(v, n, 1, MAX_DIM), nonempty=True, limit=4096),
            "first_run_ms": _number,
            "run_ms": _number,
            "warm": _bool,
            "batches": _list_of(lambda v, n: _int(v, n, 1, MAX_DIM), nonempty=True, limit=64),
        },
        required=("dim", "axes", "sizes"),
    ),
    # A session per bucket of one dim (session.shapeplan.ShapePlan.to_dict); load_profile builds them.
    "shape_plan": _fields(
        {
            "dim": lambda v, n: _string(v, n, nonempty=True, limit=256),
            "sizes": _list_of(lambda v, n: _int(v, n, 1, MAX_DIM), nonempty=True, limit=16),
            "axes": _list_of(_json_value, nonempty=True, limit=64),
            "pad_values": _dict_of(_number),
            "beyond": lambda v, n: _string(v, n, limit=16),
        },
        required=("dim", "sizes", "axes"),
    ),
    "placement": _placement,
    "default_best": _bool,
    "default_best_reason": lambda v, n: _string(v, n, limit=65536),
    "gate_data": _DATA,
    "calibration_data": _DATA,
    # The ORT-optimized winner serving replicas load with optimizations off (tune.optimized).
    "optimized_model": _fields(
        {"file": _file_name, "sha256": _sha256, "level": _level, "placement": _placement}, required=("file", "sha256")
    ),
    # OpenVINO's compiled winner (EP context), loaded only where plugin, OpenVINO and device match (tune.compiled).
    "compiled_model": _fields(
        {
            "file": _file_name,
            "sha256": _sha256,
            "blobs": _list_of(_fields({"file": _file_name, "sha256": _sha256}, required=("file", "sha256")), limit=16),
            "ep": _string,
            "plugin": _string,
            "openvino": _string,
            "device": _string,
            "compile_s": _number,
            "placement": _placement,
        },
        required=("file", "sha256", "ep"),
    ),
    # A text-model folder's task (data.texttask.TextTask.from_dict checks its fields) and its tokenizer beside it.
    "text": _fields(
        {
            "task": _json_value,
            "tokenizer": _fields({"file": _file_name, "sha256": _sha256}, required=("file", "sha256")),
        },
        required=("task", "tokenizer"),
    ),
}
_TOP_LEVEL = _fields(_TOP, required=("format", "model", "onnxruntime", "providers", "session_settings"))
