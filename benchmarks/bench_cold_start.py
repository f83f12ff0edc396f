"""Session creation with and without the ORT-optimized model tune keeps for serving replicas.

For each model: ORT's default CPU session at level ``all`` (what a replica does without the
file: ORT optimizes the graph at every creation) against the optimized graph that
``tune.optimized.write_optimized_model`` writes (stamped, checked bit for bit on one sample),
loaded with optimizations off. Creations are interleaved, ``--runs`` of each; medians of ORT's
own ``InferenceSession`` time (``VerifiedSession.create_s``) and of the whole verified load.

    .venv-test/bin/python benchmarks/bench_cold_start.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _prep import package_file

from ortpilot.graph.feeds import make_feeds
from ortpilot.models import demo_model_path
from ortpilot.session import SessionSettings, load
from ortpilot.tuning.optimized import loading_settings, write_optimized_model

ROOT = Path(__file__).resolve().parent


def models() -> dict[str, Path]:
    found = {
        "minilm": (ROOT / "models" / "minilm" / "model.onnx", {}),
        "nudenet-320n (CNN)": (package_file("nudenet", "320n.onnx"), {"images": (1, 3, 320, 320)}),
        "demo cnn": (Path(demo_model_path("cnn")), {}),
    }
    return {name: entry for name, entry in found.items() if entry[0] and Path(entry[0]).is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    threads = min(2, os.cpu_count() or 1)
    settings = SessionSettings(level="all", intra_op_threads=threads, inter_op_threads=1)
    print(f"load average {os.getloadavg()[0]:.2f}; {threads} intra-op threads; {args.runs} interleaved runs each")
    print(
        "| model | plain, level all: create ms | optimized, level disable: create ms | ratio | "
        "plain load ms | optimized load ms |"
    )
    print("|---|---|---|---|---|---|")
    for name, (source, shapes) in models().items():
        with tempfile.TemporaryDirectory() as tmp:
            model = Path(tmp) / "model.onnx"
            shutil.copyfile(source, model)
            plain = load(str(model), ["cpu"], "strict", settings=settings)
            feeds = make_feeds(plain.model, shapes, seed=0)
            expected = dict(zip([o.name for o in plain.get_outputs()], plain.run(None, feeds)))
            entry = write_optimized_model(
                Path(tmp), model, [{"name": "CPUExecutionProvider"}], settings, feeds, expected
            )
            if entry is None:
                print(f"| {name} | no optimized model kept (outputs differ or ORT cannot save it) | | | | |")
                continue
            optimized = Path(tmp) / entry["file"]
            times: dict[str, list[float]] = {"plain": [], "optimized": [], "plain_load": [], "optimized_load": []}
            for _ in range(args.runs):
                for kind, path, opts in (
                    ("plain", model, settings),
                    ("optimized", optimized, loading_settings(settings)),
                ):
                    started = time.perf_counter()
                    sess = load(str(path), ["cpu"], "strict", settings=opts)
                    times[f"{kind}_load"].append(time.perf_counter() - started)
                    times[kind].append(sess.create_s)
                    del sess
            med = {k: statistics.median(v) * 1000 for k, v in times.items()}
            print(
                f"| {name} | {med['plain']:.1f} | {med['optimized']:.1f} | {med['plain'] / med['optimized']:.2f}x | "
                f"{med['plain_load']:.1f} | {med['optimized_load']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
