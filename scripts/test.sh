#!/usr/bin/env bash
# Runs the whole test suite through Bazel (after setting up what is missing).
# Extra arguments go to `bazel test`, e.g. scripts/test.sh //tests:test_index
source "$(dirname "$0")/env.sh"
cd "$PIT_ROOT"
if [ $# -eq 0 ]; then set -- //...; fi
exec bazel test "$@"
