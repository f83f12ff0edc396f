"""Run Olive's OrtSessionParamsTuning on one model with fixed-shape inputs; print its pick as JSON.

Runs inside the Olive venv (.venv-olive), started by benchmarks/bench_olive.py:
    .venv-olive/bin/python benchmarks/olive/run_olive.py MODEL INPUTS.npz OUTDIR CORES
Prints one JSON line: {"settings": <Olive's inference settings>, "wall_s": ..., "points": ...}.
"""

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fill(text, values):
    for key, value in values.items():
        text = text.replace(f'"@{key}@"', json.dumps(value)).replace(f"@{key}@", str(value))
    return text


def main(model, inputs, out, cores):
    from olive.workflows import run as olive_run

    template = (HERE / "session_params_workflow.json").read_text()
    config = json.loads(fill(template, {"MODEL": str(Path(model).resolve()), "INPUTS": str(Path(inputs).resolve()),
                                        "SCRIPT": str(HERE / "fixed_inputs.py"), "OUT": str(Path(out).resolve()),
                                        "CORES": int(cores)}))
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "workflow.json").write_text(json.dumps(config, indent=2))
    start = time.perf_counter()
    output = olive_run(config)
    wall = time.perf_counter() - start
    best = output.get_best_candidate()
    models = output.get_output_models()
    doc = {"wall_s": wall, "points": len(models),
           "settings": best.get_inference_config() if best is not None else None,
           "latency_ms": best.metrics_value if best is not None else None,
           "input_model_metrics": output.get_input_model_metrics() if hasattr(output, "get_input_model_metrics") else None}
    print("OLIVE_RESULT " + json.dumps(doc, default=str), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
