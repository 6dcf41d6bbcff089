#!/usr/bin/env bash
# Runs ON the GPU machine: every GPU case of the test suite (pytest -k gpu), the test
# files spread over N pytest processes at once (compilation, not the GPU, is what takes
# the time). Needs the modules scripts/build_gpu.sh built, as scripts/gpu_test.sh does.
#   scripts/gpu_sweep.sh [N=7] [LOG_DIR=/tmp/gpu_sweep]
# Prints each process's summary and the failures; exits non-zero if any process failed.
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-7}
LOG=${2:-/tmp/gpu_sweep}
PY=${PYTHON:-python3}
mkdir -p "$LOG"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
# Greedy balance by file size (a rough proxy for the cases a file holds): largest first,
# each to the lightest group so far.
mapfile -t files < <(ls -S tests/test_*.py)
declare -a groups weights
for ((g = 0; g < N; g++)); do groups[g]=""; weights[g]=0; done
for f in "${files[@]}"; do
  best=0
  for ((g = 1; g < N; g++)); do ((weights[g] < weights[best])) && best=$g; done
  groups[best]="${groups[best]} $f"
  weights[best]=$((weights[best] + $(stat -c %s "$f")))
done
pids=()
for ((g = 0; g < N; g++)); do
  [ -z "${groups[g]}" ] && continue
  # -k gpu selects no case in some files: pytest's exit code 5 (nothing collected) is fine
  ( "$PY" -m pytest -q -p no:cacheprovider -k gpu ${groups[g]} >"$LOG/g$g.log" 2>&1; rc=$?
    [ $rc -eq 5 ] && rc=0; echo "rc $rc" >>"$LOG/g$g.log"; exit $rc ) &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
for f in "$LOG"/g*.log; do
  echo "== $f: $(grep -E ' in [0-9.]+s' "$f" | tail -1)"
  grep -E '^(FAILED|ERROR)' "$f" | head -20
done
exit $status
