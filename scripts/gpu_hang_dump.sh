#!/usr/bin/env bash
# Runs ON the GPU machine: runs a command, and if its output stops growing for a while,
# records where the GPU is stuck, then kills it. Made for hangs that need many queued
# steps to show (docs/notes/sm90_grouped.md, run 15: found this way).
#
#   scripts/gpu_hang_dump.sh [--stall S] [--warmup W] [--limit L] [--out DIR] -- CMD [ARGS...]
#
# CMD's stdout and stderr go to DIR/run.log. Once W seconds have passed (compilation) and
# the log has not grown for S seconds, the script writes the GPU's utilization and
# cuda-gdb's view of the process to DIR/hang.txt: the running kernels, the blocks still
# resident, and for the first of them each warp's active lanes and source position. Then
# it kills CMD. Exit status: CMD's own when it ends, 2 on a stall, 3 past L seconds.
# Defaults: S 8, W 30, L 600, DIR $OUT (the device tool's output folder) or ./hang_dump.
# CMD must print as it goes (python3 -u, stdbuf -oL): buffered output looks like a stall.
set -uo pipefail
stall=8 warmup=30 limit=600 out=${OUT:-hang_dump}
while [ $# -gt 0 ]; do
  case $1 in
    --stall) stall=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "gpu_hang_dump.sh: unknown option $1 (the command follows --)" >&2; exit 64 ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: gpu_hang_dump.sh [--stall S] [--warmup W] [--limit L] [--out DIR] -- CMD..." >&2; exit 64; }
mkdir -p "$out"
log=$out/run.log
"$@" >"$log" 2>&1 &
pid=$!
t0=$SECONDS last=-1 quiet=0
while kill -0 $pid 2>/dev/null; do
  sleep 1
  size=$(stat -c %s "$log" 2>/dev/null || echo 0)
  if [ "$size" = "$last" ]; then quiet=$((quiet + 1)); else quiet=0; fi
  last=$size
  if [ $((SECONDS - t0)) -ge "$limit" ]; then
    echo "gpu_hang_dump.sh: still running after ${limit}s; killed" >&2
    kill -9 $pid 2>/dev/null
    exit 3
  fi
  if [ $((SECONDS - t0)) -ge "$warmup" ] && [ $quiet -ge "$stall" ]; then
    {
      echo "stalled after $((SECONDS - t0)) s (no output for ${quiet} s); last lines:"
      tail -3 "$log"
      nvidia-smi --query-gpu=utilization.gpu,power.draw,memory.used --format=csv,noheader 2>&1
      # Which kernels are resident, which blocks are left, and where each warp of the
      # first such block is (its line: inlined frames name the barrier or wgmma it waits at).
      ex=(-ex "info cuda kernels" -ex "info cuda blocks" -ex "info cuda warps")
      for w in $(seq 0 63); do ex+=(-ex "cuda warp $w lane 0" -ex "bt 1"); done
      timeout -s KILL 120 cuda-gdb -p $pid -batch "${ex[@]}" 2>&1 |
        grep -v '^\[New \|^\[Thread .* exited\|^\[Detaching\|libthread_db\|Invalid coordinates\|CUDA focus unchanged\|^$'
    } >"$out/hang.txt" 2>&1
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    echo "gpu_hang_dump.sh: stalled; see $out/hang.txt" >&2
    exit 2
  fi
done
wait $pid
