#!/usr/bin/env bash
# Render an `ortpilot bench --report` page in headless Chromium and save a screenshot, to check
# that the page opens in a browser with all three charts (histogram, time series, comparison).
#
#   benchmarks/screenshot_report.sh [OUT.png] [REPORT.html]
#
# Without REPORT.html it first writes one: demo encoder, default threads vs one thread, interleaved.
# Needs `chromium` (Debian: apt-get install -y chromium) and the ortpilot venv on PATH.
set -euo pipefail
out="${1:-report.png}"
report="${2:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ -z "$report" ]]; then
  report="$work/report.html"
  ortpilot bench demo:encoder --runs 300 --vs "--threads 1 --name one-thread" --report "$report" >/dev/null
fi
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [[ -z "$browser" ]]; then
  echo "no chromium found: apt-get install -y chromium" >&2
  exit 3
fi
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$work/profile" --screenshot="$out" \
  --window-size=1200,2400 "file://$(realpath "$report")" 2>"$work/chromium.log" \
  || { cat "$work/chromium.log" >&2; exit 1; }
echo "screenshot: $out"
