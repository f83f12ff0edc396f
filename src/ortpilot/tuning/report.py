"""report.html (every candidate, a Pareto plot of latency vs error) and report.md (for a PR).

Both are rendered from ``TuneResult.to_dict()``, so they show exactly what the JSON says, and
so does the terminal summary (``cli.cmd_tune``), from the same helpers here: the headline, the
gate line (each output's metric and its evidence) and each candidate's ratio to ORT's default.
The reports also keep the gate-data warning (synthetic inputs, fewer than 16 samples), which the
terminal shows once, when the tune starts. That ratio is only as good as its timings: the finalists and ORT's
default were timed round-robin in one process at the end (``interleaved``, the headline's
figure); every other candidate was timed during the search, a few runs round-robin beside ORT's
default (``search``: the ratio of those side-by-side costs, an estimate a final figure can revise).
Each ratio compares like with like and says which it is.
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

from ortpilot.artifacts.atomic import atomic_write_text


def write_reports(result: Any) -> None:
    doc = result.to_dict()
    atomic_write_text(result.files["report_html"], render_html(doc))
    atomic_write_text(result.files["report_md"], render_md(doc))


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def _err(c: dict[str, Any]) -> str:
    acc = c.get("accuracy") or {}
    worst = acc.get("worst_error")
    if worst is None:
        return "-"
    return "inf" if isinstance(worst, float) and math.isinf(worst) else f"{worst:.2e}"


def _lat(c: dict[str, Any]) -> dict[str, Any]:
    return c.get("latency") or c.get("screen_latency") or {}


def ranked_candidates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A tune document's candidates, those measured fastest first (p50), then the rest in search order."""
    ok = [c for c in doc["candidates"] if c["status"] == "ok" and _lat(c)]
    rest = [c for c in doc["candidates"] if c not in ok]
    return sorted(ok, key=lambda c: _lat(c).get("p50_ms", math.inf)) + rest


def table_rows(doc: dict[str, Any], count: int = 6) -> list[dict[str, Any]]:
    """The terminal table's rows: the fastest passing candidates, always with the profile's winner and ORT's
    default among them (the two the headline compares), in ranked order."""
    ok = [c for c in ranked_candidates(doc) if c["status"] == "ok"]
    must = {doc["winner"]["id"], doc["baseline"]["id"]}
    others = [c for c in ok if c["id"] not in must][: max(0, count - len(must))]
    keep = must | {c["id"] for c in others}
    return [c for c in ok if c["id"] in keep]


def int8_lines(doc: dict[str, Any]) -> list[str]:
    """Which INT8 rule this CPU got, and why each INT8 variant is in the space (empty when quantization was off)."""
    rule = doc["facts"].get("int8_rule")
    if not rule:
        return []
    lines = [f"INT8 rule for this CPU: {rule['name']} ({rule['reason']})."]
    lines += [f"- {label}: {reason}" for label, reason in (doc["facts"].get("int8_variants") or {}).items()]
    return lines


def load_line(doc: dict[str, Any]) -> str:
    return f"Note: {doc['load_note']}." if doc.get("load_note") else ""


def headline(doc: dict[str, Any]) -> str:
    from ortpilot.data import gate_phrase

    sp = doc["speedup"]
    data = doc.get("gate_data") or {}
    gated = gate_phrase(data) if data.get("source") != "synthetic" else ""  # synthetic: gate_warning says so
    gated = f" {gated[0].upper()}{gated[1:]}." if gated else ""
    if doc["default_best"]:
        return f"ORT's default session was already best: {doc['default_best_reason']}.{gated}"
    timing = (
        "interleaved final measurement"
        if (doc["winner"].get("vs_default") or {}).get("timing", "interleaved") == "interleaved"
        else "search-phase estimate, not interleaved"
    )
    return (
        f"Winner: {doc['winner']['label']} — {sp['ratio']:.2f}x {reference_name(doc['baseline'])} on {doc['objective']} "
        f"(95% CI {sp['ci_low']:.2f}-{sp['ci_high']:.2f}; {timing}).{gated}"
    )


def provider_line(doc: dict[str, Any]) -> str:
    """Which EP won and by how much, beside the best passing candidate on each other EP ('' when the
    search tried one EP): ``OpenVINO won: 4.36x ORT's default; best on CPU: int8-dynamic-w-pc ~1.82x est.``"""
    best: dict[str, dict[str, Any]] = {}
    for c in ranked_candidates(doc):
        first = ((c.get("providers") or [{}])[0]).get("name", "CPUExecutionProvider")
        if c["status"] == "ok" and (c.get("vs_default") or {}).get("ratio") and first not in best:
            best[first] = c
    if len(best) < 2 or doc["default_best"]:
        return ""
    won = ((doc["winner"].get("providers") or [{}])[0]).get("name", "CPUExecutionProvider")
    others = [f"best on {_ep_words(ep)}: {c['label']} {ratio_cell(c)}" for ep, c in best.items() if ep != won]
    return (
        f"{_ep_words(won)[0].upper()}{_ep_words(won)[1:]} won: {doc['speedup']['ratio']:.2f}x {reference_name(doc['baseline'])}; "
        + "; ".join(others)
        + "."
    )


def _ep_words(name: str) -> str:
    return "the CPU EP" if name == "CPUExecutionProvider" else name.removesuffix("ExecutionProvider")


def reference_name(base: dict[str, Any]) -> str:
    """What a tune's speedups are quoted against, from its baseline candidate's dict: ORT's default, or that
    session capped at the CPU budget where the default's pool would take CPUs outside it (``Search._reference``)."""
    if base.get("baseline", True):
        return "ORT's default"
    return f"ORT's default capped at {(base.get('settings') or {}).get('intra_op_threads')} thread(s)"


def vs_default(baseline: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """A candidate's p50 ratio to ORT's default, like with like: both from the interleaved final
    measurement when both took part in it, else both from their search-phase benches beside the
    search's anchor (ORT's default; ``paired_cost``), or, without those, their search-phase timings."""
    both_final = c.get("timing") == "interleaved" and baseline.get("timing") == "interleaved"
    if not both_final and c.get("paired_cost") and baseline.get("paired_cost"):
        # both timed beside the search's anchor (ORT's default): the ratio of those side-by-side costs
        return {"ratio": baseline["paired_cost"] / c["paired_cost"], "timing": "search"}
    key = "latency" if both_final else "screen_latency"
    base, mine = (baseline.get(key) or {}).get("p50_ms"), (c.get(key) or {}).get("p50_ms")
    ratio = base / mine if base and mine else None
    return {"ratio": ratio, "timing": "interleaved" if both_final else "search"}


def ratio_cell(c: dict[str, Any]) -> str:
    """``1.13x`` for an interleaved ratio, ``~1.35x est.`` for a search-phase one, ``-`` for none."""
    vs = c.get("vs_default") or {}
    if vs.get("ratio") is None:
        return "-"
    return f"{vs['ratio']:.2f}x" if vs.get("timing") == "interleaved" else f"~{vs['ratio']:.2f}x est."


RATIO_NOTE = (
    "p50 vs default: 'N.NNx' comes from the final interleaved measurement of the finalists and ORT's default "
    "(the headline's source); '~N.NNx est.' is a search-phase estimate, from screening and halving runs each "
    "timed round-robin beside ORT's default (few runs, so a final measurement can revise it)."
)


def gate_line(doc: dict[str, Any]) -> str:
    """Each output's metric, and the evidence it was chosen on, and the limit."""
    evidence = doc.get("metric_evidence") or {}
    return (
        "Accuracy gate per output: "
        + "; ".join(f"{n}: {m}" + (f" ({evidence[n]})" if evidence.get(n) else "") for n, m in doc["metrics"].items())
        + f"; max error {doc['max_error']:g}."
        + (
            " Only the outputs the deployment reads (--outputs): the model was pruned to them."
            if doc.get("outputs")
            else ""
        )
    )


def gate_warning_line(doc: dict[str, Any]) -> str:
    return f"Warning: the accuracy gate was {doc['gate_warning']}." if doc.get("gate_warning") else ""


def data_line(doc: dict[str, Any]) -> str:
    """Where the gate's held-out samples and the calibration samples came from (``gate_data``, ``calibration_data``)."""

    def one(d: dict[str, Any] | None) -> str:
        if not d:
            return "-"
        total = f" of {d['total']}" if d.get("total") is not None else ""
        where = f" from {d['path']}" if d.get("path") else ""
        digest = f" (sha256 {d['sha256'][:12]})" if d.get("sha256") else ""
        return f"{d['samples']}{total} {d['source']} samples{where}{digest}"

    return f"Gate data: {one(doc.get('gate_data'))}; calibration data: {one(doc.get('calibration_data'))}."


def render_md(doc: dict[str, Any]) -> str:
    lines = [
        f"# ortpilot tune: {doc['model']}",
        "",
        headline(doc),
        "",
        *([providers, ""] if (providers := provider_line(doc)) else []),
        *([load_line(doc), ""] if doc.get("load_note") else []),
        f"ONNX Runtime {doc['onnxruntime']}, shapes "
        + ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in doc["shapes"].items())
        + f", objective {doc['objective']}, tune wall time {doc['wall_s']:.0f} s.",
        "",
        gate_line(doc) + " Outputs compared with ORT's default session's on held-out inputs.",
        "",
        data_line(doc),
        "",
        *([gate_warning_line(doc), ""] if doc.get("gate_warning") else []),
        "| candidate | status | p50 ms | p99 ms | p50 95% CI | p50 vs default | error | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in ranked_candidates(doc):
        lat = _lat(c)
        ci = lat.get("median_ci95_ms")
        lines.append(
            f"| {c['label']} | {c['status']} | {_ms(lat.get('p50_ms'))} | {_ms(lat.get('p99_ms'))} | "
            f"{'-' if not ci else f'{ci[0]:.3f}-{ci[1]:.3f}'} | {ratio_cell(c)} | {_err(c)} | "
            f"{c['reason'].replace('|', '/')} |"
        )
    int8 = int8_lines(doc)
    if int8:
        lines += ["", int8[0], "", *int8[1:]]
    excluded = doc["facts"].get("excluded") or []
    if excluded:
        lines += ["", "Not tried:", ""] + [f"- {e['what']}: {e['reason']}" for e in excluded]
    lines += [
        "",
        f"Latencies of the finalists and {reference_name(doc['baseline'])} come from their interleaved final "
        "measurement; the others from their screening and halving runs.",
        "",
        RATIO_NOTE,
    ]
    return "\n".join(lines) + "\n"


def pareto_png(doc: dict[str, Any]) -> str:
    """Latency vs error scatter with the Pareto front, as a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = []
    for c in doc["candidates"]:
        lat = _lat(c)
        acc = c.get("accuracy") or {}
        if lat.get("p50_ms") is None or acc.get("worst_error") is None or math.isinf(acc["worst_error"]):
            continue
        points.append((lat["p50_ms"], max(acc["worst_error"], 1e-9), c["status"] == "ok", c["label"]))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for ok, color, name in ((True, "tab:blue", "passed gate"), (False, "tab:red", "rejected")):
        xs = [p[0] for p in points if p[2] == ok]
        ys = [p[1] for p in points if p[2] == ok]
        if xs:
            ax.scatter(xs, ys, c=color, label=name, s=22)
    front, best = [], math.inf
    for p in sorted(points):
        if p[1] < best:
            front.append(p)
            best = p[1]
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=0.8, label="Pareto front")
    ax.axhline(doc["max_error"], color="gray", lw=0.8, ls=":", label="max error")
    ax.set_yscale("log")
    ax.set_xlabel("p50 latency (ms)")
    ax.set_ylabel("worst output error")
    ax.legend(fontsize=8)
    ax.set_title("latency vs error")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def render_html(doc: dict[str, Any]) -> str:
    e = html.escape
    rows = []
    for c in ranked_candidates(doc):
        lat = _lat(c)
        ci = lat.get("median_ci95_ms")
        acc = c.get("accuracy") or {}
        per_out = "; ".join(f"{o['name']}: {o['metric']} {o['error']:.2e}" for o in acc.get("outputs", []))
        cls = "win" if c["id"] == doc["winner"]["id"] else ("" if c["status"] == "ok" else "rej")
        rows.append(
            f"<tr class='{cls}'><td>{e(c['label'])}</td><td>{e(c['phase'])}</td><td>{e(c['status'])}</td>"
            f"<td>{_ms(lat.get('p50_ms'))}</td><td>{_ms(lat.get('p99_ms'))}</td>"
            f"<td>{'-' if not ci else f'{ci[0]:.3f} – {ci[1]:.3f}'}</td><td>{lat.get('count', '-')}</td>"
            f"<td>{e(ratio_cell(c))}</td>"
            f"<td>{e(per_out) or '-'}</td><td>{e(c['reason'])}</td><td><code>{c['id']}</code></td></tr>"
        )
    excluded = "".join(f"<li>{e(x['what'])}: {e(x['reason'])}</li>" for x in doc["facts"].get("excluded") or [])
    int8 = int8_lines(doc)
    int8_html = (
        (
            f"<h2>INT8 variants</h2><p>{e(int8[0])}</p><ul>"
            + "".join(f"<li>{e(line[2:])}</li>" for line in int8[1:])
            + "</ul>"
        )
        if int8
        else ""
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>ortpilot tune report</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}tr.win{{background:#dfd}}tr.rej{{color:#888}}</style></head><body>
<h1>ortpilot tune: {e(doc["model"])}</h1>
<p><b>{e(headline(doc))}</b></p>
{f"<p>{e(providers)}</p>" if (providers := provider_line(doc)) else ""}
{f"<p>{e(load_line(doc))}</p>" if doc.get("load_note") else ""}
<p>ONNX Runtime {e(doc["onnxruntime"])}; shapes {e(str(doc["shapes"]))}; objective {e(doc["objective"])};
tune wall time {doc["wall_s"]:.1f} s.</p>
<p>{e(gate_line(doc))}</p>
<p>{e(data_line(doc))}</p>
{f"<p><b>{e(gate_warning_line(doc))}</b></p>" if doc.get("gate_warning") else ""}
<img alt="Pareto plot of latency vs error" src="data:image/png;base64,{pareto_png(doc)}">
<h2>Candidates</h2>
<table><tr><th>candidate</th><th>phase</th><th>status</th><th>p50 ms</th><th>p99 ms</th><th>p50 95% CI</th><th>runs</th>
<th>p50 vs default</th>
<th>accuracy (per output)</th><th>why rejected / note</th><th>id</th></tr>
{"".join(rows)}</table>
{int8_html}
<h2>Not tried</h2><ul>{excluded or "<li>nothing ruled out</li>"}</ul>
<p>The finalists' and ORT's default latencies come from their interleaved final measurement; other rows from screening
and successive-halving runs.</p><p>{e(RATIO_NOTE)}</p></body></html>
"""
