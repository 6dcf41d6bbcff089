#!/usr/bin/env bash
# Installs pit_jax (built through Bazel by setup.py) into the venv and runs the demo:
# on the GPU where JAX sees one, on the CPU otherwise. Synthetic data, no downloads.
source "$(dirname "$0")/env.sh"
cd "$PIT_ROOT"
echo "[pit_jax] building and installing pit_jax ..." >&2
"$PIT_PYTHON" -m pip install -q --no-build-isolation . >/dev/null
cd "$PIT_JAX_HOME"  # import the installed package, not the source tree
exec "$PIT_PYTHON" "$PIT_ROOT/examples/demo.py" "$@"
