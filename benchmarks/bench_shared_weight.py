"""A batched x and a shared w (`SparseDense(batch_dims=1)`, data-parallel code): forward +
backward (dx, dw) of `pit_jax.sparse_dense(x [B, M, K], w [K, N], axis=...)` at BERT-base's
linear sizes, against the same product with x's batch folded into its rows (one 2-D
product: the floor). W axis (32x64 blocks of w): also with w broadcast to the batch by the
caller (B copies of w and B index builds, what `sparse_dense` did before it kept a shared w
shared). K axis (32x1 tiles of x, activation sparsity): x's tiles live at the density.
The index is built inside the timed function. Kernel (device) time per call from a
profiler trace, and wall time.
Writes benchmarks/results/shared_weight[_k]_<device>_<date>.json.

    python -m benchmarks.bench_shared_weight [--axis w|k] [--batch 8] [--m 4096] [--densities 0.05,0.2,0.5]
    python -m benchmarks.bench_shared_weight --small      # tiny shapes (a CPU smoke test)
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import pit_jax
from benchmarks import common

SHAPES = [(768, 2304), (768, 3072), (3072, 768)]  # BERT-base linears (K, N)
TILES = {"w": (32, 64), "k": (32, 1)}
VARIANTS = {"w": ("shared", "folded", "broadcast"), "k": ("shared", "folded")}


def _step(variant, b, axis):
    """fn(x [B, M, K], w, dy [B, M, N]) -> (y, dx, dw) of the variant."""
    tile = TILES[axis]

    def product(x, w):
        if variant == "folded":
            y = pit_jax.sparse_dense(x.reshape(-1, x.shape[-1]), w, axis=axis, micro_tile=tile)
            return y.reshape(*x.shape[:-1], w.shape[-1])
        if variant == "broadcast":
            w = jnp.broadcast_to(w, (b, *w.shape))
        return pit_jax.sparse_dense(x, w, axis=axis, micro_tile=tile)

    def fn(x, w, dy):
        y, vjp = jax.vjp(product, x, w)
        return (y, *vjp(dy))

    return fn


def _rel(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-30))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--axis", choices=sorted(TILES), default="w")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--m", type=int, default=4096, help="rows of x in all (batch x sequence)")
    ap.add_argument("--densities", default="0.05,0.2,0.5")
    ap.add_argument("--small", action="store_true")
    common.add_out_argument(ap)
    args = ap.parse_args(argv)
    shapes, reps, calls = ([(128, 128)], 3, 0) if args.small else (SHAPES, 15, 20)
    m = 256 if args.small else args.m
    rng = np.random.default_rng(0)
    rows = []
    for k, n in shapes:
        for density in [float(d) for d in args.densities.split(",")]:
            key = jax.random.PRNGKey(k + n)
            tile = TILES[args.axis]
            seq = m // args.batch
            sets = []
            for i in range(common.rotations(2 * m * (k + n) + 2 * k * n, 8)):
                kx, kw, kd = jax.random.split(jax.random.fold_in(key, i), 3)
                x = common.random_normal(kx, (args.batch, seq, k), jnp.bfloat16)
                w = common.random_normal(kw, (k, n), jnp.bfloat16)
                if args.axis == "w":
                    live = rng.random((-(-k // tile[0]), -(-n // tile[1]))) < density
                    w = w * jnp.asarray(np.repeat(np.repeat(live, tile[0], 0), tile[1], 1)[:k, :n], jnp.bfloat16)
                else:
                    live = rng.random((args.batch, -(-seq // tile[0]), k)) < density
                    x = x * jnp.asarray(np.repeat(live, tile[0], 1)[:, :seq], jnp.bfloat16)
                sets.append((x, w, common.random_normal(kd, (args.batch, seq, n), jnp.bfloat16)))
            row = {"axis": args.axis, "k": k, "n": n, "density": density, "batch": args.batch, "m": m}
            outs = {}
            for variant in VARIANTS[args.axis]:
                t = common.time_op(_step(variant, args.batch, args.axis), sets, reps=reps, keep_output=True,
                                   device_calls=calls)
                outs[variant] = t.pop("output")
                row[f"{variant}_ms"] = t["median_ms"]
                row[f"{variant}_device_ms"] = t.get("device_ms")
            # the variants compute the same thing (to bf16 rounding: their sums differ in order)
            row["max_rel_diff"] = max(_rel(a, b) for v in VARIANTS[args.axis][1:]
                                      for a, b in zip(outs["shared"], outs[v]))
            rows.append(row)
            print(common.table([row], list(row)), flush=True)
    payload = {"meta": common.device_info(), "tile": list(TILES[args.axis]), "rows": rows}
    suite = "shared_weight" + ("" if args.axis == "w" else f"_{args.axis}")
    print("wrote", common.write_results(suite, payload, args.out))
    return rows


if __name__ == "__main__":
    main()
