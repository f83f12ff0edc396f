"""OpenVINO compiled once with dynamic dims, or per input shape: what each is worth on real sentences (issue 46).

One INT8 model (``--model``: NNCF's QDQ MiniLM, e.g. ``bench_workload.py``'s OpenVINO tune's ``tuned/model.onnx``)
and real sentences (``--sentences``), sorted by length and cut into calls of ``--batch`` (padded to the longest, as
sentence-transformers batches; ``--batch 1``: one sentence per call at its own length, in the file's order). Every
variant is timed against ORT's default CPU session of the float MiniLM in one process, in rounds, each variant
timed over every call in turn (a pause between them: ORT's idle threads spin after a run), ``--rounds`` times:

- in the onnxruntime-openvino distribution (``.venv-ovbench``): the OpenVINO EP compiled once (``dynamic``), with
  ``disable_dynamic_shapes=True`` (``per-shape``: the EP compiles each new input shape and keeps it, the tune's
  knob ``tuning.space.PER_SHAPE_OPTION``) and a session per exact shape with ORT's ``free_dimension_overrides``
  (``static``: what a shape plan's buckets are, without padding); the first pass's time (each new shape's compile)
  and the resident memory each adds are printed too;
- with OpenVINO's own Python package (``.venv-ovnative``, which has stock onnxruntime for the anchor): the same model
  read by OpenVINO, compiled with dynamic dims (``native dynamic``) and reshaped and compiled per exact shape
  (``native static``): the ceiling an EP session can reach; and static shapes at lengths rounded up to 8 or 16
  tokens (``lengths to 8``, each call padded there: what buckets at batch B would run, fewer shapes, more padding).

    .venv-ovbench/bin/python benchmarks/bench_ov_per_shape.py --model /tmp/bw26/tuned/model.onnx \\
        --sentences /tmp/bw26/corpus/part1.txt --batch 32 [--json OUT.json]
    .venv-ovnative/bin/python benchmarks/bench_ov_per_shape.py --model ... --sentences ... --batch 32
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _prep import length_batches, sentence_feeds, write_json

ROOT = Path(__file__).resolve().parent.parent
MINILM = ROOT / "benchmarks/models/minilm"
OUTPUT = "sentence_embedding"
PAUSE_S = 0.5


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def calls(sentences: Path, batch: int, limit: int) -> list[dict[str, np.ndarray]]:
    lines = [s for s in sentences.read_text(encoding="utf-8").splitlines() if s.strip()][:limit]
    feeds = sentence_feeds(MINILM / "tokenizer.json", lines)
    return feeds if batch == 1 else length_batches(feeds, batch)


def ep_variants(model: str, threads: int) -> dict[str, Callable[[], Callable[[dict], Any]]]:
    import onnxruntime as ort

    ov = {"device_type": "CPU", "num_of_threads": str(threads)}

    def session(**extra: str) -> Callable[[dict], Any]:
        s = ort.InferenceSession(model, providers=["OpenVINOExecutionProvider"], provider_options=[{**ov, **extra}])
        return lambda feeds: s.run([OUTPUT], feeds)[0]

    def static() -> Callable[[dict], Any]:
        dims = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).get_inputs()[0].shape
        made: dict[tuple[int, ...], Any] = {}

        def run(feeds: dict) -> Any:
            shape = feeds["input_ids"].shape
            if shape not in made:
                opts = ort.SessionOptions()
                for name, size in zip(dims, shape):
                    opts.add_free_dimension_override_by_name(str(name), int(size))
                made[shape] = ort.InferenceSession(
                    model, opts, providers=["OpenVINOExecutionProvider"], provider_options=[ov]
                )
            return made[shape].run([OUTPUT], feeds)[0]

        return run

    return {
        "dynamic": session,
        "per-shape": lambda: session(disable_dynamic_shapes="True"),
        "static": static,
    }


def native_variants(model: str, threads: int) -> dict[str, Callable[[], Callable[[dict], Any]]]:
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}

    def compiled(m: Any) -> Callable[[dict], Any]:
        c = core.compile_model(m, "CPU", config)
        out = next(o for o in c.outputs if OUTPUT in o.get_names())
        request = c.create_infer_request()
        return lambda feeds: request.infer(feeds)[out]

    def static() -> Callable[[dict], Any]:
        base = core.read_model(model)
        made: dict[tuple[int, ...], Any] = {}

        def run(feeds: dict) -> Any:
            shape = feeds["input_ids"].shape
            if shape not in made:
                m = base.clone()
                m.reshape({name: list(shape) for name in feeds})
                made[shape] = compiled(m)
            return made[shape](feeds)

        return run

    def bucketed(step: int) -> Callable[[], Callable[[dict], Any]]:
        """Static shapes at lengths rounded up to ``step`` (pad id 0, mask 0): what a bucket per ``step`` tokens
        would run at batch B, fewer shapes than per exact length, each call padded further."""

        def make() -> Callable[[dict], Any]:
            exact = static()

            def run(feeds: dict) -> Any:
                length = int(feeds["input_ids"].shape[1])
                padded = -(-length // step) * step
                widths = [(0, 0), (0, padded - length)]
                return exact({k: np.pad(v, widths) for k, v in feeds.items()})

            return run

        return make

    return {
        "native dynamic": lambda: compiled(core.read_model(model)),
        "native static": static,
        "native static, lengths to 8": bucketed(8),
        "native static, lengths to 16": bucketed(16),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--sentences", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--limit", type=int, default=1024, help="sentences taken from the file")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    import onnxruntime as ort

    work = calls(args.sentences, args.batch, args.limit)
    items = sum(int(c["input_ids"].shape[0]) for c in work)
    native = importlib.util.find_spec("openvino") is not None and "OpenVINOExecutionProvider" not in (
        ort.get_available_providers()
    )
    makers = native_variants(args.model, args.threads) if native else ep_variants(args.model, args.threads)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    plain = ort.InferenceSession(str(MINILM / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    runs: dict[str, Callable[[dict], Any]] = {"ORT default": lambda feeds: plain.run([OUTPUT], feeds)[0]}
    first: dict[str, dict[str, float]] = {}
    reference = np.concatenate([runs["ORT default"](c) for c in work])
    worst: dict[str, float] = {"ORT default": 1.0}
    for name, make in makers.items():
        before = rss_mb()
        start = time.perf_counter()
        run = make()
        got = np.concatenate([run(c) for c in work])  # the first pass: every shape is new
        first[name] = {"first_pass_s": time.perf_counter() - start, "rss_added_mb": rss_mb() - before}
        cos = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
        worst[name] = float(cos.min())
        runs[name] = run
    speeds: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            time.sleep(PAUSE_S)
            start = time.perf_counter()
            for c in work:
                runs[name](c)
            speeds[name].append(items / (time.perf_counter() - start))
    anchor = speeds["ORT default"]
    doc: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "ort": f"{ort.__version__} ({'native OpenVINO beside it' if native else 'onnxruntime-openvino'})",
        "batch": args.batch,
        "calls": len(work),
        "shapes": len({c["input_ids"].shape for c in work}),
        "items": items,
        "variants": {},
    }
    print(f"{len(work)} calls of up to {args.batch} ({items} sentences, {doc['shapes']} shapes); items/s per round")
    for name, got in speeds.items():
        ratios = [a / b for a, b in zip(got, anchor)] if name != "ORT default" else [1.0] * len(got)
        row = {
            "items_per_s": statistics.median(got),
            "ratio_median": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)],
            "worst_cosine": worst[name],
            **first.get(name, {}),
        }
        doc["variants"][name] = row
        extra = f", first pass {row['first_pass_s']:.2f} s, +{row['rss_added_mb']:.0f} MB" if name in first else ""
        print(
            f"  {name:16s} {row['items_per_s']:7.0f}/s  {row['ratio_median']:.2f}x "
            f"({row['ratio_range'][0]:.2f}-{row['ratio_range'][1]:.2f})  worst cosine {worst[name]:.4f}{extra}"
        )
    write_json(args.json, doc)


if __name__ == "__main__":
    main()
