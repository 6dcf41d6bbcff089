"""Index construction on the device against the read floor and plain JAX (issue 2).

Cases: a 16384 x 4096 bf16 activation with 10% live rows (row micro-tiles), and a
4096 x 4096 bool mask with 32x1 micro-tiles at sparsity 0.9 (flat list, and grouped
per block of 32 rows as the K-axis product needs). The floor is one read of the
input at the measured copy bandwidth; the plain-JAX way is what a user writes inside
jit today (`any` + `jnp.nonzero(size=...)`).

    python -m benchmarks.bench_index [--out DIR] [--small]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import pit_jax
from benchmarks import common


def jnp_row_index(x):
    live = jnp.any(x != 0, axis=-1)
    (rows,) = jnp.nonzero(live, size=x.shape[0], fill_value=-1)
    return rows, live.sum(dtype=jnp.int32)


def jnp_tile_index(mask, h, grouped):
    r, c = mask.shape
    live = mask.reshape(r // h, h, c).any(axis=1)
    (flat,) = jnp.nonzero(live.ravel(), size=live.size, fill_value=-1)
    out = [flat, live.sum(dtype=jnp.int32)]
    if grouped:
        lists = jax.vmap(lambda row: jnp.nonzero(row, size=c, fill_value=-1)[0])(live)
        out += [lists, live.sum(axis=1, dtype=jnp.int32)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="output folder (default benchmarks/results) or a .json file path")
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke run)")
    args = ap.parse_args()
    meta = common.device_info()
    bw = common.copy_bandwidth_gbs(2**24 if args.small else 2**30)
    print(f"{meta['device']}: copy bandwidth {bw:.0f} GB/s (read + write)")
    key = jax.random.PRNGKey(0)
    rows = []

    m, k = (1024, 256) if args.small else (16384, 4096)
    n_sets = common.rotations(m * k * 2)
    sets = []
    for i in range(n_sets):
        kx, kr = jax.random.split(jax.random.fold_in(key, i))
        live = jax.random.uniform(kr, (m, 1)) < 0.10
        sets.append((jnp.where(live, common.random_normal(kx, (m, k), jnp.bfloat16), 0).astype(jnp.bfloat16),))
    floor = m * k * 2 / (bw * 1e9) * 1e3
    case = f"rows {m}x{k} bf16, 10% live"
    for name, fn in [
        ("pit_jax.index", lambda x: pit_jax.index(x, "row").arrays[:2]),
        ("jnp any+nonzero", jnp_row_index),
    ]:
        t = common.time_op(fn, sets)
        rows.append({"case": case, "impl": name, **t, "floor_ms": floor, "x_floor": t["median_ms"] / floor})

    n = 512 if args.small else 4096
    n_sets = common.rotations(n * n)
    sets = [(jax.random.uniform(jax.random.fold_in(key, 100 + i), (n // 32, 1, n)) < 0.10,) for i in range(n_sets)]
    sets = [(jnp.broadcast_to(s[0], (n // 32, 32, n)).reshape(n, n),) for s in sets]
    floor = n * n / (bw * 1e9) * 1e3
    for grouped in (False, True):
        case = f"mask {n}x{n} bool, 32x1 tiles, sparsity 0.9, {'row lists' if grouped else 'flat'}"
        g = "row" if grouped else None
        for name, fn in [
            ("pit_jax.index", lambda x, g=g: pit_jax.index(x, (32, 1), group_by=g).arrays),
            ("jnp any+nonzero", lambda x, gr=grouped: jnp_tile_index(x, 32, gr)),
        ]:
            t = common.time_op(fn, sets)
            rows.append({"case": case, "impl": name, **t, "floor_ms": floor, "x_floor": t["median_ms"] / floor})

    print(common.table(rows, ["case", "impl", "median_ms", "floor_ms", "x_floor"]))
    path = common.write_results("index", {"meta": {**meta, "copy_gbs": bw}, "results": rows}, args.out)
    print("wrote", path)


if __name__ == "__main__":
    main()
