"""In the OpenVINO environment: does ``ortpilot tune`` pick OpenVINO where it wins and not where it loses?

Run with the ``onnxruntime-openvino`` build (``.ci/openvino.sh`` makes ``.venv-openvino``). For
each corpus model: ``ortpilot tune`` (its search space holds every provider that verifies, so
OpenVINO's plain-model candidate competes with the CPU variants), then ORT's default CPU
session, OpenVINO on the source model (``device_type=CPU``, strict placement) and the tuned
profile are measured interleaved in one process (``measure.bench_interleaved``). A model that
OpenVINO cannot compile is reported with ORT's reason, and the tune must still finish on CPU.

    .venv-openvino/bin/python benchmarks/bench_openvino.py [--budget 120] [--duration 20] [--only nudenet]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import bench_tune
import onnxruntime as ort
from _prep import tune_bench_parser
from bench_tune import (
    CORPUS,
    available,
    block_for,
    configs_for,
    header,
    measure,
    record,
    save_rows,
    timing_cell,
    timing_feeds,
    tune_model,
)

from ortpilot.errors import OrtpilotError
from ortpilot.measure.interleave import BenchConfig
from ortpilot.session import load

OPENVINO = "OpenVINOExecutionProvider"
# Two tiny demo models besides the corpus: at a few microseconds per call, OpenVINO's own cost per
# call may outweigh what its kernels save, which is where the tuner must not pick it.
DEMOS = {"demo-mlp": ("demo:mlp", ["batch=1"]), "demo-cnn": ("demo:cnn", ["batch=1"])}


def openvino_config(source: str, feeds: dict[str, Any]) -> tuple[BenchConfig | None, str]:
    """OpenVINO on the source model, verified strict; None and ORT's reason when it does not verify."""
    try:
        session = load(source, providers=[OPENVINO], policy="strict")
    except OrtpilotError as exc:
        return None, str(exc).split("\n")[0][:200]
    return BenchConfig("OpenVINO", model=session, feeds=feeds), "verified strict"


def chosen_provider(profile: dict[str, Any]) -> str:
    return profile["providers"][0]["name"].removesuffix("ExecutionProvider")


def main() -> None:
    args = tune_bench_parser(__doc__.splitlines()[0]).parse_args()
    if OPENVINO not in ort.get_available_providers():
        sys.exit(f"this ORT build has no {OPENVINO}: run it in .venv-openvino (.ci/openvino.sh makes it)")
    bench_tune.CORPUS.update(DEMOS)
    names = [n for n in CORPUS if (not args.only or n in args.only.split(",")) and available(n)]
    out_root = Path(args.out or tempfile.mkdtemp(prefix="bench-openvino-"))
    head = header(args) + f"; onnxruntime-openvino {ort.__version__}"
    rows = []
    for name in names:
        tuned = tune_model(name, args.budget, out_root)
        feeds = timing_feeds(tuned["profile"])
        ov, ov_note = openvino_config(tuned["profile"]["source_model"]["path"], feeds)
        timing = measure(configs_for(tuned, feeds, [ov] if ov else []), args.duration, block_for(tuned, args.turn))
        row = {
            "model": name,
            "config": tuned["config"],
            "provider": chosen_provider(tuned["profile"]),
            "openvino": ov_note,
            "tune_wall_s": tuned["wall_s"],
            "candidates": tuned["candidates"],
            "timing": timing,
        }
        record(rows, row)
    save_rows(args.json, head, rows)
    print(head + "\n")
    print(
        "| model | ORT default (CPU) p50 ms | OpenVINO p50 ms (vs default, 95% CI) | ortpilot p50 ms (vs default) "
        "| ortpilot chose | provider | tune wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        t = r["timing"]["rows"]
        ov = t.get("OpenVINO")
        ov_cell = timing_cell(ov) if ov else f"fails: {r['openvino']}"
        print(
            f"| {r['model']} | {t['ORT default']['p50_ms']:.3f} | {ov_cell} | {timing_cell(t['ortpilot'])} | "
            f"{r['config']} | {r['provider']} | {r['tune_wall_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
