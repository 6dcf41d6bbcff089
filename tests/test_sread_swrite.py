"""pit_jax.sread / pit_jax.swrite: gather and scatter of micro-tiles, and their transforms."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from pit_testing import BILINEAR_FD_STEP, PLATFORMS, fresh_rng, put, tiled_sparse

import pit_jax

CASES = [((40, 52), (3, 5)), ((64, 96), (32, 1)), ((33, 200), (1, 64)), ((70, 130), (32, 64)), ((9, 7), (1, 7))]
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


# NaN-poison native outputs for the whole module (fixture in conftest.py).
pytestmark = pytest.mark.usefixtures("poison_outputs")


def np_tiles(x, tile):
    """All micro-tiles of x [..., R, C] as [..., tile_rows * tile_cols, h, w] (zero-padded)."""
    *lead, rows, cols = x.shape
    h, w = tile
    tr, tc = math.ceil(rows / h), math.ceil(cols / w)
    p = np.zeros((*lead, tr * h, tc * w), np.float64)
    p[..., :rows, :cols] = np.asarray(x, np.float64)
    return p.reshape(*lead, tr, h, tc, w).swapaxes(-3, -2).reshape(*lead, tr * tc, h, w)


def f64(a):
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("shape,tile", CASES)
def test_sread_then_swrite(platform, dtype, density, shape, tile):
    rng, seed = fresh_rng()
    x, live = tiled_sparse(rng, (2, *shape), tile, density, dtype)
    x = put(platform, x)

    def f(a):
        idx = pit_jax.index(a, tile)
        packed = pit_jax.sread(a, idx)
        return idx, packed, pit_jax.swrite(packed, idx), pit_jax.swrite(packed, idx, out=a, accumulate=True)

    idx, packed, back, doubled = jax.jit(f)(x)
    tiles, count = np.asarray(idx.tiles), np.asarray(idx.count)
    all_tiles = np_tiles(f64(x), tile)
    packed = f64(packed)
    assert not np.isnan(packed).any()
    for b in range(2):
        n = int(count[b])
        np.testing.assert_array_equal(packed[b, :n], all_tiles[b, tiles[b, :n]], err_msg=f"seed={seed}")
        assert not packed[b, n:].any(), f"seed={seed}: slots past the count must be zero"
    np.testing.assert_array_equal(f64(back), f64(x), err_msg=f"seed={seed}: x is zero off its live tiles")
    np.testing.assert_allclose(f64(doubled), 2 * f64(x), rtol=1e-2 if dtype != jnp.float32 else 0)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_swrite_overwrite_keeps_base_elsewhere(platform):
    rng, seed = fresh_rng()
    x, live = tiled_sparse(rng, (30, 40), (4, 8), 0.4, jnp.float32)
    base = rng.standard_normal((30, 40)).astype(np.float32)
    idx = pit_jax.index(put(platform, x), (4, 8))
    packed = rng.standard_normal((idx.capacity, 4, 8)).astype(np.float32)
    out = jax.jit(lambda p, b: pit_jax.swrite(p, idx, out=b))(*put(platform, packed, base))
    want = base.astype(np.float64).copy()
    tiles, n = np.asarray(idx.tiles), int(idx.count)
    for s in range(n):
        tr, tc = divmod(int(tiles[s]), idx.tile_cols)
        blk = packed[s][: min(4, 30 - 4 * tr), : min(8, 40 - 8 * tc)]
        want[4 * tr : 4 * tr + blk.shape[0], 8 * tc : 8 * tc + blk.shape[1]] = blk
    np.testing.assert_array_equal(f64(out), want, err_msg=f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_transforms(platform):
    rng, seed = fresh_rng()
    x, _ = tiled_sparse(rng, (3, 20, 24), (4, 6), 0.5, jnp.float32)
    x = put(platform, x)
    idx = pit_jax.index(x, (4, 6))
    # The ops are linear: finite differences are exact up to float32 rounding.
    tol = dict(atol=1e-2, rtol=1e-2, eps=BILINEAR_FD_STEP)
    check_grads(lambda a: pit_jax.sread(a, idx), (x,), order=2, modes=("fwd", "rev"), **tol)
    packed = pit_jax.sread(x, idx)
    base = jnp.ones_like(x)
    for acc in (False, True):
        check_grads(lambda p, b: pit_jax.swrite(p, idx, out=b, accumulate=acc), (packed, base), order=2,
                    modes=("fwd", "rev"), **tol)
    # vmap over data and index together, and over data with a shared (unbatched) index
    v = jax.vmap(lambda a, i: pit_jax.sread(a, i))(x, idx)
    np.testing.assert_array_equal(np.asarray(v), np.asarray(packed))
    one = pit_jax.index(x[0], (4, 6))
    v2 = jax.vmap(lambda a: pit_jax.swrite(pit_jax.sread(a, one), one))(x)
    mask = np.asarray(one.mask())
    np.testing.assert_array_equal(np.asarray(v2), np.asarray(x) * mask)


def test_errors():
    x = jnp.ones((8, 16))
    idx = pit_jax.index(x, (2, 4))
    with pytest.raises(ValueError, match=r"sread: the index was built for \(8, 16\), x is \(8, 12\)"):
        pit_jax.sread(jnp.ones((8, 12)), idx)
    with pytest.raises(TypeError, match=r"sread: x must be float32, bfloat16 or float16, got int32"):
        pit_jax.sread(x.astype(jnp.int32), idx)
    with pytest.raises(ValueError, match=r"swrite: packed must be \[\.\.\., 16, 2, 4\] for this index"):
        pit_jax.swrite(jnp.ones((16, 4, 2)), idx)
    with pytest.raises(ValueError, match=r"swrite: out must be"):
        pit_jax.swrite(jnp.ones((16, 2, 4)), idx, out=jnp.ones((8, 15)))
    with pytest.raises(TypeError, match=r"index must be a pit_jax.PitIndex"):
        pit_jax.swrite(jnp.ones((16, 2, 4)), "idx")
