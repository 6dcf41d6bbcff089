#!/usr/bin/env bash
# The CPU FFI handlers (cuda/ffi/cpu, the shared argument decoding in cuda/ffi/*.h) under
# AddressSanitizer: builds _pit_cpu with -fsanitize=address in its own Bazel output base,
# puts it beside a copy of the Python package and runs pytest on the CPU with it.
# Not part of CI (a second build and ~15 minutes of tests on two cores).
#   scripts/asan_cpu_test.sh                     # the test files that reach the handlers
#   scripts/asan_cpu_test.sh test_index.py -x    # pytest arguments instead
source "$(dirname "$0")/env.sh"
cd "$PIT_ROOT"
BZ=(bazel --output_base="$PIT_JAX_HOME/bazel-asan")
FLAGS=(--symlink_prefix=/ --repo_env=PIT_PYTHON="$PIT_PYTHON" --disk_cache="$PIT_JAX_HOME/bazel-disk"
       --copt=-fsanitize=address --copt=-fno-omit-frame-pointer --copt=-g --linkopt=-fsanitize=address)
"${BZ[@]}" build "${FLAGS[@]}" //pit_jax:_pit_cpu
BIN=$("${BZ[@]}" info "${FLAGS[@]}" bazel-bin 2>/dev/null)
SUFFIX=$("$PIT_PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')

PKG=$(mktemp -d)
trap 'rm -rf "$PKG"' EXIT
cp -r pit_jax "$PKG/"
rm -f "$PKG"/pit_jax/*.so
install -m 755 "$BIN/pit_jax/_pit_cpu$SUFFIX" "$PKG/pit_jax/"

# libstdc++ preloaded with the runtime: the interpreter does not link it, and without it
# ASan's __cxa_throw interceptor finds no real function and aborts at jaxlib's first C++
# exception.
ASAN_RT=$(gcc -print-file-name=libasan.so)
STDCXX=$(gcc -print-file-name=libstdc++.so.6)
if [ $# -eq 0 ]; then
  set -- -q test_index.py test_sread_swrite.py test_ffi_targets.py test_moe_targets.py test_layer_norm.py \
    test_row_activation.py test_native.py test_sparse_dense.py test_sparse_dense_epilogue.py \
    test_sparse_dense_parts.py test_moe.py test_transformations.py test_optimizer.py test_block_topk.py \
    test_mask_blocks.py
fi
cd tests
JAX_PLATFORMS=cpu LD_PRELOAD="$ASAN_RT $STDCXX" ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 \
  PYTHONPATH="$PKG:$PIT_ROOT/examples:$PIT_ROOT" "$PIT_PYTHON" -m pytest -p no:cacheprovider "$@"
