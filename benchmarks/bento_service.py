"""The BentoML service bench_serve.py compares ``ortpilot serve`` with: the same profile's model and
session settings in a plain ORT session, adaptive batching on (runs in ``.venv-bento``).

BentoML's batchable APIs take one batched argument, so the three token inputs arrive stacked as
``tokens[3, batch, sequence]`` (batched along axis 1); the reply is the one requested output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import bentoml
import numpy as np
import onnxruntime as ort

PROFILE = Path(os.environ["BENCH_PROFILE"])
OUTPUT = os.environ["BENCH_OUTPUT"]
MAX_BATCH = int(os.environ.get("BENCH_MAX_BATCH", "8"))
LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def profile_session() -> ort.InferenceSession:
    """What the profile says, in plain ORT: model file, level, threads, mode, arena, config entries."""
    doc = json.loads(PROFILE.read_text())
    s = doc["session_settings"]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = LEVELS.get(s["level"], ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    opts.intra_op_num_threads = int(s["intra_op_threads"])
    opts.inter_op_num_threads = int(s["inter_op_threads"])
    opts.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if s["execution_mode"] == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    opts.enable_cpu_mem_arena = bool(s["enable_cpu_mem_arena"])
    opts.enable_mem_pattern = bool(s["enable_mem_pattern"])
    for key, value in (s.get("config_entries") or {}).items():
        opts.add_session_config_entry(key, str(value))
    return ort.InferenceSession(str(PROFILE.parent / doc["model"]["file"]), opts, providers=["CPUExecutionProvider"])


@bentoml.service(workers=1, traffic={"max_concurrency": 256})
class Encoder:
    def __init__(self) -> None:
        self.session = profile_session()

    @bentoml.api(batchable=True, batch_dim=(1, 0), max_batch_size=MAX_BATCH, max_latency_ms=10000)
    def infer(self, tokens: np.ndarray) -> np.ndarray:
        feeds = {name: np.ascontiguousarray(tokens[i]).astype(np.int64) for i, name in enumerate(INPUTS)}
        return self.session.run([OUTPUT], feeds)[0]
