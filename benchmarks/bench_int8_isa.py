"""What each INT8 weight format costs in accuracy on this CPU's INT8 kernel: MiniLM on real sentences.

The same dynamic-INT8 variants of MiniLM (8-bit u8s8 weights, 7-bit weights with ``reduce_range``,
U8U8 weights; per channel, all weights or weights only) are run on real sentences and compared with
the float model (sentence-embedding and hidden-state cosine, the tune gate's metrics). Accuracy,
unlike speed, can be measured on an emulated CPU: run it natively, then under
``qemu-x86_64 -cpu Haswell``, where ORT takes its AVX2 kernels (u8s8 saturating, as on a CPU
without VNNI). The INT8 rule ortpilot measured is printed with the table.

    .venv/bin/python benchmarks/bench_int8_isa.py [--json OUT.json]
    qemu-x86_64 -cpu Haswell .venv/bin/python benchmarks/bench_int8_isa.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import datetime
import sys

import onnxruntime as ort
from _prep import write_json
from bench_tune import MINILM_DIR, check_samples

from ortpilot.measure.compare import metric_error
from ortpilot.passes.quantize import QuantizePass
from ortpilot.providers.cpuisa import int8_rule, probe_int8_kernels
from ortpilot.providers.machine import describe_machine, machine_facts
from ortpilot.session import load

VARIANTS = {  # label -> QuantizePass options (dynamic, as tune's space names them)
    "int8-dynamic-w-pc": {"per_channel": True, "op_types": ["MatMul", "Gemm", "Conv", "Attention"]},
    "int8-dynamic-w-pc-rr": {
        "per_channel": True,
        "reduce_range": True,
        "op_types": ["MatMul", "Gemm", "Conv", "Attention"],
    },
    "int8-dynamic-w-pc-u8u8": {
        "per_channel": True,
        "weight_type": "quint8",
        "op_types": ["MatMul", "Gemm", "Conv", "Attention"],
    },
    "int8-dynamic-pc": {"per_channel": True},
    "int8-dynamic-pc-rr": {"per_channel": True, "reduce_range": True},
    "int8-dynamic": {},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = ap.parse_args()
    source = MINILM_DIR / "model.onnx"
    if not source.is_file():
        print(f"MiniLM is missing at {source}: run benchmarks/prep_minilm.py first (benchmarks/README.md).")
        return 2
    samples, what = check_samples("minilm", source, {"input_ids": (1, 128)})
    reference = load(str(source))
    names = [o.name for o in reference.get_outputs()]
    ref = [reference.run(None, s) for s in samples]
    rows = []
    for label, options in VARIANTS.items():
        quantized = load(QuantizePass("dynamic", **options).run(source).model.SerializeToString())
        got = [quantized.run(None, s) for s in samples]
        cosines = {
            name: 1 - metric_error("cosine", [r[i] for r in ref], [g[i] for g in got]) for i, name in enumerate(names)
        }
        rows.append({"variant": label, **{f"{n}_cosine": c for n, c in cosines.items()}})
    rule = int8_rule()
    machine = machine_facts()
    print(
        f"ONNX Runtime {ort.__version__}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M+00:00}; "
        f"CPU as ORT's kernel sees it: INT8 rule {rule.name} (u8s8 exact: {probe_int8_kernels().u8s8_exact}); "
        f"flags: {describe_machine(machine)}; inputs: {what}\n"
    )
    print("| variant | " + " | ".join(f"{n} cosine" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for row in rows:
        print(f"| {row['variant']} | " + " | ".join(f"{row[f'{n}_cosine']:.4f}" for n in names) + " |")
    write_json(
        args.json,
        {"onnxruntime": ort.__version__, "int8_rule": rule.to_dict(), "machine": machine, "inputs": what, "rows": rows},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
