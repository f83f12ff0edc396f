"""ORT's default vs Olive's session-parameter pick vs ortpilot's pick, interleaved in one process.

Olive (``olive-ai`` 0.13) lives in its own venv, ``.venv-olive`` (it pulls torch):

    python3.11 -m venv .venv-olive
    .venv-olive/bin/pip install "olive-ai==0.13.*" "torch==2.13.0" "onnxruntime==1.32.0" requests psutil tabulate

(``requests``, ``psutil`` and ``tabulate`` are imported by olive-ai 0.13 but not declared.)
Its ``tune-session-params`` CLI cannot set input shapes (it feeds a (1, 1) tensor named
"input"), so each model goes through a JSON workflow (``benchmarks/olive/``) with the
``OrtSessionParamsTuning`` pass, its 32-point sequential search (execution mode 0/1 x
optimization level 0/1/2/99 x intra-op 1/cores x inter-op 1/cores) and a user-script dataset
that serves exactly the feeds ortpilot measures with. Per model this script:

1. runs ``ortpilot.tune`` (``bench_tune.tune_model``), wall time recorded;
2. saves the tuner's held-out sample and runs Olive on it in ``.venv-olive``, wall time
   recorded (fresh Olive cache every time, so nothing is reused);
3. benchmarks ORT's default session, Olive's pick and ortpilot's profile interleaved
   A B C C B A ... in this process, on identical inputs;
4. checks ortpilot's accuracy against ORT's default (``bench_tune.check``).

    .venv/bin/python benchmarks/bench_olive.py [--budget 120] [--duration 20] [--only minilm,nudenet]
        [--turn 0.5] [--json benchmarks/out/olive.json]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_tune
from _prep import tune_bench_parser

from ortpilot.measure.interleave import BenchConfig
from ortpilot.session import SessionSettings
from ortpilot.tuning.space import physical_cores

ROOT = Path(__file__).resolve().parent.parent
OLIVE_PY = ROOT / ".venv-olive" / "bin" / "python"
RUNNER = ROOT / "benchmarks" / "olive" / "run_olive.py"
OLIVE_LEVELS = {0: "disable", 1: "basic", 2: "extended", 99: "all"}


def run_olive(model: Path, feeds: dict[str, np.ndarray], out: Path, timeout_s: float = 1800) -> dict[str, Any]:
    """Olive's OrtSessionParamsTuning on ``model`` with ``feeds``; its pick, wall time and log tail."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    np.savez(out / "inputs.npz", **feeds)
    env = dict(os.environ, OLIVE_DISABLE_TELEMETRY="1")
    start = time.monotonic()
    proc = subprocess.run(
        [str(OLIVE_PY), str(RUNNER), str(model), str(out / "inputs.npz"), str(out), str(physical_cores())],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    wall = time.monotonic() - start
    (out / "olive.log").write_text(proc.stdout + proc.stderr)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("OLIVE_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        return {
            "ok": False,
            "wall_s": wall,
            "error": f"exit {proc.returncode}",
            "log_tail": (proc.stdout + proc.stderr)[-1500:],
        }
    doc = json.loads(line[len("OLIVE_RESULT ") :])
    failed = (proc.stdout + proc.stderr).count("... FAILED")
    return {
        "ok": doc.get("settings") is not None,
        "wall_s": wall,
        "olive_run_s": doc.get("wall_s"),
        "settings": doc.get("settings"),
        "olive_latency": doc.get("latency_ms"),
        "olive_input_latency": doc.get("input_model_metrics"),
        "points_failed": failed,
    }


def olive_config(pick: dict[str, Any], feeds: dict[str, np.ndarray], model: Path) -> tuple[BenchConfig, str]:
    """Olive's inference settings as an ortpilot BenchConfig, and a short label."""
    so = dict(pick.get("session_options") or {})
    settings = SessionSettings(
        level=OLIVE_LEVELS.get(int(so.get("graph_optimization_level", 99)), "all"),
        intra_op_threads=int(so.get("intra_op_num_threads") or 0),
        inter_op_threads=int(so.get("inter_op_num_threads") or 0),
        execution_mode="parallel" if int(so.get("execution_mode") or 0) == 1 else "sequential",
    )
    providers = list(pick.get("execution_provider") or ["CPUExecutionProvider"])
    label = (
        f"{settings.level} · intra={settings.intra_op_threads} · inter={settings.inter_op_threads} · "
        f"{settings.execution_mode}" + (" · iobinding" if pick.get("io_bind") else "")
    )
    return BenchConfig(
        "Olive",
        model=str(model),
        providers=providers,
        settings=settings,
        feeds=feeds,
        iobinding=bool(pick.get("io_bind")),
    ), label


def main() -> None:
    args = tune_bench_parser(__doc__.splitlines()[0]).parse_args()
    if not OLIVE_PY.is_file():
        sys.exit(f"{OLIVE_PY} is missing; create the Olive venv first (see this script's docstring).")
    names = [n for n in bench_tune.CORPUS if not args.only or n in args.only.split(",")]
    out_root = Path(args.out or tempfile.mkdtemp(prefix="bench-olive-"))
    head = bench_tune.header(args)
    rows = []
    for name in names:
        if not bench_tune.available(name):
            print(f"skip {name}: missing", file=sys.stderr)
            continue
        print(f"[{name}] ortpilot tune ...", file=sys.stderr, flush=True)
        tuned = bench_tune.tune_model(name, args.budget, out_root / "ortpilot")
        feeds = bench_tune.timing_feeds(tuned["profile"])
        source = Path(tuned["profile"]["source_model"]["path"])
        print(f"[{name}] Olive ...", file=sys.stderr, flush=True)
        olive = run_olive(source, feeds, out_root / "olive" / name)
        extra, olive_label = [], "-"
        if olive["ok"]:
            cfg, olive_label = olive_config(olive["settings"], feeds, source)
            extra = [cfg]
        print(f"[{name}] interleaved ...", file=sys.stderr, flush=True)
        row = {
            "model": name,
            "config": tuned["config"],
            "default_best": tuned["default_best"],
            "tune_wall_s": tuned["wall_s"],
            "candidates": tuned["candidates"],
            "accuracy": bench_tune.check(name, tuned),
            "olive": {**olive, "label": olive_label},
            "timing": bench_tune.measure(
                bench_tune.configs_for(tuned, feeds, extra), args.duration, bench_tune.block_for(tuned, args.turn)
            ),
        }
        bench_tune.record(rows, row)
    bench_tune.save_rows(args.json, head, rows)
    print(head + "\n")
    print(
        "| model | ORT default p50 ms | ortpilot p50 ms (speedup, 95% CI) | ortpilot config | ortpilot accuracy vs "
        "default | ortpilot wall s | Olive pick p50 ms (speedup, 95% CI) | Olive pick | Olive wall s | "
        "ortpilot / Olive |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = r["timing"]["rows"]
        o = t["ortpilot"]
        v = t.get("Olive")
        olive_cell = bench_tune.timing_cell(v) if v else f"failed: {r['olive'].get('error', '')}"
        vs = f"{v['p50_ms'] / o['p50_ms']:.2f}x" if v else "-"
        print(
            f"| {r['model']} | {t['ORT default']['p50_ms']:.3f} | {bench_tune.timing_cell(o)} | {r['config']} | "
            f"{bench_tune.fmt_accuracy(r['accuracy'])} | {r['tune_wall_s']:.0f} | {olive_cell} | "
            f"{r['olive'].get('label', '-')} | {r['olive']['wall_s']:.0f} | {vs} |"
        )


if __name__ == "__main__":
    main()
