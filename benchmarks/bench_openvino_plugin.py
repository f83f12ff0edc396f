"""With the OpenVINO plugin EP: does ``ortpilot tune`` reach native OpenVINO + NNCF INT8 on MiniLM, from inside ORT?

Run where the plugin lists a device (an Intel CPU), in the venv ``.ci/openvino-plugin.sh`` makes, with
OpenVINO's own Python package added as the native anchor (benchmarks only):

    .venv-ovplugin/bin/pip install "openvino==2026.4.*"
    .venv-ovplugin/bin/python benchmarks/bench_openvino_plugin.py [--budget 120] [--rounds 12] [--json out.json]

1. ``ortpilot tune`` on the MiniLM folder with ``--calibration-text`` (the corpus sentences the accuracy
   check does not use), as ``bench_tune.py --real-gate`` does: its headline and wall time.
2. The same tune data builds the comparison variants: NNCF's QDQ ONNX model (``passes.openvino_int8``),
   ORT's ``quantize_static`` QDQ per channel restricted to MatMul/Gemm (OpenVINO's placement, ORT's
   quantizer), ORT's naive full QDQ, and native OpenVINO + NNCF INT8 (``nncf.quantize`` on OpenVINO's own
   model, transformer preset).
3. Every variant timed round-robin in this one process (``--rounds`` rounds of about 0.4 s each,
   the order rotating), each round's p50 over ORT's default p50: the median ratio and its range.
   Accuracy: the cosine of mean-pooled sentence embeddings on the 16 check sentences, worst sentence.
4. The headline reproduced in a fresh process: ``load_profile`` beside a plain ORT session, interleaved.
5. Cold start, each in a fresh process, alternated: process start to first output and session creation
   alone, with the compiled blob and without it (OpenVINO compiling the model, its model cache empty).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from bench_tune import MINILM_DIR, check_samples, real_calibration, tune_model

import ortpilot
from ortpilot.session import load

OV = "OpenVINOExecutionProvider"
Run = Callable[[dict[str, np.ndarray]], np.ndarray]


def ort_runner(model: Any, providers: list) -> Run:
    session = load(model, providers, policy="strict") if not hasattr(model, "run") else model
    name = session.get_outputs()[0].name
    return lambda feeds: session.run([name], feeds)[0]


def native_runner(model: Any, threads: int) -> Run:
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    return lambda feeds: np.array(request.infer(feeds)[0])


def pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float64)
    return (hidden * m).sum(1) / np.maximum(m.sum(1), 1)


def sentence_cosines(ref: Run, got: Run, samples: list[dict[str, np.ndarray]]) -> tuple[float, float]:
    """(the project's sentence cosine: 1 - the gate's cosine error over the mean-pooled embeddings, as
    BENCHMARKS quotes it; the worst single sentence's cosine)."""
    from ortpilot.measure.metrics import metric_error

    a = [pooled(ref(s), s["attention_mask"]) for s in samples]
    b = [pooled(got(s), s["attention_mask"]) for s in samples]
    worst = min(float(x.ravel() @ y.ravel() / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b))
    return 1.0 - float(metric_error("cosine", a, b)), worst


def round_robin(runs: dict[str, Run], feeds: dict[str, np.ndarray], rounds: int, turn_s: float) -> dict[str, Any]:
    """Each config times its own turn of about ``turn_s`` per round, the order rotating; per round the p50s."""
    names = list(runs)
    for name in names:  # warm-up
        for _ in range(5):
            runs[name](feeds)
    per_round: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times, start = [], time.perf_counter()
            while time.perf_counter() - start < turn_s or len(times) < 5:
                t = time.perf_counter()
                runs[name](feeds)
                times.append(time.perf_counter() - t)
            per_round[name].append(statistics.median(times))
    base = per_round[names[0]]
    out = {}
    for name in names:
        ratios = sorted(b / x for b, x in zip(base, per_round[name]))
        out[name] = {
            "p50_ms": statistics.median(per_round[name]) * 1e3,
            "speedup": statistics.median(ratios),
            "range": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
        }
    return out


REPRODUCE = r"""
import json, statistics, sys, time
import numpy as np
import onnxruntime as ort
import ortpilot
from ortpilot.tuning.reference import read_reference
profile, rounds = sys.argv[1], int(sys.argv[2])
doc = json.load(open(profile))
tuned = ortpilot.load_profile(profile)
inputs, _ = read_reference(__import__("pathlib").Path(profile).parent / doc["reference_outputs"]["file"])
plain = ort.InferenceSession(doc["source_model"]["path"], providers=["CPUExecutionProvider"])
runs = {"default": lambda: plain.run(None, inputs), "tuned": lambda: tuned.run(None, inputs)}
for f in runs.values():
    for _ in range(5): f()
per = {k: [] for k in runs}
for r in range(rounds):
    for k in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
        ts, s = [], time.perf_counter()
        while time.perf_counter() - s < 0.4 or len(ts) < 5:
            t = time.perf_counter(); runs[k](); ts.append(time.perf_counter() - t)
        per[k].append(statistics.median(ts))
print(json.dumps({"speedup": statistics.median(sorted(a / b for a, b in zip(per["default"], per["tuned"]))),
                  "loaded": tuned.model_path.name}))
"""

COLD = r"""
import time; t0 = time.perf_counter()
import sys, json
import ortpilot
from ortpilot.tuning.reference import read_reference
profile = sys.argv[1]
s0 = time.perf_counter(); sess = ortpilot.load_profile(profile, policy="warn"); s1 = time.perf_counter()
doc = json.load(open(profile))
inputs, _ = read_reference(__import__("pathlib").Path(profile).parent / doc["reference_outputs"]["file"])
sess.run(None, inputs); t1 = time.perf_counter()
print(json.dumps({"first_output_s": t1 - t0, "load_profile_s": s1 - s0, "create_s": sess.create_s,
                  "loaded": sess.model_path.name}))
"""


def cold_start(profile: Path, repeats: int) -> dict[str, Any]:
    """Fresh processes, alternated: the profile with its blob, and a copy without it (an empty OpenVINO cache)."""
    doc = json.loads(profile.read_text())
    without = profile.parent / "profile.no-blob.json"
    without.write_text(json.dumps({k: v for k, v in doc.items() if k != "compiled_model"}))
    rows: dict[str, list[dict[str, float]]] = {"blob": [], "compile": []}
    for _ in range(repeats):
        for name, path in (("blob", profile), ("compile", without)):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "ORTPILOT_CACHE_DIR": cache}
                done = subprocess.run([sys.executable, "-c", COLD, str(path)], capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    raise SystemExit(done.stderr[-2000:])
                rows[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    without.unlink()
    out = {}
    for name, got in rows.items():
        out[name] = {k: statistics.median(r[k] for r in got) for k in ("first_output_s", "load_profile_s", "create_s")}
        out[name]["loaded"] = got[-1]["loaded"]
    return out


def tokenized(lines: list[str], seq: int) -> list[dict[str, np.ndarray]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MINILM_DIR / "tokenizer.json"))
    tok.enable_padding(length=seq)
    tok.enable_truncation(max_length=seq)
    return [
        {
            "input_ids": np.array([e.ids], np.int64),
            "attention_mask": np.array([e.attention_mask], np.int64),
            "token_type_ids": np.array([e.type_ids], np.int64),
        }
        for e in tok.encode_batch([x for x in lines if x.strip()])
    ]


def variants(source: Path, calibration: list[dict[str, np.ndarray]], work: Path) -> dict[str, Path]:
    """The QDQ models to compare on the same calibration samples."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from ortpilot.passes.openvino_int8 import OpenVINOInt8Pass
    from ortpilot.passes.quantize import QuantizePass, prepare

    out = {"nncf": work / "nncf.onnx", "ort-matmul": work / "ort-matmul-qdq.onnx", "ort-full": work / "ort-full.onnx"}
    OpenVINOInt8Pass(calibration=calibration).run(source).save(out["nncf"])
    QuantizePass("full", calibration=calibration, per_channel=True).run(source).save(out["ort-full"])

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(calibration)

        def get_next(self):
            return next(self.it, None)

    prepared, _ = prepare(onnx.load(str(source)))
    onnx.save(prepared, str(work / "prepared.onnx"))
    quantize_static(
        str(work / "prepared.onnx"),
        str(out["ort-matmul"]),
        Reader(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul", "Gemm"],
        per_channel=True,
    )
    return out


def native_nncf(source: Path, calibration: list[dict[str, np.ndarray]]) -> Any:
    import nncf
    import openvino as ov

    return nncf.quantize(
        ov.Core().read_model(str(source)),
        nncf.Dataset(calibration),
        model_type=nncf.ModelType.TRANSFORMER,
        preset=nncf.QuantizationPreset.MIXED,
        subset_size=len(calibration),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--cold-repeats", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    out_root = Path(args.out or tempfile.mkdtemp(prefix="bench-ovplugin-"))
    out_root.mkdir(parents=True, exist_ok=True)
    calibration = real_calibration("minilm", out_root)
    tuned = tune_model("minilm", args.budget, out_root, calibration=calibration)
    profile = Path(tuned["profile_path"])
    doc = tuned["profile"]
    source = Path(doc["source_model"]["path"])
    shapes = {k: tuple(v) for k, v in tuned["shapes"].items()}
    check, what = check_samples("minilm", source, shapes)
    lines = (out_root / "calibration-sentences.txt").read_text(encoding="utf-8").splitlines()
    samples = tokenized(lines, int(shapes["input_ids"][1]))  # the tune's own sentences, for every variant
    built = variants(source, samples, out_root)
    threads = len(os.sched_getaffinity(0))
    ov_opts = {"num_of_threads": str(threads)}
    from ortpilot.providers.plugins import build_providers

    ep = "OpenVINO EP (onnxruntime-openvino)" if OV in build_providers() else "OpenVINO plugin"
    runs: dict[str, Run] = {
        "ORT default (CPU EP)": ort_runner(str(source), ["cpu"]),
        "ortpilot tune's profile": ort_runner(ortpilot.load_profile(profile), []),
        f"ORT + {ep}, fp32": ort_runner(str(source), [("openvino", ov_opts)]),
        f"ORT + {ep}, NNCF QDQ": ort_runner(str(built["nncf"]), [("openvino", ov_opts)]),
        f"ORT + {ep}, ORT QDQ on MatMul/Gemm": ort_runner(str(built["ort-matmul"]), [("openvino", ov_opts)]),
        f"ORT + {ep}, ORT full QDQ": ort_runner(str(built["ort-full"]), [("openvino", ov_opts)]),
        "ORT CPU EP, NNCF QDQ": ort_runner(str(built["nncf"]), ["cpu"]),
    }
    if importlib.util.find_spec("openvino") is not None:  # the native anchor, where OpenVINO's Python package is
        runs["native OpenVINO fp32"] = native_runner(str(source), threads)
        runs["native OpenVINO + NNCF INT8"] = native_runner(native_nncf(source, samples), threads)
    feeds = check[0]
    timing = round_robin(runs, feeds, args.rounds, 0.4)
    reference = runs["ORT default (CPU EP)"]
    cosines = {name: sentence_cosines(reference, run, check) for name, run in runs.items()}
    child = subprocess.run(
        [sys.executable, "-c", REPRODUCE, str(profile), str(args.rounds)], capture_output=True, text=True
    )
    reproduced = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else {"error": child.stderr}
    cold = cold_start(profile, args.cold_repeats) if doc.get("compiled_model") else None
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "ort": ort.__version__,
        "plugin": doc.get("compiled_model", {}).get("plugin") or ort.get_build_info(),
        "openvino": doc.get("compiled_model", {}).get("openvino"),
        "cpu": doc.get("machine_class", {}).get("name"),
        "tune": {
            "winner": tuned["config"],
            "headline": tuned["tuner_speedup"],
            "wall_s": tuned["wall_s"],
            "candidates": tuned["candidates"],
        },
        "check": what,
        "timing": timing,
        "min_cosine": cosines,
        "reproduced": reproduced,
        "cold_start": cold,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("date", "ort", "plugin", "openvino", "cpu", "tune", "reproduced")}))
    print(f"\nAccuracy on {what}: sentence cosine (mean-pooled embeddings, norm-weighted) and the worst sentence's\n")
    print("| variant | p50 ms | vs ORT default (IQR over rounds) | sentence cosine | worst sentence |")
    print("|---|---|---|---|---|")
    for name, row in timing.items():
        print(
            f"| {name} | {row['p50_ms']:.2f} | {row['speedup']:.2f}x ({row['range'][0]:.2f}-{row['range'][1]:.2f}) "
            f"| {cosines[name][0]:.4f} | {cosines[name][1]:.4f} |"
        )
    if cold:
        print("\n| cold start (median of fresh processes) | first output s | load_profile s | session creation s |")
        print("|---|---|---|---|")
        for name, row in cold.items():
            print(
                f"| {name} ({row['loaded']}) | {row['first_output_s']:.3f} | {row['load_profile_s']:.3f} | "
                f"{row['create_s']:.3f} |"
            )


if __name__ == "__main__":
    main()
