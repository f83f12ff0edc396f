#!/usr/bin/env bash
# The OpenVINO lane: onnxruntime-openvino in its own virtual environment (it installs the same
# `onnxruntime` import package as onnxruntime, so the two must never share an environment),
# then the tests marked `openvino`. Called by .ci/run after the main test run; runs alone too.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
VENV="${ORTPILOT_OPENVINO_VENV:-.venv-openvino}"
# 1.24.1 is the newest onnxruntime-openvino on PyPI when this lane was written; it reads models
# up to IR 13 (ortpilot writes IR 10, modelio.SAFE_IR_VERSION).
ORT_OPENVINO="${ORT_OPENVINO_VERSION:-1.24.1}"

# ORTPILOT_LANE_PHASE=setup makes the venv and checks it; =test runs the tests in the venv setup made;
# unset: both. (.ci/run does the two apart: it makes the venvs while the ISA lane runs.)
PHASE="${ORTPILOT_LANE_PHASE:-all}"
if [ "$PHASE" != test ] || [ ! -x "$VENV/bin/python" ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # No [cpu] extra: the CPU onnxruntime would overwrite the OpenVINO build's files.
  "$VENV/bin/python" -m pip install -q "onnxruntime-openvino==$ORT_OPENVINO" -e ".[export]" pytest hypothesis
  "$VENV/bin/python" -m pip install -q --no-deps silero-vad rapidocr nudenet
fi

# Fail early and clearly if the environment is not what the lane claims to test.
"$VENV/bin/python" - <<'PY'
import onnxruntime as ort
from ortpilot.providers.ortdists import find_ort_distributions

dists = find_ort_distributions()
names = [d.name for d in dists.distributions]
assert names == ["onnxruntime-openvino"], f"expected only onnxruntime-openvino, found {names}"
assert "OpenVINOExecutionProvider" in ort.get_available_providers(), ort.get_available_providers()
print(f"onnxruntime-openvino {ort.__version__}: {ort.get_available_providers()}")
PY
if [ "$PHASE" = setup ]; then exit 0; fi

"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m openvino tests/openvino_dist "$@"
