#!/usr/bin/env bash
# Builds HERE what the GPU machine needs: pit_jax's modules (_pit_cpu, _pit_cuda) for its
# Python (3.12 by default), into pit_jax/ (git-ignored), and prints the paths to carry.
# The GPU machine has no Bazel, no network: build here, carry the .so files, then run
# scripts/gpu_test.sh there. See docs/gpu.md.
#   PIT_GPU_PYTHON_VERSION=3.12   the GPU machine's Python (pyenv must have it here)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PIT_JAX_HOME=${PIT_JAX_HOME:-$HOME/.cache/pit_jax}
VER=${PIT_GPU_PYTHON_VERSION:-3.12}
BASE=${PIT_GPU_PYTHON:-}
if [ -z "$BASE" ]; then
  BASE=$( (pyenv prefix "$VER" 2>/dev/null || true) | head -1)/bin/python3
  [ -x "$BASE" ] || BASE=$(ls -d "$HOME"/.pyenv/versions/"$VER"*/bin/python3 2>/dev/null | tail -1)
  [ -x "$BASE" ] || BASE=$(command -v "python$VER" || true)
fi
[ -x "$BASE" ] || { echo "no Python $VER found here (pyenv install $VER, or set PIT_GPU_PYTHON)" >&2; exit 1; }

VENV=$PIT_JAX_HOME/venv-py$VER-build
stamp=$VENV/.requirements.sha256
want=$(sha256sum "$ROOT/requirements-build.txt" | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$BASE" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q -r "$ROOT/requirements-build.txt"
  echo "$want" >"$stamp"
fi

# A separate output base keeps this build from evicting the local one; no convenience
# symlinks, so bazel-bin keeps pointing at the local build.
BZ=(bazel --output_base="$PIT_JAX_HOME/bazel-output-py$VER")
FLAGS=(--repo_env=PIT_PYTHON="$VENV/bin/python" --disk_cache="$PIT_JAX_HOME/bazel-disk" --symlink_prefix=/)
cd "$ROOT"
"${BZ[@]}" build "${FLAGS[@]}" //pit_jax:extensions
BIN=$("${BZ[@]}" info "${FLAGS[@]}" bazel-bin 2>/dev/null)
SUFFIX=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
for m in _pit_cpu _pit_cuda; do
  install -m 755 "$BIN/pit_jax/$m$SUFFIX" "pit_jax/$m$SUFFIX"
  echo "pit_jax/$m$SUFFIX"
done
