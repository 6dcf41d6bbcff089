"""Weight-block products (32 x 64 blocks; `--tile` for others, e.g. 1x32 / 32x1 strips) at
BERT-base training sizes on the GPU: the forward x @ (w o m), the dx dy @ (w o m)^T and
the weight gradient (x^T @ dy) o m through `pit_jax.sparse_dense(axis="w")` and its vjp
(index prebuilt from a random block mask, outside the timed function), against the dense
cuBLAS products in the same process (for the weight gradient also the masked dense product
written in JAX; pit's own weight gradient over 4096 tokens takes that route too,
`sdd_matmul._dense_is_faster`).
Writes benchmarks/results/wblock_<device>_<date>.json.

    python -m benchmarks.bench_wblock [--densities 0.02,0.1,0.5] [--m 4096] [--tile 32x64] [--check]
    python -m benchmarks.bench_wblock --small      # tiny shapes (a CPU smoke test)

On an H100 the products run on cuda/kernels/sm90/wblock_gemm.cu; PIT_JAX_WBLOCK=0 turns
that kernel off (the forward then runs on the older STile kernel, the dx on the generic
one, since the lowering no longer transposes w for it). Strips take the lowering's routes
for them (docs/kernels.md): a 1x32 forward x transposed for the Hopper STile kernel, the
other products of strips the masked dense product.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import pit_jax
from benchmarks import common

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from pit_models.pruning import parse_tile  # noqa: E402

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]  # BERT-base linears (K, N)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--densities", default="0.02,0.1,0.5")
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--tile", default="32x64", help="the micro-tile of w, e.g. 32x64, 1x32, 32x1")
    ap.add_argument("--check", action="store_true", help="compare each product with a float32 reference")
    ap.add_argument("--small", action="store_true", help="tiny shapes, few repeats")
    common.add_out_argument(ap)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    shapes, reps = ([(64, 128), (128, 64)], 3) if args.small else (SHAPES, 15)
    if args.small:
        args.m = 256
    try:
        bk, bn = parse_tile(args.tile)
    except ValueError as e:
        ap.error(str(e))
    rows = []
    for k, n in shapes:
        key = jax.random.PRNGKey(k * 7 + n)
        sets = common.rotations(2 * args.m * (k + n), 8)
        xs = [common.random_normal(jax.random.fold_in(key, i), (args.m, k), jnp.bfloat16) for i in range(sets)]
        dys = [common.random_normal(jax.random.fold_in(key, 100 + i), (args.m, n), jnp.bfloat16) for i in range(sets)]
        w = common.random_normal(jax.random.fold_in(key, 999), (k, n), jnp.bfloat16)
        dense_f = common.time_op(lambda x, w: x @ w, [(x, w) for x in xs], reps=reps)["median_ms"]
        dense_b = common.time_op(lambda dy, w: dy @ w.T, [(dy, w) for dy in dys], reps=reps)["median_ms"]
        pairs = [(x, dy) for x, dy in zip(xs, dys)]
        dense_w = common.time_op(lambda x, dy: x.T @ dy, pairs, reps=reps)["median_ms"]
        for d in (float(v) for v in args.densities.split(",")):
            live = rng.random((-(-k // bk), -(-n // bn))) < d
            idx = jax.jit(lambda t: pit_jax.index_from_tiles(t, (bk, bn), (k, n), group_by="both"))(jnp.asarray(live))
            mask = np.repeat(np.repeat(live, bk, 0), bn, 1)[:k, :n]  # the live blocks' elements
            fwd = lambda x, w: pit_jax.sparse_dense(x, w, idx, axis="w")
            bwd = lambda dy, w: jax.vjp(lambda x: pit_jax.sparse_dense(x, w, idx, axis="w"), jnp.zeros((args.m, k), jnp.bfloat16))[1](dy)[0]
            tf = common.time_op(fwd, [(x, w) for x in xs], reps=reps)["median_ms"]
            tb = common.time_op(bwd, [(dy, w) for dy in dys], reps=reps)["median_ms"]
            mask_j = jnp.asarray(mask, jnp.bfloat16)
            masked_dw = lambda x, dy: (x.T @ dy) * mask_j
            pit_dw = lambda x, dy: jax.vjp(lambda v: pit_jax.sparse_dense(x, v, idx, axis="w"), w)[1](dy)[0]
            tmw = common.time_op(masked_dw, pairs, reps=reps)["median_ms"]
            tw = common.time_op(pit_dw, pairs, reps=reps)["median_ms"]
            row = {"K": k, "N": n, "density": d, "live": float(live.mean()), "dense_fwd_ms": dense_f, "pit_fwd_ms": tf,
                   "dense_dx_ms": dense_b, "pit_dx_ms": tb, "dense_dw_ms": dense_w, "masked_dw_ms": tmw,
                   "pit_dw_ms": tw}
            if args.check:
                wm = np.asarray(w, np.float32) * mask
                ref_f = np.asarray(xs[0], np.float32) @ wm
                ref_b = np.asarray(dys[0], np.float32) @ wm.T
                got_f = np.asarray(jax.jit(fwd)(xs[0], w), np.float32)
                got_b = np.asarray(jax.jit(bwd)(dys[0], w), np.float32)
                row["err_fwd"] = float(np.abs(got_f - ref_f).max() / (np.abs(ref_f).max() + 1e-9))
                row["err_dx"] = float(np.abs(got_b - ref_b).max() / (np.abs(ref_b).max() + 1e-9))
                ref_w = (np.asarray(xs[0], np.float32).T @ np.asarray(dys[0], np.float32)) * mask
                got_w = np.asarray(jax.jit(pit_dw)(xs[0], dys[0]), np.float32)
                row["err_dw"] = float(np.abs(got_w - ref_w).max() / (np.abs(ref_w).max() + 1e-9))
                row["dead_dw_max"] = float(np.abs(np.where(mask, 0.0, got_w)).max())
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(common.table(rows, list(rows[0])))
    meta = common.device_info()
    meta.update(m=args.m, dtype="bfloat16", micro_tile=[bk, bn], pattern="random live blocks",
                timing="common.time_op: medians of back-to-back jitted calls over rotated inputs")
    path = common.write_results("wblock", {"meta": meta, "rows": rows}, args.out)
    print("wrote", path)
    return rows


if __name__ == "__main__":
    main()
