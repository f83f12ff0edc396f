"""Session settings as a plain, serializable record, and their mapping onto ORT's SessionOptions.

One record type serves ``load``, ``bench`` flags, tune candidates and profile files, so a
profile recreates exactly the session that was measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import onnxruntime as ort

from ortpilot.artifacts.profile_schema import MAX_DIM, MAX_THREADS
from ortpilot.errors import UsageError

LEVELS: dict[str, ort.GraphOptimizationLevel] = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
# "layout" (ORT_ENABLE_LAYOUT, between extended and all) exists only in newer ORT builds.
if hasattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT"):
    LEVELS["layout"] = ort.GraphOptimizationLevel.ORT_ENABLE_LAYOUT
LEVEL_NAMES = ("disable", "basic", "extended", "layout", "all")


def check_level(level: str) -> None:
    """Refuse an optimization level ORT does not have (the session settings and the optimize pass both ask)."""
    if level not in LEVEL_NAMES:
        raise UsageError(f"Unknown optimization level '{level}'. Choose one of {', '.join(LEVEL_NAMES)}.")


@dataclass
class SessionSettings:
    """Everything about a session except the model and providers."""

    level: str = "all"
    intra_op_threads: int = 0  # 0 = ORT's default (one per physical core)
    inter_op_threads: int = 0
    execution_mode: str = "sequential"  # or "parallel"
    enable_cpu_mem_arena: bool = True
    enable_mem_pattern: bool = True
    free_dimension_overrides: dict[str, int] = field(default_factory=dict)
    config_entries: dict[str, str] = field(default_factory=dict)
    optimized_model_filepath: str = ""
    log_severity: int = 2  # 0 verbose .. 4 fatal; 2 = warnings, enough to see fallbacks

    def __post_init__(self) -> None:
        check_level(self.level)
        if self.execution_mode not in ("sequential", "parallel"):
            raise UsageError(f"Unknown execution mode '{self.execution_mode}': use sequential or parallel.")
        for dim, value in self.free_dimension_overrides.items():  # a 0 or negative fixed dim gives an unusable model
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIM:
                raise UsageError(f"The free dim '{dim}' must be fixed at 1 to {MAX_DIM}, got {value!r}.")
        for name in ("intra_op_threads", "inter_op_threads"):
            if not 0 <= getattr(self, name) <= MAX_THREADS:  # 100,000 threads ran a machine out of memory
                raise UsageError(f"{name} must be from 0 (ORT's default) to {MAX_THREADS}, got {getattr(self, name)}.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_explicit_threads(self, default_intra: int) -> SessionSettings:
        """These settings with every 0 ("ORT's default") thread count replaced by what it means:
        ``default_intra`` intra-op threads (counted where the session was measured), and one
        inter-op thread in sequential mode, where ORT runs no inter-op pool."""
        data = self.to_dict()
        if self.intra_op_threads == 0:
            data["intra_op_threads"] = max(1, int(default_intra))
        if self.inter_op_threads == 0 and self.execution_mode == "sequential":
            data["inter_op_threads"] = 1
        return SessionSettings.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionSettings:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise UsageError(f"Unknown session setting(s) {sorted(unknown)}; known: {sorted(known)}.")
        return cls(**data)

    def build(self) -> ort.SessionOptions:
        opts = ort.SessionOptions()
        level = LEVELS.get(self.level)
        if level is None:
            raise UsageError(
                f"Optimization level '{self.level}' is not supported by ORT {ort.__version__}; "
                f"it supports {', '.join(LEVELS)}."
            )
        opts.graph_optimization_level = level
        opts.intra_op_num_threads = self.intra_op_threads
        opts.inter_op_num_threads = self.inter_op_threads
        opts.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL if self.execution_mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
        )
        opts.enable_cpu_mem_arena = self.enable_cpu_mem_arena
        opts.enable_mem_pattern = self.enable_mem_pattern
        opts.log_severity_level = self.log_severity
        for dim, value in self.free_dimension_overrides.items():
            opts.add_free_dimension_override_by_name(dim, int(value))
        for key, value in self.config_entries.items():
            opts.add_session_config_entry(key, str(value))
        if self.optimized_model_filepath:
            opts.optimized_model_filepath = self.optimized_model_filepath
        return opts
