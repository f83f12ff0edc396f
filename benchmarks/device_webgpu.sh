#!/usr/bin/env bash
# GPU check on a lent machine (no onnxruntime-gpu there; wheels over 64 MiB cannot travel): the
# 7 MB onnxruntime-ep-webgpu plugin EP on Vulkan is the one real GPU provider we can run.
# Needs, carried from the repo root: .whl (onnxruntime 1.32 + onnxruntime-ep-webgpu wheels for
# cp312) and .gl (Vulkan/EGL loader .debs). Writes JSON documents into $OUT.
set -u
OUT="${OUT:-/tmp/ortpilot-device}"; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$ICD" ] && export VK_DRIVER_FILES="$ICD"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH="/tmp/site:$PWD/src" PYTHONUNBUFFERED=1 ORTPILOT_CACHE_DIR=/tmp/ortpilot-cache
op() { timeout "${T:-120}" python3 -m ortpilot.cli.main "$@"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import onnxruntime as o; print(o.__version__, o.__file__)" | tee -a "$OUT/gpu.txt"
op doctor --json > "$OUT/doctor.json"; echo "doctor rc=$?"
op run demo:cnn -p webgpu --policy strict --json > "$OUT/run_cnn.json"; echo "run cnn strict rc=$?"
op run demo:encoder -p webgpu -p cpu --policy warn --json > "$OUT/run_encoder.json"; echo "run encoder rc=$?"
op bench demo:cnn -p webgpu --vs "-p cpu" --shape image=32x3x32x32 --duration 20 --no-samples --json > "$OUT/bench_cnn.json"; echo "bench rc=$?"
for loop in plain bound; do
  op generate demo:decoder -p webgpu -p cpu --prompt-ids 1,2,3,4,5,6,7 --max-new-tokens 64 --loop $loop --json > "$OUT/gen_$loop.json"
  echo "generate $loop rc=$?"
done
ls -la "$OUT"
