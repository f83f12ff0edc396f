#!/usr/bin/env bash
# The OpenVINO plugin lane: stock onnxruntime with the onnxruntime-ep-openvino plugin EP and NNCF
# (the `openvino-plugin` extra) in their own virtual environment, then the tests marked
# `openvino_plugin`. Kept out of the main run's venv: with the plugin installed, every tune on an
# Intel CPU also searches OpenVINO. The plugin lists a device on Intel CPUs only; elsewhere the
# tests skip, naming why. Called by .ci/run after the OpenVINO lane; runs alone too.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
VENV="${ORTPILOT_OPENVINO_PLUGIN_VENV:-.venv-ovplugin}"

# ORTPILOT_LANE_PHASE=setup makes the venv and checks it; =test runs the tests in the venv setup made;
# unset: both. (.ci/run does the two apart: it makes the venvs while the ISA lane runs.)
PHASE="${ORTPILOT_LANE_PHASE:-all}"
if [ "$PHASE" != test ] || [ ! -x "$VENV/bin/python" ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip install -q -e ".[cpu,serve,export,openvino-plugin]" pytest hypothesis
  "$VENV/bin/python" -m pip install -q --no-deps silero-vad
fi

# Fail early and clearly if the environment is not what the lane claims to test.
"$VENV/bin/python" - <<'PY'
import onnxruntime as ort
from ortpilot.providers.ortdists import find_ort_distributions
from ortpilot.providers.plugins import compute_providers, plugin_for_ep

names = [d.name for d in find_ort_distributions().distributions]
assert names == ["onnxruntime"], f"expected only stock onnxruntime, found {names}"
plugin = plugin_for_ep("OpenVINOExecutionProvider")
assert plugin is not None and not plugin.error, plugin
print(f"onnxruntime {ort.__version__} + {plugin.distribution} {plugin.version}: {compute_providers()}")
PY
if [ "$PHASE" = setup ]; then exit 0; fi

set +e
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs -m openvino_plugin tests/openvino_plugin "$@"
rc=$?
set -e
# Every test skips on a CPU the plugin lists no device for: pytest's 'no tests ran' is not a failure there.
if [ "$rc" -eq 5 ]; then rc=0; fi
exit "$rc"
