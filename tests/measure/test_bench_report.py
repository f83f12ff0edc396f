"""The HTML report: self-contained, three charts; a headless-Chromium screenshot when available."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ortpilot.measure.bench import bench
from ortpilot.measure.html_report import CHART_IDS, render_html, write_report
from ortpilot.measure.interleave import BenchConfig, bench_interleaved

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _images(page: str) -> dict[str, bytes]:
    return {
        m.group(1): base64.b64decode(m.group(2))
        for m in re.finditer(r'<img id="(\w+)" alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    }


def test_single_report_has_three_embedded_charts(demo_paths, tmp_path) -> None:
    result = bench(str(demo_paths["mlp"]), runs=30, warmup=1)
    path = write_report(tmp_path / "r.html", result)
    page = path.read_text()
    images = _images(page)
    assert set(images) == set(CHART_IDS)
    assert all(img.startswith(PNG_MAGIC) for img in images.values())
    assert "http://" not in page and "https://" not in page and "<script" not in page  # self-contained
    assert "p999 (ms)" in page


def test_comparison_report_has_ratio_table(demo_paths) -> None:
    model = str(demo_paths["mlp"])
    result = bench_interleaved(
        [BenchConfig(model=model), BenchConfig("io", model, iobinding=True)], runs=20, warmup=1, block=5
    )
    page = render_html(result)
    assert set(_images(page)) == set(CHART_IDS)
    assert "io / A" in page and "pooled medians" in page


@pytest.mark.slow
def test_report_renders_in_headless_chromium(demo_paths, tmp_path) -> None:
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    model = str(demo_paths["encoder"])
    result = bench_interleaved([BenchConfig(model=model), BenchConfig(model=model)], runs=100, warmup=2)
    report = write_report(tmp_path / "r.html", result)
    shot = tmp_path / "shot.png"
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "screenshot_report.sh"
    subprocess.run(["bash", str(script), str(shot), str(report)], check=True, timeout=180)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[:2] == (2400, 1200)
    # Charts are drawn: a good share of the page is not white.
    assert (pixels[..., :3].mean(axis=2) < 0.95).mean() > 0.02
