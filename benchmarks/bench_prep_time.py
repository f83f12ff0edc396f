"""How long does tune spend preparing a candidate? The basis of ``tuning.budget.PrepEstimate``.

For each model, in a fresh model cache: the tune's own worker child prepares ORT's default session and each
INT8 step the search builds (the quantizer's preparation, the quantization, the session created strictly,
the outputs on 4 held-out samples: exactly what one ``prepare`` step of a tune costs), calibrated static
steps on 8 calibration samples as a tune without data has (``--calibration N``: as many as a user's file
gives, at most 256; ``--heldout N``: the gate's samples, at most 64). Prints each step's seconds beside the model's
size in MB and ORT's default session's preparation and latency, the figures the estimate is written in.

    .venv-test/bin/python benchmarks/bench_prep_time.py [--only encoder,magika,ocr-det,nudenet]
        [--calibration 8] [--heldout 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time
from pathlib import Path

import onnx

from ortpilot.graph.feeds import generate_samples, plan_feeds
from ortpilot.providers.cpuisa import this_cpu
from ortpilot.tuning.candidate import baseline_candidate
from ortpilot.tuning.space import DYN_PC, DYN_W_PC, FULL_PC, QDQ_PC
from ortpilot.tuning.worker import WorkerClient, save_samples


def models() -> dict[str, tuple[Path | None, dict[str, tuple[int, ...]]]]:
    from _prep import package_file

    from ortpilot.models import demo_model_path

    return {
        "encoder": (demo_model_path("encoder"), {}),
        "magika": (package_file("magika", "models/standard_v3_3/model.onnx"), {"unk__214": (1,)}),
        "ocr-det": (package_file("rapidocr", "models/PP-OCRv6_det_small.onnx"), {"x": (1, 3, 480, 480)}),
        "nudenet": (package_file("nudenet", "320n.onnx"), {"images": (1, 3, 320, 320)}),
    }


def measure(name: str, path: Path, shapes: dict[str, tuple[int, ...]], calibration: int, heldout: int) -> dict:
    proto = onnx.load(path)
    plan = plan_feeds(proto, shapes)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ORTPILOT_CACHE_DIR"] = str(Path(tmp) / "cache")  # nothing built before
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        save_samples(scratch / "heldout.npz", generate_samples(proto, heldout, plan=plan))
        save_samples(scratch / "calibration.npz", generate_samples(proto, calibration, plan=plan, first_seed=100))
        (scratch / "worker.json").write_text(
            json.dumps({"model": str(path), "shapes": {k: list(v) for k, v in plan.shapes.items()}})
        )
        worker = WorkerClient(scratch)
        row = {
            "model": name,
            "mb": round(path.stat().st_size / 2**20, 2),
            "calibration": calibration,
            "heldout": heldout,
            "steps": {},
        }
        try:
            for label, cand in [("ORT default", baseline_candidate())] + [
                (step.label(), baseline_candidate().derived(passes=(step,)))
                for step in (DYN_W_PC, DYN_PC, QDQ_PC, FULL_PC)
            ]:
                start = time.monotonic()
                result = worker.request("prepare", cand.to_dict(), 900)
                seconds = time.monotonic() - start
                row["steps"][label] = {
                    "s": round(seconds, 2),
                    "status": result.get("status"),
                    "build_s": round(result.get("build_s") or 0.0, 2),
                    "session_s": round(result.get("session_s") or 0.0, 2),
                }
                if cand.baseline:
                    bench = worker.request("bench", {"candidates": [cand.to_dict()], "runs": 10, "warmup": 2}, 300)
                    samples = sorted(bench["samples_s"][cand.id])
                    row["latency_ms"] = round(samples[len(samples) // 2] * 1e3, 2)
        finally:
            worker.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--calibration", type=int, default=8)
    parser.add_argument("--heldout", type=int, default=4)
    args = parser.parse_args()
    only = {s for s in args.only.split(",") if s}
    print(
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {this_cpu().model}, {os.cpu_count()} CPUs"
    )
    for name, (path, shapes) in models().items():
        if only and name not in only:
            continue
        if path is None:
            print(f"{name}: its package is not installed (benchmarks/README.md, step 1); skipped", flush=True)
            continue
        print(json.dumps(measure(name, Path(path), shapes, args.calibration, args.heldout)), flush=True)


if __name__ == "__main__":
    main()
