"""Does tune's headline hold in the user's own process? Tune, then check the speedup from outside.

For each model and run: ``ortpilot tune`` as a user runs it (the CLI, a child process, the user's data
where the corpus has some), then, each in a fresh process:

- ``user``: what a user writes to check it (issue 38's protocol): ``ortpilot.load_profile(profile)``
  beside a plain ``onnxruntime.InferenceSession(source)``, interleaved, ``--rounds`` rounds of
  ``--runs`` runs each, order alternating, fresh inputs every round, every output fetched;
- ``verify``: ``ortpilot verify OUTDIR --bench --json`` (the figure the tool reproduces itself);
- ``decisions`` (in the ``user`` check, untimed): both sessions on fresh inputs the tune never saw, and how
  many get the same decision from the profile as from ORT's default: Magika's top-1 file type, the
  detector's text boxes, the recognizer's CTC string (``DECISIONS``).

``--factors`` adds one fresh process per factor, each a ``user`` check with one thing changed, to find
why a check from outside comes out lower: ``settled`` (each turn starts with 0.1 s of untimed runs, while
the other session's pool spins down), ``same-inputs`` (the tune's own held-out sample every round),
``alone`` (each session timed in a process of its own, alternately: no second thread pool at all), and
``iobinding`` (the profile's session run through IOBinding, as tune timed it, where the profile says so).

    .venv-test/bin/python benchmarks/bench_outside_check.py [--only minilm,nudenet,ocr-det,ocr-rec,magika,ocr-rec-int8,encoder,cnn]
        [--repeat 2] [--budget 90] [--factors] [--out DIR] [--json OUT.json]

Each row: the tune's headline (and whether it came from its interleaved final measurement), each
check's speedup (median of per-round ratios for ``user``), and reproduced / headline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SETTLE_S = 0.1


def _packaged(package: str, relative: str) -> str:
    sys.path.insert(0, str(Path(__file__).parent))
    from _prep import package_file

    return str(package_file(package, relative) or Path(package) / relative)


def corpus() -> dict[str, dict[str, Any]]:
    """name -> the tune's arguments (model, shapes, data) and how the outside check makes fresh inputs."""
    minilm = ROOT / "benchmarks/models/minilm"
    return {
        "minilm": {
            "args": [str(minilm), "--calibration-text", str(ROOT / "benchmarks/data/sentences.txt")],
            "fresh": "sentences",
        },
        "minilm-emb": {  # the one output a sentence-embedding service returns (--outputs)
            "args": [
                str(minilm),
                "--calibration-text",
                str(ROOT / "benchmarks/data/sentences.txt"),
                "--outputs",
                "sentence_embedding",
            ],
            "fresh": "sentences",
        },
        "nudenet": {"args": [_packaged("nudenet", "320n.onnx"), "--shape", "images=1x3x320x320"]},
        "ocr-det": {
            "args": [_packaged("rapidocr", "models/PP-OCRv6_det_small.onnx"), "--shape", "x=1x3x480x480"],
            "data": "text-pages",
            "fresh": "text-pages",
        },
        "ocr-rec": {
            "args": [_packaged("rapidocr", "models/PP-OCRv6_rec_small.onnx"), "--shape", "x=1x3x48x160"],
            "data": "text-lines",
            "fresh": "text-lines",
        },
        # issue 46's image model with a dynamic dim: the recognizer tuned on lines at their own widths, no --shape
        "ocr-rec-widths": {
            "args": [_packaged("rapidocr", "models/PP-OCRv6_rec_small.onnx")],
            "data": "text-lines-natural",
            "fresh": "text-lines-natural",
        },
        # issue 48's three kinds: a byte-feature file-type classifier (Magika) gated on real files' bytes, a
        # detector (ocr-det above), and a model that ships already INT8 (the recognizer, dynamic INT8)
        "magika": {
            "args": [_packaged("magika", "models/standard_v3_3/model.onnx")],
            "data": "file-bytes",
            "fresh": "file-bytes",
        },
        "ocr-rec-int8": {
            "args": [str(_int8_recognizer()), "--shape", "x=1x3x48x160"],
            "data": "text-lines",
            "fresh": "text-lines",
        },
        "encoder": {"args": ["demo:encoder"]},
        "cnn": {"args": ["demo:cnn"]},
    }


# ---------------------------------------------------------------------------------------------- the checks


WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
]


def text_lines(count: int, seed: int, natural: bool = False) -> list[dict[str, np.ndarray]]:
    """``count`` text-line crops as PP-OCR's recognizer reads them: black words drawn with Pillow on a light,
    slightly noisy background, scaled to [-1, 1]; 48x160, or (``natural``) 48 high and as wide as the line's
    own words need (one to six words: about 40 to 400 pixels), as a detector's crops come."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    font = ImageFont.load_default(size=22)
    out = []
    for _ in range(count):
        words = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 7 if natural else 4))))
        left, top = int(rng.integers(2, 12)), int(rng.integers(6, 16))
        width = 160
        if natural:
            width = max(16, int(font.getlength(words)) + left + int(rng.integers(2, 12)))
        img = Image.new("L", (width, 48), int(rng.integers(200, 256)))
        ImageDraw.Draw(img).text((left, top), words, fill=0, font=font)
        x = np.asarray(img, np.float32) + rng.normal(0, 6, (48, width)).astype(np.float32)
        x = (np.clip(x, 0, 255) / 255.0 - 0.5) / 0.5
        out.append({"x": np.repeat(x[None, None], 3, axis=1).astype(np.float32)})
    return out


def text_pages(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``count`` 480x480 pages as PP-OCR's detector reads them: 3-8 lines of black words at random places and
    sizes on a light, slightly noisy background, normalized with ImageNet's mean and std."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    out = []
    for _ in range(count):
        img = Image.new("RGB", (480, 480), tuple(int(v) for v in rng.integers(190, 256, 3)))
        draw = ImageDraw.Draw(img)
        for _line in range(int(rng.integers(3, 9))):
            font = ImageFont.load_default(size=int(rng.integers(16, 40)))
            words = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 5))))
            draw.text((int(rng.integers(5, 300)), int(rng.integers(5, 440))), words, fill=(0, 0, 0), font=font)
        x = np.asarray(img, np.float32) + rng.normal(0, 6, (480, 480, 3)).astype(np.float32)
        x = (np.clip(x, 0, 255) / 255.0 - mean) / std
        out.append({"x": np.ascontiguousarray(x.transpose(2, 0, 1)[None]).astype(np.float32)})
    return out


def file_bytes(count: int, fresh: bool = False) -> np.ndarray:
    """``count`` rows of Magika's input as its README describes it: the first and last 1,024 bytes of a real
    file on this machine (documentation, Python sources, binaries), short files padded with 256. The tune's
    96 files are spread over the list; ``fresh`` spreads ``count`` others over the files left."""
    roots = [Path("/usr/share/doc"), Path(sys.prefix) / "lib", Path("/usr/bin")]
    files = [f for root in roots if root.is_dir() for f in sorted(root.rglob("*"))[:4000] if f.is_file()]
    tuned = files[:: max(1, len(files) // 96)][:96]
    pool = [f for f in files if f not in set(tuned)] if fresh else files
    rows = []
    for f in pool[:: max(1, len(pool) // count)][:count]:
        data = f.read_bytes()
        head, tail = list(data[:1024]), list(data[-1024:]) if len(data) > 1024 else []
        rows.append(head + [256] * (1024 - len(head)) + [256] * (1024 - len(tail)) + tail)
    return np.array(rows, np.int32)


def write_data(kind: str, folder: Path) -> Path:
    """The user's own samples for a tune: ``--calibration DIR`` (one .npz per sample) or one ``.npz`` whose
    arrays carry a leading sample axis (``file-bytes``: ``bytes`` of shape (96, 2048), as issue 48 gave it)."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind in ("text-lines", "text-lines-natural", "text-pages"):
        samples = {
            "text-lines": lambda: text_lines(64, seed=1),
            "text-lines-natural": lambda: text_lines(200, seed=1, natural=True),
            "text-pages": lambda: text_pages(48, seed=1),
        }[kind]()
        for i, feeds in enumerate(samples):
            np.savez(folder / f"{i:03d}.npz", **feeds)
    if kind == "file-bytes":
        np.savez(folder / "calib.npz", bytes=file_bytes(96))
        return folder / "calib.npz"
    return folder


def _int8_recognizer() -> Path:
    """PP-OCRv6's recognizer as a user may ship it: already INT8 (``quantize_dynamic``), in a temp folder."""
    from onnxruntime.quantization import quantize_dynamic

    out = Path(tempfile.gettempdir()) / "ortpilot-bench-ocr-rec-int8.onnx"
    if not out.is_file():
        quantize_dynamic(_packaged("rapidocr", "models/PP-OCRv6_rec_small.onnx"), str(out))
    return out


def _fresh_inputs(profile: dict[str, Any], source: str, kind: str, count: int) -> list[dict[str, np.ndarray]]:
    """``count`` inputs neither the tune's calibration nor its gate saw, at the tuned shapes."""
    if kind == "text-lines":
        return text_lines(count, seed=99)
    if kind == "text-lines-natural":
        return text_lines(count, seed=99, natural=True)
    if kind == "text-pages":
        return text_pages(count, seed=99)
    if kind == "file-bytes":
        return [{"bytes": row[None]} for row in file_bytes(count, fresh=True)]
    if kind == "sentences":
        from tokenizers import Tokenizer

        folder = Path(source).parent
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        seq = int(profile["shapes"]["input_ids"][1])
        tok.enable_padding(length=seq)
        tok.enable_truncation(max_length=seq)
        lines = [x for x in (ROOT / "benchmarks/data/sentences.txt").read_text().splitlines() if x.strip()]
        texts = [f"{lines[i % len(lines)]} {lines[(7 * i + 3) % len(lines)]}" for i in range(count)]
        return [
            {
                "input_ids": np.array([e.ids], np.int64),
                "attention_mask": np.array([e.attention_mask], np.int64),
                "token_type_ids": np.array([e.type_ids], np.int64),
            }
            for e in tok.encode_batch(texts)
        ]
    from ortpilot.graph.feeds import make_feeds, plan_feeds
    from ortpilot.modelio import load_model

    proto = load_model(source, load_external_data=False)
    plan = plan_feeds(proto, {k: tuple(v) for k, v in profile["shapes"].items()})
    return [make_feeds(proto, plan=plan, seed=30_000 + i) for i in range(count)]


# ---------------------------------------------------------------------------------------------- decisions


def _boxes(prob: np.ndarray, thresh: float = 0.3, min_area: int = 9) -> list[tuple[int, int, int, int]]:
    """The text boxes a DB detector's probability map makes: the bounding boxes of the 4-connected regions over
    PP-OCR's binarization threshold (0.3), regions under ``min_area`` pixels dropped, sorted."""
    mask = prob > thresh
    seen = np.zeros_like(mask)
    boxes = []
    height, width = mask.shape
    for y0, x0 in zip(*np.nonzero(mask), strict=True):
        if seen[y0, x0]:
            continue
        stack, ys, xs = [(y0, x0)], [], []
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            ys.append(y)
            xs.append(x)
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < height and 0 <= nx < width and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        if len(ys) >= min_area:
            boxes.append((min(xs), min(ys), max(xs), max(ys)))
    return sorted(boxes, key=lambda b: (b[1], b[0]))


def _same_boxes(a: list[tuple[int, ...]], b: list[tuple[int, ...]], tolerance: int = 2) -> bool:
    return len(a) == len(b) and all(
        max(abs(p - q) for p, q in zip(x, y, strict=True)) <= tolerance for x, y in zip(a, b, strict=True)
    )


def _ctc(logits: np.ndarray) -> tuple[int, ...]:
    """PP-OCR's recognizer output read as its CTC decoder reads it: best class per step, repeats merged,
    blanks (class 0) dropped."""
    best = logits.reshape(logits.shape[-2], logits.shape[-1]).argmax(-1)
    return tuple(int(c) for i, c in enumerate(best) if c != 0 and (i == 0 or c != best[i - 1]))


# fresh-input kind -> (the decision the model's user makes from its first output, how two decisions agree)
DECISIONS: dict[str, tuple[str, Any, Any]] = {
    "file-bytes": ("top-1 file type", lambda out: int(np.argmax(out)), lambda a, b: a == b),
    "text-lines": ("decoded string", _ctc, lambda a, b: a == b),
    "text-lines-natural": ("decoded string", _ctc, lambda a, b: a == b),
    "text-pages": ("text boxes (2 px)", lambda out: _boxes(out.reshape(out.shape[-2:])), _same_boxes),
}


DECISION_INPUTS = {
    "file-bytes": 400,
    "text-lines": 300,
    "text-lines-natural": 300,
    "text-pages": 100,
}  # fresh inputs for the agreement


def decision_agreement(
    run_mine: Any, run_plain: Any, inputs: list[dict[str, np.ndarray]], fresh: str
) -> dict[str, Any]:
    """How many of ``inputs`` get the same decision from the profile as from ORT's default (untimed)."""
    what, decide, agree = DECISIONS[fresh]
    same = sum(bool(agree(decide(run_mine(f)[0]), decide(run_plain(f)[0]))) for f in inputs)
    return {"what": what, "same": same, "of": len(inputs)}


def _sessions(outdir: Path, iobinding: bool) -> tuple[Any, Any, dict[str, Any]]:
    """(the profile's run function, ORT's default's run function, the profile) as a user makes them."""
    import onnxruntime as ort

    import ortpilot

    profile = json.loads((outdir / "profile.json").read_text())
    mine = ortpilot.load_profile(outdir / "profile.json")
    plain = ort.InferenceSession(profile["source_model"]["path"], providers=["CPUExecutionProvider"])
    if iobinding and profile.get("iobinding"):
        from ortpilot.session.binding import run_session

        def run_mine(feeds: dict[str, Any]) -> Any:
            return run_session(mine, feeds, iobinding=True)
    else:

        def run_mine(feeds: dict[str, Any]) -> Any:
            return mine.run(None, feeds)

    return run_mine, (lambda feeds: plain.run(None, feeds)), profile


def _timed(run: Any, feeds: dict[str, Any], runs: int, settle_s: float) -> list[float]:
    start = time.perf_counter()
    while time.perf_counter() - start < settle_s:
        run(feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - t0)
    return times


def check_in_process(outdir: Path, fresh: str, rounds: int, runs: int, factor: str) -> dict[str, Any]:
    """One ``user`` check (or one factor's variant of it) in this process; per-round medians and their ratio."""
    run_mine, run_plain, profile = _sessions(outdir, iobinding=factor == "iobinding")
    if factor == "same-inputs":
        from ortpilot.tuning.reference import REFERENCE_FILE, read_reference, reference_feeds

        ref = outdir / (profile["reference_outputs"].get("file") or REFERENCE_FILE)
        one = read_reference(ref)[0] if ref.is_file() else reference_feeds(profile)
        inputs = [one] * rounds
    else:
        inputs = _fresh_inputs(profile, profile["source_model"]["path"], fresh, rounds)
    for feeds in inputs[:1]:  # warm-up: both sessions, a few runs
        _timed(run_mine, feeds, 5, 0.0)
        _timed(run_plain, feeds, 5, 0.0)
    settle = SETTLE_S if factor == "settled" else 0.0
    mine_t, plain_t, ratios = [], [], []
    for i, feeds in enumerate(inputs):
        order = [("mine", run_mine), ("plain", run_plain)]
        got: dict[str, list[float]] = {}
        for name, run in order if i % 2 == 0 else order[::-1]:
            got[name] = _timed(run, feeds, runs, settle)
        mine_t += got["mine"]
        plain_t += got["plain"]
        ratios.append(float(np.median(got["plain"]) / np.median(got["mine"])))
    agreement = None
    if factor == "user" and fresh in DECISIONS:
        count = DECISION_INPUTS[fresh]
        agreement = decision_agreement(
            run_mine,
            run_plain,
            _fresh_inputs(profile, profile["source_model"]["path"], fresh, count + rounds)[rounds:],
            fresh,
        )
    return {
        "decisions": agreement,
        "speedup": float(np.median(ratios)),
        "pooled": float(np.median(plain_t) / np.median(mine_t)),
        "p50_ms": {"profile": float(np.median(mine_t)) * 1e3, "default": float(np.median(plain_t)) * 1e3},
        "round_ratios": [round(r, 3) for r in ratios],
    }


def alone_in_process(outdir: Path, fresh: str, which: str, rounds: int, runs: int) -> dict[str, Any]:
    """One session only in this process (``which``: profile or default): its per-round medians."""
    run_mine, run_plain, profile = _sessions(outdir, iobinding=False)
    run = run_mine if which == "profile" else run_plain
    del run_mine, run_plain
    inputs = _fresh_inputs(profile, profile["source_model"]["path"], fresh, rounds)
    _timed(run, inputs[0], 5, 0.0)
    return {"p50_s": [float(np.median(_timed(run, feeds, runs, 0.0))) for feeds in inputs]}


def _child(*args: str) -> dict[str, Any]:
    out = subprocess.run([PY, __file__, *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"check {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_alone(outdir: Path, fresh: str, rounds: int, runs: int) -> dict[str, Any]:
    """Each session in a process of its own, alternately (4 processes each): no second pool in any."""
    prof, base = [], []
    for i in range(4):
        for which in ("profile", "default") if i % 2 == 0 else ("default", "profile"):
            got = _child("alone", str(outdir), fresh, which, str(max(2, rounds // 4)), str(runs))["p50_s"]
            (prof if which == "profile" else base).extend(got)
    return {
        "speedup": float(np.median(base) / np.median(prof)),
        "p50_ms": {"profile": float(np.median(prof)) * 1e3, "default": float(np.median(base)) * 1e3},
    }


def check_verify(outdir: Path) -> dict[str, Any]:
    out = subprocess.run(
        [PY, "-m", "ortpilot.cli.main", "verify", str(outdir), "--bench", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode not in (0, 1):
        raise RuntimeError(f"verify --bench failed ({out.returncode}):\n{out.stderr[-3000:]}")
    doc = json.loads(out.stdout) if out.stdout.strip() else {}
    bench = ((doc.get("profiles") or [{}])[0].get("latency")) or {}
    return {
        "speedup": bench.get("speedup"),
        "ci": bench.get("ci95"),
        "rc": out.returncode,
        # what verify holds itself to: the profile's headline (its verdict: reproduced at 0.9 of it or more)
        "recorded": bench.get("recorded_speedup"),
        "verdict": bench.get("verdict"),
        "state": bench.get("state"),
        # ORT's default here and in the tune's final: a machine in another state changes some speedups
        "default_p50_ms": [bench.get("recorded_default_p50_ms"), bench.get("default_p50_ms")],
    }


def _state(verify: dict[str, Any]) -> str:
    """ORT's default p50 in the tune and in verify: the machine's state in each (it flips on this VM)."""
    tuned, here = verify.get("default_p50_ms") or [None, None]
    return f"; ORT's default p50 {tuned:.3f} ms in the tune, {here:.3f} in verify" if tuned and here else ""


# ---------------------------------------------------------------------------------------------- the driver


def tune(name: str, spec: dict[str, Any], budget: float, outdir: Path) -> dict[str, Any]:
    data = ["--calibration", str(write_data(spec["data"], outdir.parent / f"{name}-data"))] if spec.get("data") else []
    cmd = [PY, "-m", "ortpilot.cli.main", "tune", *spec["args"], *data, "--budget", str(budget), "-o", str(outdir)]
    cmd.append("--json")
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if out.returncode != 0:
        raise RuntimeError(f"tune {name} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    doc = json.loads(out.stdout)
    vs = doc["winner"].get("vs_default") or {}
    return {
        "headline": doc["speedup"]["ratio"] if not doc["default_best"] else 1.0,
        "headline_ci": [doc["speedup"]["ci_low"], doc["speedup"]["ci_high"]],
        "timing": vs.get("timing", "interleaved"),
        "winner": doc["winner"]["label"],
        "default_best": doc["default_best"],
        "wall_s": wall,
        "tune_wall_s": doc["wall_s"],
        "others_cpu": doc.get("others_cpu"),  # other processes' share of the CPU time during the tune
        "by_state": doc["speedup"].get("by_state") or {},  # where the tune saw two machine states
        "passed_over": (doc.get("passed_over") or {}).get("why", ""),
    }


def claimed(row: dict[str, Any], check: dict[str, Any]) -> tuple[float, str]:
    """The figure a check is held to: the headline, as verify --bench holds itself (tuning.reproduction); where
    the tune saw two machine states, the state nearest the check's own (by ORT's default p50 there) is named
    beside it as context."""
    from ortpilot.tuning.machinestates import state_of

    here = (check.get("p50_ms") or {}).get("default")
    if len(row.get("by_state") or {}) == 2 and here:
        return row["headline"], state_of(here, {s: f["default_p50_ms"] for s, f in row["by_state"].items()})
    return row["headline"], ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="minilm,nudenet,ocr-det,ocr-rec,encoder,cnn")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--budget", type=float, default=90)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--factors", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    import onnxruntime as ort

    from ortpilot.providers.machineclass import this_class

    out_root = Path(args.out or tempfile.mkdtemp(prefix="bench-outside-"))
    head = (
        f"ONNX Runtime {ort.__version__}, {datetime.datetime.now().astimezone().isoformat(timespec='minutes')}, "
        f"machine class {this_class().name}, load average at start {os.getloadavg()[0]:.1f}; tune budget "
        f"{args.budget:.0f} s; user check {args.rounds} rounds x {args.runs} runs"
    )
    print(head, flush=True)
    rows = []
    items = corpus()
    for name in args.only.split(","):
        spec = items[name]
        for run in range(1, args.repeat + 1):
            outdir = out_root / f"{name}-{run}"
            row: dict[str, Any] = {"model": name, "run": run, **tune(name, spec, args.budget, outdir)}
            fresh = spec.get("fresh", "generated")
            row["user"] = _child("check", str(outdir), fresh, str(args.rounds), str(args.runs), "user")
            row["verify"] = check_verify(outdir)
            if args.factors:
                for factor in ("settled", "same-inputs", "iobinding"):
                    row[factor] = _child("check", str(outdir), fresh, str(args.rounds), str(args.runs), factor)
                row["alone"] = check_alone(outdir, fresh, args.rounds, args.runs)
            rows.append(row)
            row["verify"]["p50_ms"] = {"default": (row["verify"].get("default_p50_ms") or [None, None])[1]}
            checks = {k: v for k, v in row.items() if isinstance(v, dict) and "speedup" in v}
            cells = []
            for k, v in checks.items():
                held, state = claimed(row, v)
                v["held_to"], v["held_state"] = held, state
                where = f" of {held:.2f}x, ran in the {state} state" if state else ""
                cells.append(
                    f"{k} {v['speedup']:.2f}x ({v['speedup'] / held:.2f}{where})" if v["speedup"] else f"{k} -"
                )
            states = ", ".join(f"{s} {f['speedup']:.2f}x" for s, f in sorted(row["by_state"].items()))
            print(
                f"{name} run {run}: headline {row['headline']:.2f}x ({row['timing']}; {row['winner']}"
                f"{'; by state ' + states if states else ''}), tune wall {row['wall_s']:.0f} s, others_cpu "
                f"{row['others_cpu']}; " + ", ".join(cells) + _state(row["verify"]),
                flush=True,
            )
            agreed = row["user"].get("decisions")
            if agreed:
                print(f"  decisions: {agreed['same']} of {agreed['of']} fresh inputs get the same {agreed['what']}")
            if row["passed_over"]:
                print(f"  passed over: {row['passed_over']}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({"header": head, "rows": rows}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "check":
        _, _, outdir, fresh, rounds, runs, factor = sys.argv
        print(json.dumps(check_in_process(Path(outdir), fresh, int(rounds), int(runs), factor)))
    elif len(sys.argv) > 1 and sys.argv[1] == "alone":
        _, _, outdir, fresh, which, rounds, runs = sys.argv
        print(json.dumps(alone_in_process(Path(outdir), fresh, which, int(rounds), int(runs))))
    else:
        main()
