#!/usr/bin/env bash
# The ISA lane: the in-process tests marked `isa` (their answers depend on which INT8 kernel ORT
# runs) once more on an emulated AVX2-only CPU, `qemu-x86_64 -cpu Haswell`, where ORT's u8s8
# kernel saturates as on a real CPU without VNNI. So a VNNI machine checks the AVX2 answers too,
# and an AVX2 machine the emulated one's. Called by .ci/run; runs alone too. Skipped, with a line
# saying so, where qemu-user cannot be had (not x86-64, no qemu-x86_64 and no root apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${ORTPILOT_TEST_VENV:-.venv-test}"
if [ "$(uname -m)" != "x86_64" ]; then
  echo "ISA lane skipped: it emulates an x86-64 CPU, and this machine is $(uname -m)"
  exit 0
fi
if ! command -v qemu-x86_64 >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get install -y -qq qemu-user || { apt-get update -qq && apt-get install -y -qq qemu-user; }; } >/dev/null 2>&1 || true
fi
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
  echo "ISA lane skipped: qemu-x86_64 is not installed (apt-get install qemu-user)"
  exit 0
fi
# The emulated CPU must really take ORT's saturating path, or the lane proves nothing.
qemu-x86_64 -cpu Haswell "$VENV/bin/python" -c '
from ortpilot.providers.cpuisa import probe_int8_kernels
k = probe_int8_kernels()
assert k.u8s8_exact is False, f"the emulated CPU did not saturate: {k}"
print("emulated CPU: ORT u8s8 kernel saturates (AVX2 without VNNI)")' 2> >(grep -v "TCG doesn't support" >&2)
# Collected natively (seconds), run emulated: only the files that hold isa tests are handed to the
# emulated pytest, which would otherwise spend a minute or more importing every test module to deselect them.
FILES="$("$VENV/bin/python" -m pytest -q -p no:cacheprovider -m isa --collect-only "$@" | sed -n 's/::.*//p' | sort -u)"
if [ -z "$FILES" ]; then
  echo "ISA lane: no tests marked isa were collected" >&2
  exit 1
fi
# shellcheck disable=SC2086  # FILES: one test file path a word (tests/ paths have no spaces)
qemu-x86_64 -cpu Haswell "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m isa $FILES "$@" \
  2> >(grep -v "TCG doesn't support" >&2)
