"""Magnitude pruning's per-step mask on the device: `pit_jax.block_topk` against the
pure-JAX twin (XLA's block sums and a sort) and the read floor (issue 7).

Case: BERT-base's pruned kernels as the pruned training step scores them, float32, one
call per shape (12 matrices each: qkv 768x2304, attn_out 768x768, ffn_in 768x3072,
ffn_out 3072x768), for 32x64 blocks and 32x1 / 1x32 strips: pit_jax as one call per
shape and as one call for the four (`block_topk_groups`: one select launch). On the GPU
the table also splits pit_jax's time between its kernels (the scores, the select) from a
profiler trace.

    python -m benchmarks.bench_block_topk [--out DIR] [--small]
"""

from __future__ import annotations

import argparse
import collections

import jax
import jax.numpy as jnp

import pit_jax
from benchmarks import common

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
TILES = [(32, 64), (32, 1), (1, 32)]


def _kernel_kind(name: str) -> str:
    for kind in ("NarrowBlockScores", "BlockScores", "TopkSelect"):
        if kind in name:
            return "scores" if "Scores" in kind else "select"
    return "other"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_out_argument(ap)
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke run)")
    ap.add_argument("--density", type=float, default=0.02)
    args = ap.parse_args(argv)
    meta = common.device_info()
    bw = common.copy_bandwidth_gbs(2**24 if args.small else 2**30)
    print(f"{meta['device']}: copy bandwidth {bw:.0f} GB/s (read + write)")
    shapes = [(k // 8, n // 8) for k, n in SHAPES] if args.small else SHAPES
    per_shape = 2 if args.small else 12
    key = jax.random.PRNGKey(0)
    mats = {s: [common.random_normal(jax.random.fold_in(key, 100 * i + j), s, jnp.float32) for j in range(per_shape)]
            for i, s in enumerate(shapes)}
    nbytes = sum(4 * k * n * per_shape for k, n in shapes)
    floor = nbytes / (bw * 1e9) * 1e3  # one read of the kernels at the copy's bytes (read + written) a second
    density = jnp.float32(args.density)
    rows = []
    for tile in TILES:
        def masks(ms, d, tile=tile):
            return [pit_jax.block_topk(ms[s], tile, d).live for s in shapes]

        def masks_one_call(ms, d, tile=tile):
            return [top.live for top in pit_jax.block_topk_groups([ms[s] for s in shapes], tile, d)]

        case = f"{tile[0]}x{tile[1]}, {len(shapes) * per_shape} float32 kernels, density {args.density:g}"
        for impl, fn_of in (("pit_jax", masks), ("pit_jax one call", masks_one_call), ("jnp sums+sort", masks)):
            with pit_jax.use_reference(not impl.startswith("pit_jax"), ops=("index",)):
                t = common.time_op(fn_of, [(mats, density)], device_calls=0 if args.small else 10)
            row = {"case": case, "impl": impl, "median_ms": t["median_ms"], "device_ms": t.get("device_ms"),
                   "floor_ms": floor, "x_floor": t.get("device_ms", t["median_ms"]) / floor}
            if impl.startswith("pit_jax") and not args.small:
                fn = jax.jit(fn_of)
                jax.block_until_ready(fn(mats, density))
                kinds = collections.Counter()
                for name, _, dur in common.trace_kernels(lambda: fn(mats, density), 10):
                    kinds[_kernel_kind(name)] += dur / 10
                row.update({f"{k}_us": v for k, v in kinds.items()})
            rows.append(row)
    print(common.table(rows, ["case", "impl", "median_ms", "device_ms", "scores_us", "select_us", "floor_ms",
                              "x_floor"]))
    path = common.write_results("block_topk", {"meta": {**meta, "copy_gbs": bw}, "results": rows}, args.out)
    print("wrote", path)
    return rows


if __name__ == "__main__":
    main()
