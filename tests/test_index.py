"""pit_jax.index: correctness against a NumPy reference, transformations, bad input.

Runs through the native targets on every platform JAX sees (CPU always, the CUDA
kernel where a GPU is present), on fresh random data each run.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import PLATFORMS, assert_call_raises, check_list, fresh_rng, live_tiles, put, tiled_sparse

import pit_jax

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16, jnp.bool_]
DENSITIES = [0.0, 0.01, 0.3, 1.0]
# (micro_tile as given, shape): row tiles, PIT's 32x1 / 1x64 / 32x64, and general tiles,
# on shapes that are and are not multiples of the tile.
CASES = [
    ("row", (64, 128)),
    ("row", (100, 130)),
    ((32, 1), (128, 96)),
    ((32, 1), (100, 130)),
    ((1, 64), (64, 256)),
    ((1, 64), (33, 200)),
    ((32, 64), (128, 256)),
    ((32, 64), (257, 67)),
    ((3, 5), (40, 52)),
    ((7, 2), (23, 9)),
    ((2, 8), (6, 64)),
    ((5, 3), (5, 3)),
]


def resolve(micro_tile, shape):
    rows, cols = shape[-2:]
    if micro_tile == "row":
        return (1, cols)
    return tuple(rows if t is None else t for t in micro_tile)


def check_index(idx: pit_jax.PitIndex, x: np.ndarray, tile, msg=""):
    live = live_tiles(x, tile)
    *lead, tr, tc = live.shape
    assert idx.micro_tile == tuple(tile) and idx.shape == x.shape[-2:]
    arrays = [np.asarray(a) for a in idx.arrays]
    tiles, count, row_tiles, row_count, col_tiles, col_count = arrays
    assert tiles.shape == (*lead, idx.capacity) and count.shape == tuple(lead)
    for b in np.ndindex(*lead):
        lv = live[b]
        full = idx.capacity == tr * tc
        check_list(tiles[b], int(count[b]), np.flatnonzero(lv), f"{msg} flat list at batch {b}", idx.capacity,
                   universe=tr * tc if full else None)
        if idx.has_rows:
            for r in range(tr):
                check_list(row_tiles[b][r], int(row_count[b][r]), np.flatnonzero(lv[r]), f"{msg} row {r} {b}")
        else:
            assert row_tiles.size == 0 and row_count.size == 0
        if idx.has_cols:
            for c in range(tc):
                check_list(col_tiles[b][c], int(col_count[b][c]), np.flatnonzero(lv[:, c]), f"{msg} col {c} {b}")
        else:
            assert col_tiles.size == 0 and col_count.size == 0


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("micro_tile,shape", CASES, ids=[f"{t}-{s}" for t, s in CASES])
def test_index_matches_numpy(platform, density, dtype, micro_tile, shape):
    rng, seed = fresh_rng()
    tile = resolve(micro_tile, shape)
    x, _ = tiled_sparse(rng, shape, tile, density, dtype)
    group_by = [None, "row", "col", "both"][seed % 4]
    idx = jax.jit(lambda a: pit_jax.index(a, micro_tile, group_by=group_by))(put(platform, x))
    check_index(idx, x, tile, f"seed={seed} group_by={group_by}")


# Shapes that give the CUDA walk modes (docs/notes/index_kernel.md) several units along
# both axes: 32x1 tiles over more than one 32-vector chunk of a tile row with a partial last
# tile row; 32x64 / 16x32 / 1x64 tiles in several strips a tile column with a partial last
# tile column; a leading batch dimension. bool masks whose rows are not whole 16-byte
# vectors take the shared mode, as before (1000 x 520 here).
WALK_CASES = [
    ((32, 1), (300, 4104)),
    ((8, 2), (72, 528)),
    ((32, 64), (1000, 520)),
    ((16, 32), (3, 200, 264)),
    ((1, 64), (300, 1008)),
]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("density", [0.0, 0.05, 0.5, 1.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("micro_tile,shape", WALK_CASES, ids=[f"{t}-{s}" for t, s in WALK_CASES])
def test_walk_shapes_match_numpy(platform, density, dtype, micro_tile, shape):
    rng, seed = fresh_rng()
    x, _ = tiled_sparse(rng, shape, micro_tile, density, dtype)
    group_by = [None, "row", "col", "both"][seed % 4]
    idx = jax.jit(lambda a: pit_jax.index(a, micro_tile, group_by=group_by))(put(platform, x))
    check_index(idx, x, micro_tile, f"seed={seed} group_by={group_by}")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("micro_tile,shape", WALK_CASES, ids=[f"{t}-{s}" for t, s in WALK_CASES])
def test_walk_shapes_over_capacity(platform, micro_tile, shape):
    """A flat list smaller than the live tiles keeps `capacity` distinct live tiles, counts all."""
    rng, seed = fresh_rng()
    x, live = tiled_sparse(rng, shape, micro_tile, 0.5, jnp.bfloat16)
    per_matrix = live.shape[-2] * live.shape[-1]
    cap = max(1, per_matrix // 5)
    idx = jax.jit(lambda a: pit_jax.index(a, micro_tile, capacity=cap, group_by="both"))(put(platform, x))
    count, tiles = np.asarray(idx.count), np.asarray(idx.tiles)
    lead = live.shape[:-2]
    for b in np.ndindex(*lead):
        lv = live[b].ravel()
        assert int(count[b]) == int(lv.sum()), f"seed={seed} batch {b}"
        got = tiles[b][: min(cap, int(lv.sum()))]
        assert len(np.unique(got)) == len(got) and lv[got].all(), f"seed={seed} batch {b}: {got}"
    check_index(pit_jax.index(put(platform, x), micro_tile, group_by="both"), x, micro_tile, f"seed={seed}")


# 2-D tiles live by one element anywhere in the tile (any row, any column): the walk modes
# read a tile's rows in several lanes and loads.
@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32, jnp.bool_], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("micro_tile,shape", [((32, 64), (500, 400)), ((32, 1), (200, 1040)), ((1, 64), (90, 640))],
                         ids=str)
def test_block_tiles_live_by_one_element_anywhere(platform, dtype, micro_tile, shape):
    rng, seed = fresh_rng()
    rows, cols = shape
    h, w = micro_tile
    tr, tc = -(-rows // h), -(-cols // w)
    live = rng.random((tr, tc)) < 0.3
    x = np.where(rng.random(shape) < 0.5, -0.0, 0.0).astype(np.float32)
    for r, c in zip(*np.nonzero(live)):
        i = rng.integers(r * h, min(rows, (r + 1) * h))
        j = rng.integers(c * w, min(cols, (c + 1) * w))
        x[i, j] = rng.choice([-1.5, 2.0])
    x = x != 0 if dtype == jnp.bool_ else np.asarray(jnp.asarray(x, dtype))
    idx = jax.jit(lambda a: pit_jax.index(a, micro_tile, group_by="both"))(put(platform, x))
    check_index(idx, x, micro_tile, f"seed={seed}")
    assert int(idx.count) == int(live.sum())


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("group_by", [None, "both"])
def test_batched_leading_dims(platform, group_by):
    rng, seed = fresh_rng()
    x, _ = tiled_sparse(rng, (2, 3, 50, 70), (4, 8), 0.3, jnp.bfloat16)
    idx = jax.jit(lambda a: pit_jax.index(a, (4, 8), group_by=group_by))(put(platform, x))
    assert idx.batch_shape == (2, 3)
    check_index(idx, x, (4, 8), f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("micro_tile,shape", [((32, 64), (257, 67)), ((32, 1), (768, 96)), ("row", (9, 20))])
def test_index_from_tiles_is_the_matrix_index(platform, micro_tile, shape):
    """index_from_tiles(tile mask) == index(matrix): the same lists, the matrix's geometry."""
    rng, seed = fresh_rng()
    tile = resolve(micro_tile, shape)
    x, _ = tiled_sparse(rng, (2, *shape), tile, 0.3, jnp.bfloat16)
    live = live_tiles(x, tile)
    for group_by in (None, "both"):
        idx = jax.jit(lambda t: pit_jax.index_from_tiles(t, micro_tile, shape, group_by=group_by))(put(platform, live))
        assert idx.group_by == group_by and idx.batch_shape == (2,)
        check_index(idx, x, tile, f"seed={seed} group_by={group_by}")
    small = jax.jit(lambda t: pit_jax.index_from_tiles(t, micro_tile, shape, capacity=3))(put(platform, live))
    assert small.capacity == 3
    mapped = jax.jit(jax.vmap(lambda t: pit_jax.index_from_tiles(t, micro_tile, shape, group_by="both")))
    check_index(mapped(put(platform, live)), x, tile, f"seed={seed} vmap")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("micro_tile,shape,n", [((32, 64), (768, 2304), 12), ((32, 64), (257, 67), 1),
                                                ((32, 1), (100, 130), 16), ((3, 5), (40, 52), 5),
                                                ((32, 64), (96, 200), 35)])
def test_index_from_tiles_split(platform, micro_tile, shape, n):
    """split=True: entry i's index is the index of matrix i, in buffers of its own, from
    one pit_index_split call per 16 entries with no slices after it (more than 16: the
    mask is cut into 16-entry parts before the calls)."""
    rng, seed = fresh_rng()
    tile = resolve(micro_tile, shape)
    density = [0.0, 0.2, 0.5, 1.0][seed % 4]
    x, _ = tiled_sparse(rng, (n, *shape), tile, density, jnp.bfloat16)
    live = live_tiles(x, tile)
    full = live.shape[-2] * live.shape[-1]
    for group_by, capacity in ((None, None), ("row", 3), ("col", None), ("both", None), ("both", min(7, full))):
        f = jax.jit(lambda t: pit_jax.index_from_tiles(t, micro_tile, shape, capacity=capacity, group_by=group_by,
                                                       split=True))
        got = f(put(platform, live))
        assert isinstance(got, tuple) and len(got) == n
        for i, idx in enumerate(got):
            assert idx.batch_shape == () and idx.group_by == group_by
            assert idx.capacity == (full if capacity is None else capacity)
            check_index(idx, x[i], tile, f"seed={seed} density={density} group_by={group_by} entry {i}")
        hlo = f.lower(live).as_text()
        assert hlo.count("@pit_index_split(") == -(-n // 16) and "@pit_index(" not in hlo
        assert ("slice" in hlo) == (n > 16)
    # vmap over a leading dim: each entry keeps it.
    mapped = jax.jit(jax.vmap(lambda t: pit_jax.index_from_tiles(t, micro_tile, shape, group_by="both", split=True)))
    got = mapped(put(platform, np.stack([live, live[::-1]])))
    for i, idx in enumerate(got):
        assert idx.batch_shape == (2,)
        check_index(idx, np.stack([x[i], x[n - 1 - i]]), tile, f"seed={seed} vmap entry {i}")
    with pit_jax.use_reference(("index",)):
        ref = jax.jit(lambda t: pit_jax.index_from_tiles(t, micro_tile, shape, group_by="both", split=True))(live)
    for i, idx in enumerate(ref):
        check_index(idx, x[i], tile, f"seed={seed} reference entry {i}")


def test_index_from_tiles_split_errors():
    with pytest.raises(ValueError, match=r"split=True, live_tiles must be \[n, 9, 2\] with n >= 1, got shape \(9, 2\)"):
        pit_jax.index_from_tiles(jnp.ones((9, 2), bool), (32, 64), (257, 67), split=True)
    with pytest.raises(ValueError, match=r"n >= 1, got shape \(0, 9, 2\)"):
        pit_jax.index_from_tiles(jnp.ones((0, 9, 2), bool), (32, 64), (257, 67), split=True)
    with pytest.raises(ValueError, match=r"n >= 1, got shape \(2, 3, 9, 2\)"):
        pit_jax.index_from_tiles(jnp.ones((2, 3, 9, 2), bool), (32, 64), (257, 67), split=True)
    with pytest.raises(TypeError, match="live_tiles must be float32, bfloat16, float16 or bool, got int32"):
        pit_jax.index_from_tiles(jnp.ones((2, 9, 2), jnp.int32), (32, 64), (257, 67), split=True)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_index_split_target_refuses_bad_results(platform):
    """The raw FFI target checks its results against x: a hand-written call with the
    wrong number of results or a wrong entry size is an error, not a crash."""
    x = jnp.ones((2, 4, 3), bool)
    attrs = dict(tile_h=np.int64(1), tile_w=np.int64(1), group_rows=False, group_cols=True)
    entry = [jax.ShapeDtypeStruct(s, jnp.int32) for s in ((12,), (), (0, 0), (0,), (3, 4), (3,))]
    scratch = jax.ShapeDtypeStruct((2,), jnp.int32)
    short = lambda: jax.ffi.ffi_call("pit_index_split", entry + [scratch])(x, **attrs)
    assert_call_raises(platform, "6 results per entry", short)
    wrong = entry[:4] + [jax.ShapeDtypeStruct((3, 5), jnp.int32), entry[5]]
    bad_size = lambda: jax.ffi.ffi_call("pit_index_split", wrong + entry + [scratch])(x, **attrs)
    assert_call_raises(platform, "col_tiles \\[tile_cols, tile_rows\\]", lambda: bad_size())
    ok = jax.jit(lambda: jax.ffi.ffi_call("pit_index_split", entry + entry + [scratch])(put(platform, x), **attrs))()
    np.testing.assert_array_equal(np.asarray(ok[1]), 12)  # entry 0's count: every tile live


def test_index_from_tiles_errors():
    with pytest.raises(ValueError, match=r"live_tiles must be \[\.\.\., 9, 2\]"):
        pit_jax.index_from_tiles(jnp.ones((9, 3), bool), (32, 64), (257, 67))
    with pytest.raises(TypeError, match="shape must be"):
        pit_jax.index_from_tiles(jnp.ones((9, 2), bool), (32, 64), 257)
    with pytest.raises(ValueError, match="larger than the matrix"):
        pit_jax.index_from_tiles(jnp.ones((1, 1), bool), (32, 64), (16, 64))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_vmap(platform, in_axis):
    rng, seed = fresh_rng()
    x, _ = tiled_sparse(rng, (4, 5, 40, 33), (32, 1), 0.2, jnp.float16)
    xs = np.moveaxis(x, 0, in_axis)  # vmap over axis `in_axis`, inner leading dim 5
    f = jax.jit(jax.vmap(lambda a: pit_jax.index(a, (32, 1), group_by="both"), in_axes=in_axis))
    idx = f(put(platform, xs))
    assert idx.batch_shape == (4, 5)
    check_index(idx, x, (32, 1), f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_nested_vmap_and_capacity(platform):
    rng, seed = fresh_rng()
    x, _ = tiled_sparse(rng, (3, 2, 16, 64), (1, 64), 1.0, jnp.float32)
    f = jax.jit(jax.vmap(jax.vmap(lambda a: pit_jax.index(a, "row", capacity=10))))
    idx = f(put(platform, x))
    count = np.asarray(idx.count)
    assert (count == 16).all(), f"seed={seed}: count must count every live tile, got {count}"
    assert np.asarray(idx.overflowed()).all()
    tiles = np.asarray(idx.tiles)
    assert tiles.shape == (3, 2, 10) and (tiles >= 0).all() and (tiles < 16).all()
    for b in np.ndindex(3, 2):
        assert len(np.unique(tiles[b])) == 10


@pytest.mark.parametrize("platform", PLATFORMS)
def test_capacity_not_exceeded_is_exact(platform):
    rng, seed = fresh_rng()
    x, live = tiled_sparse(rng, (256, 32), (1, 32), 0.1, jnp.bfloat16)
    cap = max(1, int(live.sum()))
    idx = jax.jit(lambda a: pit_jax.index(a, "row", capacity=cap))(put(platform, x))
    assert not bool(idx.overflowed())
    check_index(idx, x, (1, 32), f"seed={seed}")


# Wide one-row tiles live by a single element anywhere in the tile (the last one included):
# tiled_sparse always keeps a live tile's first element, so a kernel that looked only at
# the start of a tile (docs/notes/index_kernel.md tried a probe of the first 16 bytes)
# would pass the other tests.
@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32, jnp.float16, jnp.bool_], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("micro_tile,shape", [("row", (300, 1024)), ("row", (64, 4104)), ((1, 64), (40, 640)),
                                              ("row", (50, 1001))], ids=str)
def test_wide_tiles_live_by_one_element_anywhere(platform, dtype, micro_tile, shape):
    rng, seed = fresh_rng()
    rows, cols = shape
    w = cols if micro_tile == "row" else micro_tile[1]
    tc = -(-cols // w)
    kind = rng.integers(0, 4, (rows, tc))  # 0 dead (+-0), 1 dense, 2 one non-zero, 3 one at the tile's end
    x = np.where(rng.random(shape) < 0.5, -0.0, 0.0).astype(np.float32)
    for r, c in zip(*np.nonzero(kind)):
        lo, hi = c * w, min(cols, (c + 1) * w)
        if kind[r, c] == 1:
            x[r, lo:hi] = rng.standard_normal(hi - lo) + 3.0
        else:
            x[r, hi - 1 if kind[r, c] == 3 else rng.integers(lo, hi)] = rng.choice([-1.5, 2.0])
    x = x != 0 if dtype == jnp.bool_ else np.asarray(jnp.asarray(x, dtype))
    tile = resolve(micro_tile, shape)
    idx = jax.jit(lambda a: pit_jax.index(a, micro_tile))(put(platform, x))
    check_index(idx, x, tile, f"seed={seed}")
    assert int(idx.count) == int(np.count_nonzero(kind))


def test_negative_zero_is_zero_and_nan_is_live():
    x = np.zeros((4, 8), np.float32)
    x[0, 3] = -0.0
    x[2, 5] = np.nan
    for platform in PLATFORMS:
        idx = pit_jax.index(put(platform, x), "row")
        assert int(idx.count) == 1 and int(idx.tiles[0]) == 2


def test_mask_views():
    rng, _ = fresh_rng()
    x, live = tiled_sparse(rng, (2, 10, 13), (3, 4), 0.5, jnp.float32)
    idx = pit_jax.index(x, (3, 4))
    np.testing.assert_array_equal(np.asarray(idx.tile_mask()), live)
    expected = np.repeat(np.repeat(live, 3, -2), 4, -1)[..., :10, :13]
    np.testing.assert_array_equal(np.asarray(idx.mask()), expected)


def test_pytree_and_static_metadata():
    idx = pit_jax.index(jnp.ones((8, 16)), (2, 4), group_by="row")
    leaves, treedef = jax.tree_util.tree_flatten(idx)
    assert len(leaves) == 6
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert again.micro_tile == (2, 4) and again.shape == (8, 16) and again.group_by == "row"
    assert (again.tile_rows, again.tile_cols, again.num_tiles, again.capacity) == (4, 4, 16, 16)
    # Index pytrees pass through jit as arguments and results.
    out = jax.jit(lambda i: i)(idx)
    assert isinstance(out, pit_jax.PitIndex) and int(out.count) == 16


@pytest.mark.parametrize("platform", PLATFORMS)
def test_grad_and_jvp_through_index(platform):
    """The index is piecewise constant: derivatives flow through x's other uses only."""
    rng, _ = fresh_rng()
    x, live = tiled_sparse(rng, (12, 10), (2, 5), 0.5, jnp.float32)
    x = put(platform, x)

    def f(a):
        idx = pit_jax.index(a, (2, 5))
        return jnp.sum(a * a * idx.mask())

    g = jax.jit(jax.grad(f))(x)
    mask = np.repeat(np.repeat(live, 2, 0), 5, 1)
    np.testing.assert_allclose(np.asarray(g), 2 * np.asarray(x) * mask, rtol=1e-6)
    _, t = jax.jvp(f, (x,), (jnp.ones_like(x),))
    # A float32 sum of terms of both signs: its error scales with the terms, not with the
    # (possibly cancelled) sum (seed-dependent failures at rtol 1e-5 before).
    terms = 2 * np.asarray(x, np.float64) * mask
    np.testing.assert_allclose(float(t), terms.sum(), rtol=0, atol=1e-6 * np.abs(terms).sum())
    grads = jax.vmap(jax.grad(f))(jnp.stack([x, 2 * x]))
    np.testing.assert_allclose(np.asarray(grads[1]), 2 * np.asarray(g), rtol=1e-6)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_reference_switch_agrees(platform):
    rng, seed = fresh_rng()
    x, _ = tiled_sparse(rng, (3, 40, 24), (8, 3), 0.3, jnp.bfloat16)
    native = jax.jit(lambda a: pit_jax.index(a, (8, 3), group_by="both"))(put(platform, x))
    with pit_jax.use_reference():
        assert pit_jax.reference_enabled()
        ref = jax.jit(lambda a: pit_jax.index(a, (8, 3), group_by="both"))(put(platform, x))
        hlo = jax.jit(lambda a: pit_jax.index(a, (8, 3))).lower(x).as_text()
        assert "pit_index" not in hlo
    assert not pit_jax.reference_enabled()
    check_index(native, x, (8, 3), f"seed={seed}")
    check_index(ref, x, (8, 3), f"seed={seed} reference")
    assert "pit_index" in jax.jit(lambda a: pit_jax.index(a, (8, 3))).lower(x).as_text()


def test_empty_batch():
    idx = pit_jax.index(jnp.zeros((0, 8, 8), jnp.float32), (2, 2), group_by="both")
    assert idx.tiles.shape == (0, 16) and idx.count.shape == (0,) and idx.row_tiles.shape == (0, 4, 4)


# -- bad input: clear errors at trace time, naming the argument ------------------------


def test_error_wrong_rank():
    with pytest.raises(ValueError, match=r"x must have rank >= 2"):
        pit_jax.index(jnp.ones((8,)), (1, 1))


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.complex64])
def test_error_unsupported_dtype(dtype):
    with pytest.raises(TypeError, match=r"x must be float32, bfloat16, float16 or bool, got"):
        pit_jax.index(jnp.ones((8, 8), dtype), (1, 1))


@pytest.mark.parametrize(
    "micro_tile,error,pattern",
    [
        ((9, 1), ValueError, r"micro_tile \(9, 1\) is larger than the matrix it tiles \(8, 16\)"),
        ((1, 17), ValueError, r"larger than the matrix"),
        ((0, 4), ValueError, r"micro_tile must be positive"),
        ((2, -1), ValueError, r"micro_tile must be positive"),
        ((2,), TypeError, r"micro_tile must be a pair"),
        ("column", ValueError, r"micro_tile must be \(h, w\) or 'row'"),
        ((2.0, 4), TypeError, r"micro_tile\[0\] must be a Python int"),
        ((True, 4), TypeError, r"micro_tile\[0\] must be a Python int, got the bool"),
    ],
)
def test_error_bad_micro_tile(micro_tile, error, pattern):
    with pytest.raises(error, match=pattern):
        pit_jax.index(jnp.ones((8, 16)), micro_tile)


def test_error_traced_micro_tile():
    f = jax.jit(lambda x, h: pit_jax.index(x, (h, 4)))
    with pytest.raises(TypeError, match=r"micro_tile\[0\] must be a static Python int.*static_argnames"):
        f(jnp.ones((8, 16)), 2)
    g = jax.jit(lambda x, c: pit_jax.index(x, (2, 4), capacity=c))
    with pytest.raises(TypeError, match=r"capacity must be a static Python int"):
        g(jnp.ones((8, 16)), 3)
    # Marked static, it works.
    h = jax.jit(lambda x, h: pit_jax.index(x, (h, 4)), static_argnums=1)
    assert int(h(jnp.ones((8, 16)), 2).count) == 16


@pytest.mark.parametrize("capacity", [0, 17, -3])
def test_error_bad_capacity(capacity):
    with pytest.raises(ValueError, match=r"capacity must be in \[1, 16\]"):
        pit_jax.index(jnp.ones((8, 16)), (2, 4), capacity=capacity)


def test_error_bad_group_by():
    with pytest.raises(ValueError, match=r"group_by must be None, 'row', 'col' or 'both', got 'rows'"):
        pit_jax.index(jnp.ones((8, 16)), (2, 4), group_by="rows")


def test_big_tile_grids_are_refused():
    x = jax.ShapeDtypeStruct((65536, 65536), jnp.bool_)
    with pytest.raises(ValueError, match=r"at most 2147483647 are supported"):
        jax.eval_shape(lambda a: pit_jax.index(a, (1, 1)), x)
    assert math.prod(jax.eval_shape(lambda a: pit_jax.index(a, (1, 4)).tiles, x).shape) == 2**30
    # The kernels find rows and columns with 32-bit arithmetic.
    with pytest.raises(ValueError, match=r"below 2\^31, got \(2147483648, 1\)"):
        jax.eval_shape(lambda a: pit_jax.index(a, (2, 1)), jax.ShapeDtypeStruct((2**31, 1), jnp.bool_))
