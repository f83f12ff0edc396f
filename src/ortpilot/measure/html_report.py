"""A self-contained HTML page for a benchmark: one file to attach to an issue or a PR.

Three charts (matplotlib, Agg backend, PNGs embedded as base64, no scripts or external files):
the latency histogram, the per-run time series (drift and warm-up tails show here), and the
comparison of medians with their 95% CIs (with the ratio to the baseline when there are several).
"""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.artifacts.atomic import atomic_write_text

CHART_IDS = ("histogram", "timeseries", "comparison")


def _results(result: Any) -> list[Any]:
    return list(result.results) if hasattr(result, "results") else [result]


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def histogram_png(results: list[Any]) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    data = [np.asarray(r.samples_s) * 1e3 for r in results if r.samples_s]
    if data:
        hi = max(float(np.percentile(d, 99.5)) for d in data)
        lo = min(float(d.min()) for d in data)
        bins = np.linspace(lo, hi if hi > lo else lo + 1e-3, 60)
        for r, d in zip([r for r in results if r.samples_s], data):
            ax.hist(np.clip(d, lo, hi), bins=bins, alpha=0.55, label=f"{r.name or 'run'} (p50 {np.median(d):.3f} ms)")
            ax.axvline(float(np.median(d)), linestyle="--", linewidth=1, color="black")
        ax.legend()
    ax.set_xlabel("latency (ms), runs above p99.5 clipped into the last bin")
    ax.set_ylabel("runs")
    ax.set_title("Latency histogram")
    return _png(fig)


def timeseries_png(results: list[Any]) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for r in results:
        if r.samples_s:
            ax.plot(r.offsets_s, np.asarray(r.samples_s) * 1e3, ".", markersize=2, alpha=0.6, label=r.name or "run")
    if any(r.samples_s for r in results):
        ax.legend(markerscale=4)
        top = max(float(np.percentile(np.asarray(r.samples_s) * 1e3, 99.5)) for r in results if r.samples_s)
        ax.set_ylim(0, top * 1.1)
    ax.set_xlabel("time since the first timed run (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Per-run latency over time")
    return _png(fig)


def comparison_png(result: Any) -> str:
    import matplotlib.pyplot as plt

    results = [r for r in _results(result) if r.stats]
    ratios = list(getattr(result, "ratios", []))
    fig, axes = plt.subplots(1, 2 if ratios else 1, figsize=(9, 4), squeeze=False)
    ax = axes[0][0]
    names = [r.name for r in results]
    meds = np.array([r.stats.p50 for r in results]) * 1e3
    lo = meds - np.array([r.stats.median_ci[0] for r in results]) * 1e3
    hi = np.array([r.stats.median_ci[1] for r in results]) * 1e3 - meds
    ax.bar(names, meds, yerr=[lo, hi], capsize=6, color="#4c72b0")
    p99 = np.array([r.stats.p99 for r in results]) * 1e3
    ax.plot(names, p99, "v", color="#c44e52", label="p99")
    ax.legend()
    ax.set_ylabel("median latency (ms), 95% CI")
    ax.set_title("Medians")
    if ratios:
        rx = axes[0][1]
        labels = [f"{q.config}/{q.baseline}" for q in ratios]
        pos = np.arange(len(ratios))
        for offset, fmt, label, get in (
            (-0.1, "o", "ratio (paired A B B A)", lambda q: (q.ratio, q.ci_low, q.ci_high)),
            (0.1, "s", "pooled medians", lambda q: (q.pooled, q.pooled_low, q.pooled_high)),
        ):
            v, lo_, hi_ = (np.array(col) for col in zip(*[get(q) for q in ratios]))
            rx.errorbar(v, pos + offset, xerr=[v - lo_, hi_ - v], fmt=fmt, capsize=5, label=label)
        rx.set_yticks(pos, labels)
        rx.set_ylim(-0.6, len(ratios) - 0.4)
        rx.legend(fontsize="small")
        rx.axvline(1.0, color="black", linewidth=1)
        rx.set_xlabel("ratio of medians (< 1 faster), 95% CI")
        rx.set_title("Against the baseline")
    return _png(fig)


def render_html(result: Any) -> str:
    """The whole page as a string (no external resources)."""
    import matplotlib

    matplotlib.use("Agg")
    results = _results(result)
    charts = {
        "histogram": histogram_png(results),
        "timeseries": timeseries_png(results),
        "comparison": comparison_png(result),
    }
    titles = {"histogram": "Latency histogram", "timeseries": "Per-run time series", "comparison": "Comparison"}
    first = results[0]
    env = first.environment
    head = (
        f"{html.escape(str(first.model))} on {html.escape(', '.join(first.providers))}; "
        f"ONNX Runtime {html.escape(str(env.get('onnxruntime')))}; CPU {html.escape(str(env.get('cpu')))} "
        f"({env.get('cpus_available')} cores); {html.escape(str(env.get('timestamp')))}"
    )
    rows = _stats_rows(results)
    ratio_rows = "".join(
        f"<tr><td>{html.escape(q.config)} / {html.escape(q.baseline)}</td><td>{q.ratio:.4f}</td>"
        f"<td>{q.ci_low:.4f} – {q.ci_high:.4f}</td><td>{q.pooled:.4f} ({q.pooled_low:.4f} – {q.pooled_high:.4f})</td>"
        f"<td>{html.escape(q.verdict)}</td></tr>"
        for q in getattr(result, "ratios", [])
    )
    ratio_table = (
        (
            "<h2>Ratios of medians</h2><table><tr><th>configs</th><th>ratio</th><th>95% CI</th>"
            f"<th>pooled medians (95% CI)</th><th>verdict</th></tr>{ratio_rows}</table>"
        )
        if ratio_rows
        else ""
    )
    figures = "".join(
        f'<h2>{titles[k]}</h2><img id="{k}" alt="{titles[k]}" src="data:image/png;base64,{v}">'
        for k, v in charts.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ortpilot bench</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:1em auto;}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}td:first-child{{text-align:left}}
img{{max-width:100%;display:block;margin-bottom:1em}}</style></head>
<body><h1>ortpilot bench</h1><p>{head}</p>
<table><tr><th></th>{"".join(f"<th>{html.escape(r.name)}</th>" for r in results)}</tr>{rows}</table>
{ratio_table}{figures}</body></html>
"""


def _stats_rows(results: list[Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.3f}"

    spec = [
        ("runs", lambda r: str(len(r.samples_s))),
        ("warm-up runs", lambda r: str(r.warmup.runs)),
        ("session create (ms)", lambda r: ms(r.session_create_s)),
        ("first run (ms)", lambda r: ms(r.first_run_s)),
    ]
    for key in ("min", "mean", "p50", "p90", "p95", "p99", "p999", "max", "std"):
        spec.append((f"{key} (ms)", lambda r, k=key: ms(getattr(r.stats, k)) if r.stats else "-"))
    spec += [
        ("inferences/s", lambda r: f"{r.stats.inferences_per_s:.1f}" if r.stats else "-"),
        ("items/s", lambda r: f"{r.stats.items_per_s:.1f}" if r.stats else "-"),
        ("peak RSS (MiB)", lambda r: "-" if r.memory.peak_mb is None else f"{r.memory.peak_mb:.0f}"),
        ("noisy", lambda r: ("yes" if r.stats.noisy else "no") if r.stats else "-"),
    ]
    return "".join(
        f"<tr><td>{label}</td>{''.join(f'<td>{html.escape(f(r))}</td>' for r in results)}</tr>" for label, f in spec
    )


def write_report(path: str | os.PathLike, result: Any) -> Path:
    """Write the report for a ``BenchResult`` or ``ComparisonResult`` (atomically)."""
    return atomic_write_text(path, render_html(result))
