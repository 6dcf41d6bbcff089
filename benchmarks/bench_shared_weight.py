"""A batched x and a shared w (`SparseDense(batch_dims=1)`, data-parallel code): forward +
backward (dx, dw) of `pit_jax.sparse_dense(x [B, M, K], w [K, N], axis=...)` at BERT-base's
linear sizes, against the same product with x's batch folded into its rows (one 2-D
product: the floor). W axis (32x64 blocks of w): also with w broadcast to the batch by the
caller (B copies of w and B index builds, what `sparse_dense` did before it kept a shared w
shared). K axis (32x1 tiles of x, activation sparsity): x's tiles live at the density.
The index is built inside the timed function. Kernel (device) time per call from a
profiler trace, and wall time.
Writes benchmarks/results/shared_weight[_k]_<device>_<date>.json.

    python -m benchmarks.bench_shared_weight [--axis w|k|m|moe] [--batch 8] [--m 4096] [--densities 0.05,0.2,0.5]
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
TILES = {"w": (32, 64), "k": (32, 1), "m": None}  # m: whole rows (the default)
VARIANTS = {"w": ("shared", "folded", "broadcast"), "k": ("shared", "folded"), "m": ("shared", "folded")}


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


MOE_CASES = [(8, 1), (8, 2), (64, 1)]  # (experts, top-k)


def _moe_step(variant, e, topk):
    """fn(x [G, T, D], ids, gates, w_in, w_out, dy) -> (y, dx, dgates, dw_in, dw_out)."""

    def layer(x, gates, ids, w_in, w_out):
        if variant == "folded":
            g, t = x.shape[:2]
            y = pit_jax.moe_ffn(x.reshape(g * t, -1), gates.reshape(g * t, topk),
                                pit_jax.moe_index(ids.reshape(g * t, topk), e), w_in, w_out, activation="gelu")
            return y.reshape(x.shape)
        return pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, e), w_in, w_out, activation="gelu")

    def fn(x, ids, gates, w_in, w_out, dy):
        y, vjp = jax.vjp(lambda x, gates, w_in, w_out: layer(x, gates, ids, w_in, w_out), x, gates, w_in, w_out)
        return (y, *vjp(dy))

    return fn


def _moe_main(args, reps, calls, m):
    d, f = (64, 128) if args.small else (768, 3072)
    groups, t = args.batch, m // args.batch
    rows = []
    for e, topk in MOE_CASES:
        key, sets = jax.random.PRNGKey(e + topk), []
        for i in range(common.rotations(2 * m * d + 2 * e * d * f, 8)):
            k = jax.random.split(jax.random.fold_in(key, i), 6)
            ids = jax.random.randint(k[1], (groups, t, topk), 0, e)
            gates = jax.nn.softmax(jax.random.normal(k[2], (groups, t, topk)), -1).astype(jnp.bfloat16)
            sets.append((common.random_normal(k[0], (groups, t, d), jnp.bfloat16), ids, gates,
                         common.random_normal(k[3], (e, d, f), jnp.bfloat16),
                         common.random_normal(k[4], (e, f, d), jnp.bfloat16),
                         common.random_normal(k[5], (groups, t, d), jnp.bfloat16)))
        row = {"axis": "moe", "experts": e, "top_k": topk, "d": d, "f": f, "batch": groups, "m": m}
        rows.append(_time_variants(row, {v: _moe_step(v, e, topk) for v in ("shared", "folded")}, sets, reps, calls))
    return rows


def _time_variants(row, fns, sets, reps, calls):
    """row + each variant's wall and device ms over `sets`, and the largest relative
    difference of the others' outputs from "shared"'s (they compute the same thing, to bf16
    rounding: their sums differ in order). Prints and returns the row."""
    outs = {}
    for variant, fn in fns.items():
        t = common.time_op(fn, sets, reps=reps, keep_output=True, device_calls=calls)
        outs[variant] = t.pop("output")
        row[f"{variant}_ms"] = t["median_ms"]
        row[f"{variant}_device_ms"] = t.get("device_ms")
    row["max_rel_diff"] = max(_rel(a, b) for v in fns if v != "shared" for a, b in zip(outs["shared"], outs[v]))
    print(common.table([row], list(row)), flush=True)
    return row


def _rel(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-30))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--axis", choices=sorted(TILES) + ["moe"], default="w")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--m", type=int, default=4096, help="rows of x in all (batch x sequence)")
    ap.add_argument("--densities", default="0.05,0.2,0.5")
    ap.add_argument("--small", action="store_true")
    common.add_out_argument(ap)
    args = ap.parse_args(argv)
    shapes, reps, calls = ([(128, 128)], 3, 0) if args.small else (SHAPES, 15, 20)
    m = 256 if args.small else args.m
    if args.axis == "moe":
        payload = {"meta": common.device_info(), "rows": _moe_main(args, reps, calls, m)}
        print("wrote", common.write_results("shared_weight_moe", payload, args.out))
        return payload["rows"]
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
                elif args.axis == "m":
                    live = rng.random((args.batch, seq, 1)) < density
                    x = x * jnp.asarray(live, jnp.bfloat16)
                else:
                    live = rng.random((args.batch, -(-seq // tile[0]), k)) < density
                    x = x * jnp.asarray(np.repeat(live, tile[0], 1)[:, :seq], jnp.bfloat16)
                sets.append((x, w, common.random_normal(kd, (args.batch, seq, n), jnp.bfloat16)))
            row = {"axis": args.axis, "k": k, "n": n, "density": density, "batch": args.batch, "m": m}
            fns = {v: _step(v, args.batch, args.axis) for v in VARIANTS[args.axis]}
            rows.append(_time_variants(row, fns, sets, reps, calls))
    payload = {"meta": common.device_info(), "tile": list(TILES[args.axis] or (1, "K")), "rows": rows}
    suite = "shared_weight" + ("" if args.axis == "w" else f"_{args.axis}")
    print("wrote", common.write_results(suite, payload, args.out))
    return rows


if __name__ == "__main__":
    main()
