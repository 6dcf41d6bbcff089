"""pit_jax.block_topk (pit_block_topk): block magnitude pruning's mask on the device.
Scores against float64 block sums; the cut against NumPy's order statistic of the op's
own scores (exact); live == scores >= cut; and the pure-JAX reference (a sort)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import PLATFORMS, f64, fresh_rng, put, randn

import pit_jax
from pit_jax import reference

pytestmark = pytest.mark.usefixtures("poison_outputs")

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
# (lead, K, N, tile): pruning's blocks on BERT-like and odd shapes; edge blocks partial;
# a block wider than the kernel's 256-column chunk; tile == matrix.
CASES = [
    ((), 96, 192, (32, 64)),
    ((2,), 100, 70, (32, 64)),
    ((), 768, 230, (32, 1)),
    ((3,), 65, 33, (1, 32)),
    ((), 45, 37, (5, 7)),
    ((), 9, 700, (2, 300)),
    ((), 64, 64, (64, 64)),
    ((), 1, 1, (1, 1)),
    ((), 20, 48, (32, 64)),  # one partial block
    # the 16-byte column walk (rows whole 16-byte vectors, blocks whole vectors wide): two
    # chunks and a partial one, a partial block column; blocks one vector wide
    ((), 40, 2056, (32, 64)),
    ((2,), 64, 96, (16, 8)),
    # blocks narrower than a 16-byte vector, whole blocks per vector (32x1-like strips; a
    # partial last band; 16-bit only at tile_w 4)
    ((2,), 96, 64, (32, 2)),
    ((), 70, 40, (8, 4)),
    ((), 50, 1024, (16, 1)),
    # one-row blocks 2-8 vectors wide, N a multiple of them (1x32 strips): the flat row
    # walk; a partial last group of 8 rows
    ((2,), 37, 256, (1, 32)),
    ((), 8, 64, (1, 16)),
]


def keep_of(density, blocks):
    d = np.float32(density) * np.float32(blocks)
    if not d >= 1:
        return 1
    return int(min(blocks, max(1, np.rint(d))))


def block_sums64(x, tile):
    k, n = x.shape[-2:]
    tk, tn = math.ceil(k / tile[0]), math.ceil(n / tile[1])
    a = np.abs(f64(x)).reshape(-1, k, n)
    a = np.pad(a, ((0, 0), (0, tk * tile[0] - k), (0, tn * tile[1] - n)))
    return a.reshape(-1, tk, tile[0], tn, tile[1]).sum(axis=(2, 4))


def check_topk(out, x, tile, density, msg):
    k, n = x.shape[-2:]
    tk, tn = math.ceil(k / tile[0]), math.ceil(n / tile[1])
    lead = tuple(x.shape[:-2])
    assert out.live.shape == (*lead, tk, tn) and out.live.dtype == jnp.bool_, msg
    assert out.scores.shape == (*lead, tk, tn) and out.scores.dtype == jnp.float32, msg
    assert out.thresholds.shape == lead, msg
    scores = np.asarray(out.scores).reshape(-1, tk * tn)
    assert np.isfinite(scores).all(), f"{msg}: unwritten scores (poisoned)"
    want = block_sums64(x, tile).reshape(-1, tk * tn)
    scale = np.maximum(want, 1.0)
    assert (np.abs(scores - want) / scale).max() <= 1e-5 * max(1.0, math.sqrt(tile[0] * tile[1])), msg
    blocks = tk * tn
    keep = keep_of(density, blocks)
    cut = np.sort(scores, axis=-1)[:, blocks - keep]
    np.testing.assert_array_equal(np.asarray(out.thresholds).reshape(-1), cut, err_msg=msg)
    live = np.asarray(out.live).reshape(-1, blocks)
    np.testing.assert_array_equal(live, scores >= cut[:, None], err_msg=msg)
    assert (live.sum(-1) >= keep).all(), msg


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("density", [0.0, 0.02, 0.3, 1.0])
@pytest.mark.parametrize("lead,k,n,tile", CASES)
def test_block_topk_value(platform, dtype, density, lead, k, n, tile):
    rng, seed = fresh_rng()
    x = randn(rng, (*lead, k, n), dtype)
    out = jax.jit(lambda x, d: pit_jax.block_topk(x, tile, d))(put(platform, x), jnp.float32(density))
    check_topk(out, x, tile, density, f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_block_topk_list_of_matrices(platform):
    """A list is taken as it is (no stacking) and equals the stacked array's results;
    more matrices than one launch of the scores kernel takes (64)."""
    rng, seed = fresh_rng()
    mats = [randn(rng, (40, 50), jnp.bfloat16) for _ in range(70)]
    got = jax.jit(lambda ms: pit_jax.block_topk(ms, (8, 16), 0.25))(list(put(platform, *mats)))
    stacked = np.stack(mats)
    check_topk(got, stacked, (8, 16), 0.25, f"seed={seed}")
    one = jax.jit(lambda s: pit_jax.block_topk(s, (8, 16), 0.25))(put(platform, stacked))
    for a, b in zip(got, one):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_block_topk_ties_at_the_cut(platform):
    """Integer-valued weights make many equal scores: the cut is still the exact order
    statistic and every block equal to it stays live."""
    rng, seed = fresh_rng()
    x = rng.integers(-2, 3, size=(2, 64, 96)).astype(np.float32)
    for density in (0.1, 0.5, 0.9):
        out = jax.jit(lambda x: pit_jax.block_topk(x, (4, 4), density))(put(platform, x))
        check_topk(out, x, (4, 4), density, f"seed={seed} density={density}")


# Matrices with many blocks: on Hopper the select splits each over a cluster of CTAs, one
# per 16384 blocks up to 8 (5, 2, 7 and 8 here); an odd block count leaves the last CTA a
# short slice.
MANY = [
    ((2,), 768, 3072, (32, 1), jnp.float32),
    ((), 64, 300, (1, 1), jnp.bfloat16),
    ((), 3001, 131, (1, 4), jnp.float32),
    ((), 4100, 1030, (1, 32), jnp.float16),
]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("lead,k,n,tile,dtype", MANY, ids=[f"{c[1]}x{c[2]}_tile{c[3][0]}x{c[3][1]}" for c in MANY])
def test_block_topk_many_blocks(platform, lead, k, n, tile, dtype):
    rng, seed = fresh_rng()
    x = randn(rng, (*lead, k, n), dtype)
    for density in (0.02, 0.5):
        out = jax.jit(lambda x: pit_jax.block_topk(x, tile, density))(put(platform, x))
        check_topk(out, x, tile, density, f"seed={seed} density={density}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_block_topk_ties_across_a_cluster(platform):
    """Ties at the cut spread over every CTA of a matrix's cluster (60000 blocks: 4 CTAs)."""
    rng, seed = fresh_rng()
    x = rng.integers(-3, 4, size=(2, 200, 300)).astype(np.float32)
    for density in (0.1, 0.5, 0.9):
        out = jax.jit(lambda x: pit_jax.block_topk(x, (1, 1), density))(put(platform, x))
        check_topk(out, x, (1, 1), density, f"seed={seed} density={density}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_block_topk_traced_density_and_edges(platform):
    """density is traced (one compilation for every value); NaN keeps one block, values
    above 1 keep all, zero and negative keep one."""
    rng, seed = fresh_rng()
    x = randn(rng, (64, 128), jnp.float32)
    fn = jax.jit(lambda x, d: pit_jax.block_topk(x, (32, 64), d).live.sum())
    xs = put(platform, x)
    for d, want in [(0.5, 2), (1.0, 4), (3.0, 4), (0.0, 1), (-1.0, 1), (float("nan"), 1), (0.26, 1), (0.4, 2)]:
        assert int(fn(xs, jnp.float32(d))) == want, f"seed={seed} density={d}"
    assert fn._cache_size() == 1


@pytest.mark.parametrize("platform", PLATFORMS)
def test_block_topk_matches_the_sort_reference(platform):
    """The native op and the pure-JAX reference (block sums and a sort) agree; the masks
    may differ only at blocks whose scores tie the cut within float32 rounding."""
    rng, seed = fresh_rng()
    x = randn(rng, (3, 96, 320), jnp.float32)
    for tile in [(32, 64), (32, 1), (1, 32)]:
        got = jax.jit(lambda x: pit_jax.block_topk(x, tile, 0.1))(put(platform, x))
        with pit_jax.use_reference(ops=("index",)):
            want = jax.jit(lambda x: pit_jax.block_topk(x, tile, 0.1))(put(platform, x))
        np.testing.assert_allclose(np.asarray(got.scores), np.asarray(want.scores), rtol=1e-5)
        differ = np.asarray(got.live) != np.asarray(want.live)
        near = np.abs(np.asarray(want.scores) - np.asarray(want.thresholds)[..., None, None]) <= 1e-5 * np.asarray(
            want.scores)
        assert not (differ & ~near).any(), f"seed={seed} tile={tile}"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_block_topk_vmap_and_grad(platform):
    rng, seed = fresh_rng()
    xs = put(platform, randn(rng, (4, 2, 64, 64), jnp.float32))
    w = put(platform, randn(rng, (64, 64), jnp.float32))
    # vmap over matrices, with an unmapped one in the list, then a mapped density
    got = jax.jit(jax.vmap(lambda x: pit_jax.block_topk([x, w], (16, 16), 0.3)))(xs)
    assert got.live.shape == (4, 3, 4, 4)
    for i in range(4):
        one = pit_jax.block_topk([xs[i], w], (16, 16), 0.3)
        for a, b in zip(got, one):
            np.testing.assert_array_equal(np.asarray(a[i]), np.asarray(b))
    ds = jnp.asarray([0.1, 0.3, 0.5, 1.0], jnp.float32)
    counts = jax.jit(jax.vmap(lambda x, d: pit_jax.block_topk(x, (16, 16), d).live.sum((-1, -2))))(xs, ds)
    np.testing.assert_array_equal(np.asarray(counts), [[keep_of(d, 16)] * 2 for d in (0.1, 0.3, 0.5, 1.0)])
    # no gradient flows through the mask or the scores
    g = jax.jit(jax.grad(lambda w: jnp.sum(pit_jax.block_topk(w, (16, 16), 0.5).scores) + jnp.sum(w)))(w)
    np.testing.assert_array_equal(np.asarray(g), np.ones((64, 64), np.float32))


def test_block_topk_empty_batch():
    out = pit_jax.block_topk(jnp.zeros((0, 8, 8)), (4, 4), 0.5)
    assert out.live.shape == (0, 2, 2) and out.thresholds.shape == (0,)


@pytest.mark.parametrize(
    "args,err,match",
    [
        (([jnp.zeros((8, 8)), jnp.zeros((8, 9))], (4, 4), 0.5), ValueError, r"matrices\[1\] must match"),
        (([jnp.zeros((8, 8)), jnp.zeros((8, 8), jnp.bfloat16)], (4, 4), 0.5), ValueError, r"matrices\[1\] must match"),
        ((jnp.zeros((8, 8), jnp.int32), (4, 4), 0.5), TypeError, "must be float32, bfloat16 or float16"),
        ((jnp.zeros((8,)), (4, 4), 0.5), ValueError, "rank >= 2"),
        ((jnp.zeros((8, 8)), (0, 4), 0.5), ValueError, "micro_tile must be positive"),
        ((jnp.zeros((8, 8)), (4, 4), jnp.ones(2)), TypeError, "density must be a float scalar"),
        ((jnp.zeros((8, 8)), (4, 4), 1.5), ValueError, r"density must be a fraction in \[0, 1\], got 1.5"),
        ((jnp.zeros((8, 8)), (4, 4), -0.1), ValueError, r"density must be a fraction in \[0, 1\], got -0.1"),
        ((jnp.zeros((8, 8)), (4, 4), float("nan")), ValueError, r"density must be a fraction in \[0, 1\], got nan"),
        (([], (4, 4), 0.5), ValueError, "non-empty list"),
    ],
)
def test_block_topk_bad_input(args, err, match):
    with pytest.raises(err, match=match):
        pit_jax.block_topk(*args)
    # the same inside jit: a Python number is known there too (it was not range-checked
    # under jit until 2026-12-01)
    with pytest.raises(err, match=match):
        jax.jit(lambda: pit_jax.block_topk(*args))()


@pytest.mark.parametrize("density,keep", [(0, 1), (1, 4), (np.float32(0.5), 2), (np.int64(1), 4)])
def test_block_topk_density_numbers(density, keep):
    """Python ints (0 and 1) and NumPy scalars are densities too, eager and under jit."""
    x = jnp.arange(64, dtype=jnp.float32).reshape(8, 8)
    for fn in (pit_jax.block_topk, jax.jit(pit_jax.block_topk, static_argnums=(1, 2))):
        assert int(fn(x, (4, 4), density).live.sum()) == keep


def test_block_topk_reference_is_the_sort():
    """The reference's definition, spelled out once in NumPy."""
    rng, _ = fresh_rng()
    x = randn(rng, (2, 33, 65), jnp.float32)
    live, scores, thr = reference.block_topk(jnp.float32(0.3), x, tile_h=8, tile_w=16)
    s = block_sums64(x, (8, 16)).reshape(2, -1)
    keep = keep_of(0.3, s.shape[1])
    order = np.argsort(-s, axis=1)[:, :keep]
    want = np.zeros_like(s, bool)
    np.put_along_axis(want, order, True, axis=1)
    np.testing.assert_array_equal(np.asarray(live).reshape(2, -1), want)


# block_topk_groups: (lead or list length, K, N, tile, dtype) per group; shapes, dtypes and
# blocks differ between groups; (96, 8192) 1x32 has 24576 scores a matrix, so on Hopper every
# group's select runs in clusters of 2 CTAs with it.
GROUPS = [
    ([3], 96, 192, (32, 64), jnp.float32),
    ((2,), 100, 70, (32, 64), jnp.bfloat16),
    ([2], 768, 230, (32, 1), jnp.float32),
    ((), 96, 8192, (1, 32), jnp.float32),
    ((3,), 65, 33, (1, 32), jnp.float16),
]


def make_group(rng, lead, k, n, dtype):
    """A list of arrays when `lead` is a list ([count]), else one array [*lead, k, n]."""
    if isinstance(lead, list):
        return [randn(rng, (k, n), dtype) for _ in range(lead[0])]
    return randn(rng, (*lead, k, n), dtype)


def on(platform, group):
    return list(put(platform, *group)) if isinstance(group, list) else put(platform, group)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("density", [0.02, 0.5])
def test_block_topk_groups_match_separate_calls(platform, density):
    """One call over groups of other shapes, dtypes and blocks (their selects one launch on
    the GPU) returns exactly what a block_topk call per group does."""
    rng, seed = fresh_rng()
    groups = [make_group(rng, lead, k, n, dt) for lead, k, n, _, dt in GROUPS]
    tiles = [g[3] for g in GROUPS]
    dev = [on(platform, g) for g in groups]
    got = jax.jit(lambda gs, d: pit_jax.block_topk_groups(gs, tiles, d))(dev, jnp.float32(density))
    assert len(got) == len(groups)
    for i, (g, tile, out) in enumerate(zip(groups, tiles, got)):
        msg = f"seed={seed} group {i}"
        x = np.stack(g) if isinstance(g, list) else g
        check_topk(out, x, tile, density, msg)
        one = jax.jit(lambda m, d, tile=tile: pit_jax.block_topk(m, tile, d))(dev[i], jnp.float32(density))
        for a, b in zip(out, one):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=msg)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_block_topk_groups_one_tile_many_groups_and_empty(platform):
    """One block for every group; the most groups a call takes (16); a group without
    matrices gets empty results."""
    rng, seed = fresh_rng()
    groups = [randn(rng, (2, 8 + 8 * i, 64 + 16 * (i % 3)), jnp.float32) for i in range(15)]
    groups.append(jnp.zeros((0, 8, 8), jnp.float32))
    got = jax.jit(lambda gs: pit_jax.block_topk_groups(gs, (8, 16), 0.3))([put(platform, g) for g in groups])
    for i, (g, out) in enumerate(zip(groups[:-1], got)):
        check_topk(out, g, (8, 16), 0.3, f"seed={seed} group {i}")
    assert got[-1].live.shape == (0, 1, 1) and got[-1].thresholds.shape == (0,)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_block_topk_groups_vmap_and_reference(platform):
    rng, seed = fresh_rng()
    xs = put(platform, randn(rng, (3, 32, 64), jnp.float32))
    w = put(platform, randn(rng, (2, 48, 40), jnp.bfloat16))
    f = lambda x: pit_jax.block_topk_groups([x, [w[0], w[1]]], [(8, 16), (16, 8)], 0.4)  # noqa: E731
    got = jax.jit(jax.vmap(f))(xs)
    assert got[0].live.shape == (3, 4, 4) and got[1].live.shape == (3, 2, 3, 5)
    for i in range(3):
        one = f(xs[i])
        for g in range(2):
            for a, b in zip(got[g], one[g]):
                np.testing.assert_array_equal(np.asarray(a[i]), np.asarray(b), err_msg=f"seed={seed}")
    with pit_jax.use_reference(ops=("index",)):
        ref = jax.jit(f)(xs[0])
    one = jax.jit(f)(xs[0])
    for g in range(2):
        for a, b in zip(ref[g], one[g]):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"seed={seed}")


@pytest.mark.parametrize(
    "args,err,match",
    [
        (([], (4, 4), 0.5), ValueError, "groups must be a non-empty list"),
        (([jnp.zeros((8, 8))] * 17, (4, 4), 0.5), ValueError, "at most 16 groups"),
        (([jnp.zeros((8, 8))] * 2, [(4, 4)] * 3, 0.5), ValueError, "micro_tiles must be one block"),
        (([jnp.zeros((8, 8)), [jnp.zeros((8, 8)), jnp.zeros((8, 9))]], (4, 4), 0.5), ValueError,
         r"groups\[1\]\[1\] must match"),
        (([jnp.zeros((8, 8)), jnp.zeros((8, 8), jnp.int32)], (4, 4), 0.5), TypeError, r"groups\[1\] must be float32"),
        (([jnp.zeros((8, 8))], [(0, 4)], 0.5), ValueError, "micro_tile must be positive"),
    ],
)
def test_block_topk_groups_bad_input(args, err, match):
    with pytest.raises(err, match=match):
        pit_jax.block_topk_groups(*args)
