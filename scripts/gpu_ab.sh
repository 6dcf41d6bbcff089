#!/usr/bin/env bash
# A/B timing of several builds of pit_jax's native modules in one machine start (builds
# differ between machine starts by 1-4 %: compare them in one run). Runs ON the GPU machine.
#
#   scripts/gpu_ab.sh ARCHIVE [--rounds N] [--module FILE] -- SCRIPT [ARGS...]
#
# ARCHIVE: a tar.xz of one module per build, named <build>.so. Made here, e.g.
#   tar -cf - -C DIR old.so new.so | xz -9 -T2 > .gpu/ab.tar.xz
# (modules of nearby sources share most of their bytes: three 44 MB CUDA modules pack into
# ~19-28 MB, within what the device tool carries). Each build gets a copy of pit_jax/ under
# build/ab/pkg_<build>/ with its module as FILE (default: the CUDA module's name for
# python3), and SCRIPT (a path, e.g. benchmarks/device_ab.py; not `-m`, which would put the
# checkout's pit_jax/ first) runs once per build and round, in a process of its own, with
# that copy first on PYTHONPATH. The builds alternate within each round (default 2 rounds).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '5p' "$0" >&2; exit 2; }
[ $# -ge 3 ] || usage
archive=$1
shift
rounds=2
suffix=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
module=_pit_cuda$suffix
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --module) module=$2; shift 2 ;;
    *) usage ;;
  esac
done
[ "${1:-}" = "--" ] || usage
shift
[ $# -ge 1 ] || usage

work=build/ab
rm -rf "$work"
mkdir -p "$work/modules"
tar -xJf "$archive" -C "$work/modules"
builds=()
for so in "$work"/modules/*.so; do
  b=$(basename "$so" .so)
  builds+=("$b")
  mkdir -p "$work/pkg_$b"
  cp -r pit_jax "$work/pkg_$b/"
  cp "$so" "$work/pkg_$b/pit_jax/$module"
  echo "build $b: $(md5sum < "$so" | cut -c1-12) as pit_jax/$module"
done
[ ${#builds[@]} -ge 1 ] || { echo "gpu_ab.sh: no <build>.so in $archive" >&2; exit 1; }

failed=0
for ((r = 1; r <= rounds; r++)); do
  for b in "${builds[@]}"; do
    echo "== round $r, build $b"
    set +e
    PYTHONPATH="$work/pkg_$b:.${PYTHONPATH:+:$PYTHONPATH}" python3 "$@" 2>&1 | grep -v '^WARNING\|^I0000\|^W0000'
    status=${PIPESTATUS[0]}
    set -e
    if [ "$status" -ne 0 ]; then
      echo "gpu_ab.sh: build $b, round $r: exit status $status" >&2
      failed=1
    fi
  done
done
exit $failed
