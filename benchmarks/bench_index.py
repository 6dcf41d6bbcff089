"""Index construction on the device against the read floor and plain JAX (issue 2).

Cases: a 16384 x 4096 bf16 activation with 10% live rows (row micro-tiles), a
4096 x 4096 bool mask with 32x1 micro-tiles at sparsity 0.9 (flat list, and grouped
per block of 32 rows as the K-axis product needs), and the indexes `sparse_dense`
builds from values when given none (issue 4's shapes, 4096 x 4096 at sparsity 0.9):
an activation's 32x1 tiles grouped by row (K axis), a weight's 32x64 / 1x64 blocks
grouped by column (W axis), bf16 and float32. The floor is one read of the input at
the measured copy bandwidth; the plain-JAX way is what a user writes inside jit today
(`any` + `jnp.nonzero(size=...)`). Device times (profiler trace) where a GPU runs:
the index is two kernels, an init and the pass. `PIT_JAX_INDEX_WALK=0` runs the
kernels from before the walk modes (A/B).

    python -m benchmarks.bench_index [--out DIR] [--small]
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp

import pit_jax
from benchmarks import common


def jnp_row_index(x):
    live = jnp.any(x != 0, axis=-1)
    (rows,) = jnp.nonzero(live, size=x.shape[0], fill_value=-1)
    return rows, live.sum(dtype=jnp.int32)


def jnp_tile_index(mask, h, grouped, w=1, by="row"):
    """Flat list of the live (h, w) tiles of a [R, C] mask (R, C multiples of the tile),
    and with `grouped` the per tile row (`by="row"`) or per tile column lists."""
    r, c = mask.shape
    live = mask.reshape(r // h, h, c // w, w).any(axis=(1, 3))
    (flat,) = jnp.nonzero(live.ravel(), size=live.size, fill_value=-1)
    out = [flat, live.sum(dtype=jnp.int32)]
    if grouped:
        g = live if by == "row" else live.T
        lists = jax.vmap(lambda row: jnp.nonzero(row, size=g.shape[1], fill_value=-1)[0])(g)
        out += [lists, g.sum(axis=1, dtype=jnp.int32)]
    return out


def result_row(case, impl, timing, floor_ms):
    """One results row: the timing against the read floor (in device time too, if traced)."""
    row = {"case": case, "impl": impl, **timing, "floor_ms": floor_ms, "x_floor": timing["median_ms"] / floor_ms}
    if timing.get("device_ms"):
        row["x_floor_device"] = timing["device_ms"] / floor_ms
    return row


def matrix_sets(key, n, tile, density, dtype, count):
    """`count` random [n, n] matrices whose (h, w) tiles are live with `density`."""
    h, w = tile
    sets = []
    for i in range(count):
        kl, kv = jax.random.split(jax.random.fold_in(key, 200 + i))
        live = jax.random.uniform(kl, (n // h, n // w)) < density
        em = jnp.repeat(jnp.repeat(live, h, 0), w, 1)
        sets.append((jnp.where(em, common.random_normal(kv, (n, n), dtype), 0).astype(dtype),))
    return sets


def main(argv=None):
    ap = argparse.ArgumentParser()
    common.add_out_argument(ap)
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke run)")
    args = ap.parse_args(argv)
    walk_off = os.environ.get("PIT_JAX_INDEX_WALK", "1").startswith("0")
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
        rows.append(result_row(case, name, t, floor))

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
            rows.append(result_row(case, name, t, floor))

    # The indexes sparse_dense builds from values (index=None), one per product.
    for tile, by, dtype in [((32, 1), "row", jnp.bfloat16), ((32, 64), "col", jnp.bfloat16),
                            ((1, 64), "col", jnp.bfloat16), ((32, 64), "col", jnp.float32)]:
        itemsize = jnp.dtype(dtype).itemsize
        sets = matrix_sets(key, n, tile, 0.1, dtype, common.rotations(n * n * itemsize))
        floor = n * n * itemsize / (bw * 1e9) * 1e3
        case = f"{'activation' if by == 'row' else 'weight'} {n}x{n} {jnp.dtype(dtype).name}, {tile[0]}x{tile[1]} tiles, sparsity 0.9, {by} lists"
        for name, fn in [
            ("pit_jax.index", lambda x, t=tile, g=by: pit_jax.index(x, t, group_by=g).arrays),
            ("jnp any+nonzero", lambda x, t=tile, g=by: jnp_tile_index(x != 0, t[0], True, t[1], g)),
        ]:
            t = common.time_op(fn, sets, device_calls=20 if name == "pit_jax.index" else 0)
            rows.append(result_row(case, name, t, floor))

    print(common.table(rows, ["case", "impl", "median_ms", "device_ms", "floor_ms", "x_floor"]))
    path = common.write_results("index", {"meta": {**meta, "copy_gbs": bw, "walk_modes": not walk_off}, "results": rows},
                                args.out)
    print("wrote", path)
    return rows


if __name__ == "__main__":
    main()
