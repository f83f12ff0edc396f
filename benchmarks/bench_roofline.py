"""Roofline of the demo encoder and one real model: achieved GFLOP/s over this machine's peak.

The peak is a large float32 matmul through ORT and numpy (``measure.roofline``), cached per
machine; ``--refresh-peak`` measures it again (do that on a quiet machine). Model FLOPs come
from ``graph.flops`` at the benchmarked input shapes; achieved GFLOP/s = FLOPs / median latency.

    .venv/bin/python benchmarks/bench_roofline.py [--runs 300] [--refresh-peak] [--json]

The real model is NudeNet 320n (YOLOv8n, images 1x3x320x320), from the ``nudenet`` package
installed with --no-deps; it is skipped with a message when missing.
"""

from __future__ import annotations

import argparse
import json

from _prep import package_file

from ortpilot.measure.bench import bench
from ortpilot.measure.roofline import peak
from ortpilot.models import demo_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--refresh-peak", action="store_true", help="Measure the machine's peak again.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    machine = peak(refresh=args.refresh_peak)
    models: list[tuple[str, str, dict]] = [("demo encoder", str(demo_model_path("encoder")), {})]
    nude = package_file("nudenet", "320n.onnx")
    if nude is None:
        print("nudenet is not installed (pip install --no-deps nudenet): real model skipped")
    else:
        models.append(("nudenet 320n", str(nude), {"images": (1, 3, 320, 320)}))
    rows = []
    for label, path, shapes in models:
        result = bench(path, shapes=shapes, runs=args.runs, roofline=True, name=label)
        roof = result.roofline or {}
        rows.append(
            {
                "model": label,
                "shapes": result.shapes,
                "p50_ms": result.stats.p50 * 1e3,
                "median_ci95_ms": [v * 1e3 for v in result.stats.median_ci],
                "noisy": result.stats.noisy,
                "model_gflop": roof.get("model_gflop"),
                "achieved_gflops": roof.get("achieved_gflops"),
                "peak_gflops": roof.get("peak_gflops"),
                "fraction": roof.get("fraction"),
                "reading": roof.get("reading"),
            }
        )
    doc = {"peak": machine.to_dict(), "models": rows}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(
        f"peak {machine.gflops:.1f} GFLOP/s (ORT {machine.ort_gflops:.1f}, numpy {machine.numpy_gflops:.1f}; "
        f"{machine.n}x{machine.n} float32 matmul, {machine.cpus} cores, ORT {machine.onnxruntime}, "
        f"{'cached' if machine.cached else 'measured now'} {machine.measured_at})"
    )
    for r in rows:
        print(
            f"  {r['model']:14s} {r['model_gflop']:.3f} GFLOP  p50 {r['p50_ms']:.3f} ms "
            f"(CI {r['median_ci95_ms'][0]:.3f}-{r['median_ci95_ms'][1]:.3f})  {r['achieved_gflops']:.1f} GFLOP/s "
            f"= {r['fraction']:.1%} of peak{'  [noisy]' if r['noisy'] else ''}"
        )


if __name__ == "__main__":
    main()
