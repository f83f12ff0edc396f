"""Does the real-data gate matter? ``ortpilot tune`` gated on synthetic inputs vs on real text/images.

For each model: tune twice with the same budget, once with no data (calibration and gate on
generated inputs, the default) and once with ``--calibration-text`` / ``--calibration-images``
(tune splits them into calibration and held-out gate samples). Both winners are then checked on an
evaluation set that neither tune saw (the last third of ``benchmarks/data/sentences.txt``; images of
scikit-image's bundled samples not used for tuning), with the metric the gate chooses for each output
(evidence-based, under the attention mask where there is one), against the float model on ORT's
default session, and held to tune's default limit. Finally ORT's default, the synthetic-gated winner
and the real-gated winner run interleaved in one process, on one evaluation sample.

Models: MiniLM (``benchmarks/prep_minilm.py``; its folder, tokenizer and pooling config), NudeNet 320n
and PP-OCRv6 det small (their wheels), images from ``pip install scikit-image`` (skimage/data, 26
pictures; four views of each: whole, centre crop, two halves).

    .venv-test/bin/python benchmarks/bench_real_gate.py [--budget 120] [--duration 20] [--turn 0.5]
        [--only minilm,nudenet,ocr-det] [--json OUT.json]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _prep import PrepError, package_dir, package_file, tune_bench_parser, write_json
from bench_tune import MINILM_DIR, ROOT, accuracy, block_for, header, measure

import ortpilot
from ortpilot.data import real_data
from ortpilot.gate.outputs import DEFAULT_MAX_ERROR
from ortpilot.graph.shapes import graph_inputs, parse_shape_args
from ortpilot.measure.interleave import BenchConfig
from ortpilot.modelio import load_model
from ortpilot.session import load

SENTENCES = ROOT / "benchmarks/data/sentences.txt"
TUNE_IMAGES = 18  # of skimage's 26 sorted pictures: the first 18 tune, the other 8 evaluate


def _model(package: str, relative: str) -> str:
    path = package_file(package, relative)
    return str(path) if path else ""


MODELS: dict[str, dict[str, Any]] = {
    "minilm": {"model": str(MINILM_DIR), "shapes": ["batch=1", "sequence=128"], "kind": "text"},
    "nudenet": {
        "model": _model("nudenet", "320n.onnx"),
        "shapes": ["images=1x3x320x320"],
        "kind": "images",
        "image": {"image_size": "320x320"},
    },
    "ocr-det": {
        "model": _model("rapidocr", "models/PP-OCRv6_det_small.onnx"),
        "shapes": ["x=1x3x640x640"],
        "kind": "images",
        "image": {"image_size": "640x640", "mean": "0.485,0.456,0.406", "std": "0.229,0.224,0.225"},
    },
}


def write_text_sets(root: Path) -> tuple[Path, Path]:
    """(tune file, evaluation file): the first two thirds of the sentences and the last third."""
    lines = [line for line in SENTENCES.read_text(encoding="utf-8").splitlines() if line.strip()]
    cut = len(lines) * 2 // 3
    tune, evaluate = root / "tune.txt", root / "eval.txt"
    tune.write_text("\n".join(lines[:cut]) + "\n", encoding="utf-8")
    evaluate.write_text("\n".join(lines[cut:]) + "\n", encoding="utf-8")
    return tune, evaluate


def write_image_sets(root: Path) -> tuple[Path, Path]:
    """(tune folder, evaluation folder) of RGB PNGs: four views of each scikit-image sample picture."""
    from PIL import Image

    data = package_dir("skimage", "scikit-image") / "data"
    pictures = sorted(p for p in data.iterdir() if p.suffix in (".png", ".jpg"))
    if len(pictures) <= TUNE_IMAGES:
        raise PrepError(f"scikit-image ships {len(pictures)} sample pictures here; this benchmark needs more")
    folders = root / "tune-images", root / "eval-images"
    for folder in folders:
        folder.mkdir()
    for i, picture in enumerate(pictures):
        image = Image.open(picture).convert("RGB")
        w, h = image.size
        views = {
            "whole": image,
            "centre": image.crop((w // 6, h // 6, w - w // 6, h - h // 6)),
            "left": image.crop((0, 0, w // 2, h)),
            "right": image.crop((w // 2, 0, w, h)),
        }
        folder = folders[0] if i < TUNE_IMAGES else folders[1]
        for view, im in views.items():
            im.save(folder / f"{picture.stem}-{view}.png")
    return folders


def data_specs(name: str, spec: dict[str, Any], sets: dict[str, tuple[Path, Path]]) -> tuple[Any, Any]:
    """(tune data, evaluation data) as ``ortpilot.data.real_data`` specs."""
    folder = spec["model"] if Path(spec["model"]).is_dir() else None
    tune_set, eval_set = sets[spec["kind"]]
    key = "text" if spec["kind"] == "text" else "images"
    extra = spec.get("image", {})
    return (
        real_data(**{key: tune_set}, folder=folder, **extra),
        real_data(**{key: eval_set}, folder=folder, **extra),
    )


def tune_once(spec: dict[str, Any], out: Path, budget: float, calibration: Any) -> dict[str, Any]:
    start = time.monotonic()
    result = ortpilot.tune(
        spec["model"], out_dir=str(out), budget_s=budget, shapes=spec["shapes"], calibration=calibration
    )
    profile = json.loads((out / "profile.json").read_text())
    return {
        "profile_path": str(out / "profile.json"),
        "profile": profile,
        "config": result.winner.candidate.label,
        "wall_s": time.monotonic() - start,
        "tuner_speedup": result.speedup,
        "gate_data": profile.get("gate_data"),
        "calibration_data": profile.get("calibration_data"),
    }


def evaluate(source: str, tuned: dict[str, Any], samples: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """The winner on the evaluation set, each output held to tune's default limit."""
    outputs = accuracy(load(source), ortpilot.load_profile(tuned["profile_path"]), samples)
    worst = max(outputs.items(), key=lambda kv: kv[1]["error"])
    return {
        "outputs": outputs,
        "worst_output": worst[0],
        "worst_error": worst[1]["error"],
        "passes": all(o["error"] <= DEFAULT_MAX_ERROR for o in outputs.values()),
    }


def bench_model(name: str, args: Any, root: Path, sets: dict[str, tuple[Path, Path]]) -> dict[str, Any]:
    spec = MODELS[name]
    tune_data, eval_data = data_specs(name, spec, sets)
    synthetic = tune_once(spec, root / name / "synthetic", args.budget, None)
    real = tune_once(spec, root / name / "real", args.budget, tune_data)
    source = synthetic["profile"]["source_model"]["path"]
    proto = load_model(source, load_external_data=False)
    samples, _notes = eval_data.samples(graph_inputs(proto), parse_shape_args(spec["shapes"]))
    checks = {"synthetic": evaluate(source, synthetic, samples), "real": evaluate(source, real, samples)}
    feeds = samples[0]  # a real evaluation sample, the same for every config
    configs = [
        BenchConfig("ORT default", model=source, providers=["CPUExecutionProvider"], feeds=feeds),
        *(
            BenchConfig(
                f"{label}-gated",
                model=ortpilot.load_profile(t["profile_path"]),
                feeds=feeds,
                iobinding=bool(t["profile"]["iobinding"]),
            )
            for label, t in (("synthetic", synthetic), ("real", real))
        ),
    ]
    timing = measure(configs, args.duration, block_for(real, args.turn))
    return {
        "model": name,
        "eval_samples": len(samples),
        "tuned": {"synthetic": synthetic, "real": real},
        "eval": checks,
        "timing": timing,
    }


def row_cells(row: dict[str, Any], label: str) -> str:
    tuned, check = row["tuned"][label], row["eval"][label]
    stat = row["timing"]["rows"][f"{label}-gated"]
    verdict = "passes" if check["passes"] else "**fails**"
    gate = tuned["gate_data"] or {}
    gated = f"{gate.get('source', '?')} ({gate.get('samples', '?')})"
    return (
        f"{tuned['config']} | {gated} | {check['worst_output']}: {check['outputs'][check['worst_output']]['metric']} "
        f"{check['worst_error']:.4f} ({verdict}) | {stat['speedup']:.2f}x ({stat['speedup_ci'][0]:.2f}-"
        f"{stat['speedup_ci'][1]:.2f}) | {tuned['wall_s']:.0f}"
    )


def main() -> None:
    args = tune_bench_parser(__doc__.splitlines()[0]).parse_args()
    names = [n for n in MODELS if not args.only or n in args.only.split(",")]
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-real-gate-"))
    root.mkdir(parents=True, exist_ok=True)
    sets: dict[str, tuple[Path, Path]] = {}
    try:
        if any(MODELS[n]["kind"] == "text" for n in names):
            sets["text"] = write_text_sets(root)
        if any(MODELS[n]["kind"] == "images" for n in names):
            sets["images"] = write_image_sets(root)
    except PrepError as exc:
        sys.exit(f"bench_real_gate: {exc}")
    head = header(args)
    rows = []
    for name in names:
        model = MODELS[name]["model"]
        if not model or not Path(model).exists():
            print(f"skip {name}: model missing ({model or 'package not installed'})", file=sys.stderr)
            continue
        row = bench_model(name, args, root, sets)
        rows.append(row)
        print(json.dumps(row, default=str), file=sys.stderr, flush=True)
    write_json(args.json, {"header": head, "limit": DEFAULT_MAX_ERROR, "rows": rows})
    print(head + f"; evaluation limit {DEFAULT_MAX_ERROR:g} (tune's default)\n")
    print(
        "| model | gate | winner | gated on (held-out samples) | on the evaluation set: worst output, metric, "
        "error | speedup vs ORT default (95% CI) | tune wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        for label in ("synthetic", "real"):
            print(f"| {row['model']} ({row['eval_samples']} eval samples) | {label} | {row_cells(row, label)} |")


if __name__ == "__main__":
    main()
