#!/usr/bin/env bash
# Runs ON the GPU machine (no Bazel there): the test suite with the modules that
# scripts/build_gpu.sh built and the device tool carried into pit_jax/.
#   scripts/gpu_test.sh [pytest args]              all tests, CPU and GPU cases
#   scripts/gpu_test.sh --sanitize TOOL [args]     the GPU cases under compute-sanitizer
#                                                  (TOOL: memcheck, racecheck, ...; a -k EXPR
#                                                  selects among them: gpu and (EXPR))
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ "${1:-}" = "--sanitize" ]; then
  tool=$2
  shift 2
  # XLA must not grab most of the GPU up front under the sanitizer; check our kernels
  # only (their names are in namespace pit), the library ones are not ours to fix.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  # A -k EXPR of the caller narrows the GPU cases (pytest keeps only the last -k).
  args=() paths=() expr=gpu
  while [ $# -gt 0 ]; do
    case $1 in
      -k) expr="gpu and ($2)"; shift 2; continue ;;
      tests*) paths+=(x) ;;
    esac
    args+=("$1")
    shift
  done
  [ ${#paths[@]} -eq 0 ] && args=(tests "${args[@]}")
  # application-only: the child Python processes some tests start (hang checks) go
  # unchecked; following them, pytest under memcheck died at times with no error report.
  # initcheck instruments every kernel: with the filter, memory that XLA's (uninstrumented)
  # kernels wrote looks unwritten, and every read of it by ours is reported (a pit_jax.index
  # of an XLA-computed mask: 12276 false reports, 0 without the filter; H200, 2026-11-28).
  filter=(--kernel-name kns=pit)
  [ "$tool" = initcheck ] && filter=()
  # racecheck: XLA's autotuner profiles Triton GEMM candidates (the dense route's dots)
  # and, under racecheck, one of them raised a hardware exception the sanitizer could not
  # handle ("Internal Sanitizer Error", then CUDA_ERROR_ILLEGAL_ADDRESS in every later
  # call; H200, 2026-11-29). Those are not our kernels: take XLA's default configs instead.
  [ "$tool" = racecheck ] && export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0"
  exec compute-sanitizer --tool "$tool" "${filter[@]}" --error-exitcode 9 \
    --target-processes application-only \
    "$PY" -m pytest -q -p no:cacheprovider -k "$expr" "${args[@]}"
fi
paths=()
for a in "$@"; do case $a in tests*) paths+=(x) ;; esac; done
[ ${#paths[@]} -eq 0 ] && set -- tests "$@"
exec "$PY" -m pytest -q -p no:cacheprovider -rs "$@"
