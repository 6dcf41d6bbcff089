# Sourced by the other scripts: installs what is missing and configures Bazel.
#   - Bazel 4.2.3 from Debian (bazel-bootstrap) and Debian's rules_java, via apt-get;
#   - a virtual environment with requirements-dev.txt, reused while that file is unchanged;
#   - .bazelrc.user: build for that venv's Python, with a disk cache outside the clone.
# PIT_JAX_HOME (default ~/.cache/pit_jax) holds the venv and the Bazel disk cache.
set -euo pipefail

PIT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PIT_JAX_HOME=${PIT_JAX_HOME:-$HOME/.cache/pit_jax}
mkdir -p "$PIT_JAX_HOME"

_pit_sudo() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v bazel >/dev/null 2>&1 || [ ! -d /usr/share/bazel/rules/java ]; then
  echo "[pit_jax] installing Bazel (Debian bazel-bootstrap) ..." >&2
  export DEBIAN_FRONTEND=noninteractive
  _pit_sudo apt-get install -y -q bazel-bootstrap bazel-rules-java >/dev/null ||
    { _pit_sudo apt-get update -q >/dev/null && _pit_sudo apt-get install -y -q bazel-bootstrap bazel-rules-java >/dev/null; }
fi

PIT_PYTHON_BASE=${PIT_PYTHON_BASE:-python3}
_pyver=$("$PIT_PYTHON_BASE" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PIT_VENV=${PIT_VENV:-$PIT_JAX_HOME/venv-py$_pyver}
_stamp="$PIT_VENV/.requirements.sha256"
_want=$(sha256sum "$PIT_ROOT/requirements-dev.txt" | cut -d' ' -f1)
if [ ! -x "$PIT_VENV/bin/python" ] || [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
  echo "[pit_jax] setting up $PIT_VENV ..." >&2
  "$PIT_PYTHON_BASE" -m venv "$PIT_VENV"
  "$PIT_VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$PIT_VENV/bin/python" -m pip install -q -r "$PIT_ROOT/requirements-dev.txt"
  echo "$_want" >"$_stamp"
fi
export PIT_PYTHON="$PIT_VENV/bin/python"

cat >"$PIT_ROOT/.bazelrc.user" <<RC
# Written by scripts/env.sh.
build --repo_env=PIT_PYTHON=$PIT_PYTHON
build --disk_cache=$PIT_JAX_HOME/bazel-disk
RC
