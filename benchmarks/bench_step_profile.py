"""Where a decode step's time goes: ORT's per-op-type kernel time, and the loop's own Python.

For each model (an ONNX decoder with GroupQueryAttention; ``--fuse`` builds ortpilot's fused
variants of an export first), one shared-buffer loop runs ``--steps`` decode steps after a
prefill to ``--context`` - ``--steps`` tokens, twice: with ORT's profiler on (kernel time per op
type, per step; profiling inflates it somewhat, compare rows, not absolutes) and with it off,
timing ``run_with_iobinding`` inside the step to get the Python work around it (binding, argmax).
The models take turns of 8 steps so a noisy moment hits them alike.

    .venv/bin/python benchmarks/bench_step_profile.py --fuse benchmarks/models/smollm2/model.onnx \\
        --model benchmarks/models/genai-int4/model.onnx --context 2048
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from _interleave import interleave_steps
from _prep import write_json

from ortpilot.decode.loops import DecodeLoop, make_loop
from ortpilot.decode.signature import detect_signature

TURN = 8


def name_norm_statistics(model: onnx.ModelProto) -> int:
    """Undo what ``graph.prune.clear_unread_outputs`` does to this model: name the mean and
    inverse-std outputs (1, 2) of every SkipSimplifiedLayerNormalization, as onnxscript leaves them."""
    named = 0
    for node in model.graph.node:
        if node.op_type != "SkipSimplifiedLayerNormalization":
            continue
        while len(node.output) < 3:
            node.output.append("")
        for k in (1, 2):
            if not node.output[k]:
                node.output[k] = f"{node.name or 'norm'}_unread_{k}_{named}"
                named += 1
    return named


def fused_variants(export: str, out: Path) -> dict[str, Path]:
    """ortpilot's int4 model as shipped, with the rotary tables left computed per step, and with
    the norms' unread statistics outputs named again (what ``graph.prune`` saves)."""
    from ortpilot.modelio import load_model
    from ortpilot.passes.base import SourceModel
    from ortpilot.passes.decoder_fusion import DecoderFusionPass
    from ortpilot.passes.weight_only import WeightOnlyPass

    source = load_model(export)
    paths = {}
    for name, positions in (("ortpilot-int4", None), ("ortpilot-int4 (rotary computed per step)", 0)):
        fused = DecoderFusionPass(max_positions=positions, use_cache=True).run(source).model
        int4 = WeightOnlyPass("int4").transform(SourceModel(fused, None, "")).model
        paths[name] = out / f"{len(paths)}.onnx"
        onnx.save(int4, paths[name])
        if positions is None:
            name_norm_statistics(int4)
            paths["ortpilot-int4 (norm statistics named)"] = out / "named.onnx"
            onnx.save(int4, paths["ortpilot-int4 (norm statistics named)"])
    return paths


class Probe:
    """One model behind one shared loop; times ``run_with_iobinding`` inside each step."""

    def __init__(self, path: Path, context: int, steps: int, threads: int, profile_dir: Path | None) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        if profile_dir is not None:
            options.enable_profiling = True
            options.profile_file_prefix = str(profile_dir / path.stem)
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.run_s: list[float] = []
        self.step_s: list[float] = []
        run = self.session.run_with_iobinding

        def timed(io: ort.IOBinding, *args: object) -> None:
            start = time.perf_counter()
            run(io, *args)
            self.run_s.append(time.perf_counter() - start)

        self.session.run_with_iobinding = timed  # type: ignore[method-assign]
        signature = detect_signature(onnx.load(str(path), load_external_data=False))
        self.loop: DecodeLoop = make_loop("shared", self.session, signature, context)
        prompt = np.random.default_rng(0).integers(1, signature.vocab_size or 1000, (1, context - steps - 1))
        self.token = int(self.loop.prefill(prompt, np.ones_like(prompt))[0].argmax())
        self.run_s.clear()

    def step(self) -> None:
        start = time.perf_counter()
        self.token = int(self.loop.step(np.array([[self.token]], dtype=np.int64))[0].argmax())
        self.step_s.append(time.perf_counter() - start)

    def op_time_us(self, steps: int) -> dict[str, float]:
        """Kernel µs per decode step by op type, from the profile (the prefill's run left out)."""
        events = json.loads(Path(self.session.end_profiling()).read_text())
        runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
        after_prefill = runs[0]["ts"] + runs[0]["dur"]
        totals: collections.Counter[str] = collections.Counter()
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > after_prefill:
                totals[e["args"]["op_name"]] += e["dur"]
        return {op: us / steps for op, us in totals.most_common()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[], help="a decoder with GroupQueryAttention (repeatable)")
    ap.add_argument(
        "--fuse",
        metavar="EXPORT",
        help="also profile ortpilot's int4 builds of this export "
        "(as shipped, and with the rotary tables computed per step)",
    )
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        paths = fused_variants(args.fuse, Path(tmp)) if args.fuse else {}
        paths.update({m: Path(m) for m in args.model})
        if not paths:
            ap.error("give --model and/or --fuse")
        doc = {
            "ort": ort.__version__,
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
            "context": args.context,
            "steps": args.steps,
            "models": {},
        }
        profiled = {n: Probe(p, args.context, args.steps, args.threads, Path(tmp)) for n, p in paths.items()}
        interleave_steps(list(profiled.values()), args.steps, TURN, Probe.step)
        timed = {n: Probe(p, args.context, args.steps, args.threads, None) for n, p in paths.items()}
        interleave_steps(list(timed.values()), args.steps, TURN, Probe.step)
        for name in paths:
            ops = profiled[name].op_time_us(args.steps)
            probe = timed[name]
            outside = (np.array(probe.step_s) - np.array(probe.run_s)) * 1e6
            doc["models"][name] = {
                "op_us_per_step": ops,
                "kernel_us_per_step": sum(ops.values()),
                "step_ms_p50": float(np.median(probe.step_s) * 1e3),
                "python_us_per_step_p50": float(np.median(outside)),
            }
    print(
        f"ORT {ort.__version__}, {args.threads} threads, context {args.context}, {args.steps} decode steps, "
        f"{doc['date']}\n"
    )
    names = list(doc["models"])
    ops = sorted(
        {op for m in doc["models"].values() for op in m["op_us_per_step"]},
        key=lambda op: -max(m["op_us_per_step"].get(op, 0) for m in doc["models"].values()),
    )
    print("| op type (µs per step, profiled) | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for op in ops[:12]:
        print(f"| {op} | " + " | ".join(f"{doc['models'][n]['op_us_per_step'].get(op, 0):.0f}" for n in names) + " |")
    for label, key, fmt in (
        ("all kernels (µs, profiled)", "kernel_us_per_step", "{:.0f}"),
        ("step p50 (ms, profiler off)", "step_ms_p50", "{:.2f}"),
        ("Python around run p50 (µs)", "python_us_per_step_p50", "{:.0f}"),
    ):
        print(f"| **{label}** | " + " | ".join(fmt.format(doc["models"][n][key]) for n in names) + " |")
    write_json(args.json_out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
