"""The W axis with a batched x and a shared w (`SparseDense(batch_dims=1)`, data-parallel
code): forward + backward (dx, dw) of `pit_jax.sparse_dense(x [B, M, K], w [K, N],
axis="w")` at BERT-base's linear sizes, against the same product with x's batch folded
into its rows (one 2-D product: the floor) and with w broadcast to the batch by the caller
(B copies of w and B index builds, what `sparse_dense` did before it kept a shared w
shared). The index is built from w inside the timed function. Kernel (device) time per
call from a profiler trace, and wall time.
Writes benchmarks/results/shared_weight_<device>_<date>.json.

    python -m benchmarks.bench_shared_weight [--batch 8] [--m 4096] [--densities 0.05,0.2,0.5]
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
TILE = (32, 64)


def _step(variant, b):
    """fn(x [B, M, K], w, dy [B, M, N]) -> (y, dx, dw) of the variant."""

    def product(x, w):
        if variant == "folded":
            y = pit_jax.sparse_dense(x.reshape(-1, x.shape[-1]), w, axis="w", micro_tile=TILE)
            return y.reshape(*x.shape[:-1], w.shape[-1])
        if variant == "broadcast":
            w = jnp.broadcast_to(w, (b, *w.shape))
        return pit_jax.sparse_dense(x, w, axis="w", micro_tile=TILE)

    def fn(x, w, dy):
        y, vjp = jax.vjp(product, x, w)
        return (y, *vjp(dy))

    return fn


def _rel(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-30))


def main(argv=None):
    ap = argparse.ArgumentParser()
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
            live = rng.random((-(-k // TILE[0]), -(-n // TILE[1]))) < density
            mask = np.repeat(np.repeat(live, TILE[0], 0), TILE[1], 1)[:k, :n]
            key = jax.random.PRNGKey(k + n)
            sets = []
            for i in range(common.rotations(2 * m * (k + n) + 2 * k * n, 8)):
                kx, kw, kd = jax.random.split(jax.random.fold_in(key, i), 3)
                w = common.random_normal(kw, (k, n), jnp.bfloat16) * jnp.asarray(mask, jnp.bfloat16)
                sets.append((common.random_normal(kx, (args.batch, m // args.batch, k), jnp.bfloat16), w,
                             common.random_normal(kd, (args.batch, m // args.batch, n), jnp.bfloat16)))
            row = {"k": k, "n": n, "density": density, "batch": args.batch, "m": m}
            outs = {}
            for variant in ("shared", "folded", "broadcast"):
                t = common.time_op(_step(variant, args.batch), sets, reps=reps, keep_output=True, device_calls=calls)
                outs[variant] = t.pop("output")
                row[f"{variant}_ms"] = t["median_ms"]
                row[f"{variant}_device_ms"] = t.get("device_ms")
            # the three variants compute the same thing (to bf16 rounding: their sums differ in order)
            row["max_rel_diff"] = max(_rel(a, b) for v in ("folded", "broadcast") for a, b in zip(outs["shared"], outs[v]))
            rows.append(row)
            print(common.table([row], list(row)), flush=True)
    payload = {"meta": common.device_info(), "tile": list(TILE), "rows": rows}
    print("wrote", common.write_results("shared_weight", payload, args.out))
    return rows


if __name__ == "__main__":
    main()
