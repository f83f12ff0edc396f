"""Dynamic INT8 vs static QDQ vs float on real conv nets (nudenet 320n, rapidocr PP-OCRv6 det),
and MiniLM dynamic INT8 when benchmarks/models/minilm/model.onnx exists.

Every variant is built with ortpilot's passes and gated with its accuracy metric against the
float model on held-out inputs; latencies are measured interleaved (round-robin over the
variants, several rounds, in one process) and reported as medians with ratios to float.

    .venv/bin/python benchmarks/bench_quantize_cnn.py [--rounds 5] [--runs 20] [--threads 2] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
from _prep import package_file

from ortpilot.measure.compare import compare_runs, run_samples
from ortpilot.passes.quantize import QuantizePass

ROOT = Path(__file__).resolve().parent


def photo_like(n: int, size: int, seed: int, *, scale01: bool) -> list[np.ndarray]:
    """Images with natural-image statistics (smooth gradients, blobs, edges, a little noise), not white noise."""
    rng = np.random.default_rng(seed)
    out = []
    yy, xx = np.mgrid[0:size, 0:size] / size
    for _ in range(n):
        img = np.zeros((3, size, size), np.float32)
        for c in range(3):
            img[c] = rng.uniform(0.2, 0.8) + 0.3 * (rng.uniform(-1, 1) * xx + rng.uniform(-1, 1) * yy)
        for _ in range(rng.integers(4, 10)):  # blobs and rectangles ("objects", "text boxes")
            cx, cy, r = rng.uniform(0, 1, 2).tolist() + [rng.uniform(0.05, 0.25)]
            color = rng.uniform(0, 1, 3)[:, None, None]
            if rng.random() < 0.5:
                mask = ((xx - cx) ** 2 + (yy - cy) ** 2) < r**2
            else:
                mask = (abs(xx - cx) < r) & (abs(yy - cy) < r / 4)
            img = np.where(mask[None], color, img)
        img += rng.normal(0, 0.02, img.shape).astype(np.float32)
        img = np.clip(img, 0, 1)
        if not scale01:  # PaddleOCR det: ImageNet mean/std normalization
            mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
            std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
            img = (img - mean) / std
        out.append(img[None].astype(np.float32))
    return out


def session(model, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    data = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def interleaved(sessions: dict[str, ort.InferenceSession], feeds: dict, rounds: int, runs: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for s in sessions.values():  # warm-up
        for _ in range(3):
            s.run(None, feeds)
    for _ in range(rounds):
        for name, s in sessions.items():
            for _ in range(runs):
                t = time.perf_counter()
                s.run(None, feeds)
                times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def bench_cnn(label: str, path: Path, input_name: str, size: int, scale01: bool, args) -> list[str]:
    images = photo_like(16, size, 0, scale01=scale01)
    samples = [{input_name: x} for x in images]
    calib, held = samples[:12], samples[12:]
    variants: dict = {"float": None}
    records = {}
    failures: dict[str, str] = {}
    for name, step in (
        ("dynamic", QuantizePass("dynamic")),
        ("dynamic per-channel", QuantizePass("dynamic", per_channel=True)),
        ("qdq", QuantizePass("qdq", calibration=calib)),
        ("qdq per-channel", QuantizePass("qdq", calibration=calib, per_channel=True)),
        ("full", QuantizePass("full", calibration=calib, per_channel=True)),
    ):
        try:
            result = step.run(path)
            sessions_try = session(result.model, args.threads)
        except Exception as exc:
            failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            continue
        variants[name] = sessions_try
        records[name] = result.record
    float_sess = session(path, args.threads)
    sessions = {"float": float_sess}
    sessions.update({k: v for k, v in variants.items() if v is not None})
    ref = run_samples(float_sess, held)
    errors = {}
    for name, s in sessions.items():
        c = compare_runs(ref, run_samples(s, held))
        w = c.worst_output()
        errors[name] = (w.metric, w.error, w.cosine, w.snr_db)
    medians = interleaved(sessions, held[0], args.rounds, args.runs)
    lines = [
        f"### {label} (`{path.name}`, input {input_name} 1x3x{size}x{size})",
        "",
        (
            "| variant | quantized nodes | median ms | vs float | gate metric | error | cosine | SNR dB | "
            f"passes --max-error {args.max_error} |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    best = None
    for name in sessions:
        metric, err, cos, snr = errors[name]
        q = records[name].quantized_nodes if name in records else 0
        ratio = medians["float"] / medians[name]
        ok = err <= args.max_error
        lines.append(
            f"| {name} | {q} | {medians[name]:.2f} | {ratio:.2f}x | {metric} | {err:.4g} | {cos:.5f} | "
            f"{snr:.1f} | {'yes' if ok else 'no'} |"
        )
        if name != "float" and ok and (best is None or medians[name] < medians[best]):
            best = name
    for name, why in failures.items():
        lines.append(f"| {name} | - | failed | - | - | - | - | - | {why} |")
    lines += [
        "",
        f"Fastest gate-passing INT8 variant: **{best or 'none'}**"
        + (f" ({medians['float'] / medians[best]:.2f}x float)" if best else "")
        + ".",
        "",
    ]
    return lines


def bench_minilm(path: Path, args) -> list[str]:
    import onnx

    from ortpilot.graph.feeds import make_feeds, plan_feeds

    model = onnx.load(path, load_external_data=False)
    plan = plan_feeds(
        model,
        {"sequence": (128,)}
        if any("seq" in str(d) for i in model.graph.input for d in i.type.tensor_type.shape.dim)
        else None,
    )
    samples = [make_feeds(model, plan=plan, seed=i) for i in range(8)]
    sessions = {
        "float": session(path, args.threads),
        "dynamic int8": session(QuantizePass("dynamic").run(path).model, args.threads),
        "dynamic int8 per-channel": session(QuantizePass("dynamic", per_channel=True).run(path).model, args.threads),
    }
    ref = run_samples(sessions["float"], samples)
    medians = interleaved(sessions, samples[0], args.rounds, args.runs)
    lines = [
        f"### MiniLM (`benchmarks/models/minilm/model.onnx`), inputs {plan.describe()}",
        "",
        "| variant | median ms | vs float |",
        "|---|---|---|",
    ]
    for name in sessions:
        lines.append(f"| {name} | {medians[name]:.2f} | {medians['float'] / medians[name]:.2f}x |")
    lines.append("")
    for variant in ("dynamic int8", "dynamic int8 per-channel"):
        test = run_samples(sessions[variant], samples)
        lines += _minilm_accuracy(variant, ref, test)
    lines.append("- inputs are generated token ids (no tokenizer/data set available offline), 8 samples")
    return lines + [""]


def _minilm_accuracy(variant: str, ref: list, test: list) -> list[str]:
    lines = []
    for o in compare_runs(ref, test).outputs:
        extra = ""
        if o.name in ref[0] and ref[0][o.name].ndim == 3:  # token embeddings -> mean-pooled sentence embedding
            a = np.concatenate([r[o.name].mean(axis=1) for r in ref])
            b = np.concatenate([t[o.name].mean(axis=1) for t in test])
            cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
            extra = f", mean-pooled sentence-embedding cosine min {cos.min():.5f} mean {cos.mean():.5f}"
        lines.append(
            f"- {variant}, output `{o.name}`: cosine {o.cosine:.5f}, SNR {o.snr_db:.1f} dB, {o.metric} "
            f"error {o.error:.4g}{extra}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-error", type=float, default=0.05)
    parser.add_argument("--out", default=str(ROOT / "out" / "quantize.md"))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    lines = [
        "# Quantization on real models (CPU)",
        "",
        (
            f"Command: `.venv/bin/python benchmarks/bench_quantize_cnn.py --rounds {args.rounds} --runs {args.runs} "
            f"--threads {args.threads} --max-error {args.max_error}`"
        ),
        "",
        (
            f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; ORT {ort.__version__}; "
            f"Python {sys.version.split()[0]}; {args.threads} intra-op threads; CPU EP. Medians over "
            f"{args.rounds} interleaved rounds x {args.runs} runs per variant. Accuracy: each variant against "
            "float on 4 held-out photo-like inputs (calibration: 12 others); metric chosen per output by "
            "`ortpilot.measure.compare.choose_metric` (relative L2 for detection maps)."
        ),
        "",
    ]
    nude = package_file("nudenet", "320n.onnx")
    if nude:
        lines += bench_cnn("nudenet 320n (YOLOv8n detector)", nude, "images", 320, True, args)
    det = package_file("rapidocr", "models/PP-OCRv6_det_small.onnx")
    if det:
        lines += bench_cnn("rapidocr PP-OCRv6 det small (DB text detector)", det, "x", 480, False, args)
    minilm = ROOT / "models" / "minilm" / "model.onnx"
    if minilm.exists():
        lines += bench_minilm(minilm, args)
    else:
        lines += [
            (
                "MiniLM: `benchmarks/models/minilm/model.onnx` not present when this ran (made by "
                "`benchmarks/prep_minilm.py`); not measured."
            ),
            "",
        ]
    text = "\n".join(lines)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
