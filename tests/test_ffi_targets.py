"""The raw FFI contract of every pit_jax target (docs/kernels.md), through jax.ffi.ffi_call.

Each case runs on every platform JAX sees (the CPU handlers always, the CUDA ones on a
GPU) against a float64 NumPy reference, on fresh random data each run. Outputs are
poisoned with NaN bytes before every kernel, so an element a kernel fails to write
shows up as NaN. Operands are dense random data; the index comes from a separate
random mask, so a handler that ignores its lists (reads masked-out tiles) is caught.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import (ACTIVATION_NAMES, PACKED_ROW_PAD, PLATFORMS, activation64, assert_call_raises, check_close,
                         dname, f64, fresh_rng, randn, run, tiled_sparse)

import pit_jax
from pit_jax.primitives._lowering import pack_live_rows  # the lowering's pit_sread_live call

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
DENSITIES = [0.0, 0.05, 0.5, 1.0]
# Max error allowed: pit_testing.FFI_TOL (check_close).


# NaN-poison native outputs for the whole module (fixture in conftest.py).
pytestmark = pytest.mark.usefixtures("poison_outputs")


# -- helpers ------------------------------------------------------------------------



def ffi(target, shape, dtype, *args, aliases=None, **attrs):
    """One raw call: ints go as i64 attributes, bools as bool."""
    attrs = {k: v if isinstance(v, bool) else np.int64(v) for k, v in attrs.items()}
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(tuple(shape), dtype), input_output_aliases=aliases)
    return call(*args, **attrs)





def resolve(tile, shape):
    """A micro-tile spec with None meaning the whole extent, against a [rows, cols] matrix."""
    return tuple(s if t is None else t for t, s in zip(tile, shape[-2:]))


def grid(shape, tile):
    return math.ceil(shape[-2] / tile[0]), math.ceil(shape[-1] / tile[1])


def expand(tile_mask, tile, shape):
    """Tile mask [..., tr, tc] -> element mask [..., rows, cols]."""
    m = np.repeat(np.repeat(tile_mask, tile[0], -2), tile[1], -1)
    return m[..., : shape[-2], : shape[-1]]


def flat_listed(tiles, count, tr, tc):
    """bool [..., tr, tc]: the tiles of a flat list's first min(count, capacity) slots."""
    lead, cap = count.shape, tiles.shape[-1]
    m = np.zeros((*lead, tr * tc), bool)
    for b in np.ndindex(*lead):
        ids = tiles[b][: min(max(int(count[b]), 0), cap)]
        assert (ids >= 0).all() and (ids < tr * tc).all(), f"bad live ids {ids}"
        m[b][ids] = True
    return m.reshape(*lead, tr, tc)


def grouped_listed(lists, counts, reduce_cols, tr, tc):
    """bool [..., tr, tc] from grouped lists: per tile row (reduce_cols) or per tile column."""
    lead, cap = counts.shape[:-1], lists.shape[-1]
    m = np.zeros((*lead, tr, tc), bool)
    for b in np.ndindex(*lead):
        for g in range(counts.shape[-1]):
            ids = lists[b][g][: min(max(int(counts[b][g]), 0), cap)]
            if reduce_cols:
                m[b][g, ids] = True
            else:
                m[b][ids, g] = True
    return m


def op(x, trans):
    return np.swapaxes(x, -1, -2) if trans else x


def batched_product(a, b, c_lead, trans_a, trans_b):
    """Reference of the batch convention: C[c] sums op_a(A) @ op_b(B) over its entries."""
    a2, b2 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    cb = math.prod(c_lead)
    batch = max(a2.shape[0], b2.shape[0], cb)
    A = np.repeat(a2, batch // a2.shape[0], axis=0)
    B = np.repeat(b2, batch // b2.shape[0], axis=0)
    p = op(A, trans_a) @ op(B, trans_b)
    return p.reshape(cb, batch // cb, *p.shape[-2:]).sum(1).reshape(*c_lead, *p.shape[-2:])


def full_entries(x_lead, batch):
    """Which entry of an operand with leading dims x_lead each of `batch` entries reads."""
    n = math.prod(x_lead)
    return np.arange(batch) // (batch // n)


# -- pit_sread / pit_swrite -----------------------------------------------------------

PACK_TILES = [
    ((32, 1), (100, 70)),
    ((1, 64), (33, 130)),
    ((32, 64), (70, 150)),
    ((1, None), (37, 50)),  # token rows
    ((6, None), (45, 33)),  # (h, K) row blocks
    ((3, 5), (40, 52)),
]
PACK_CASES = [(t, s, d) for (t, s), d in itertools.product(PACK_TILES, DENSITIES)]
PACK_IDS = [f"{t}-{s}-d{d}" for t, s, d in PACK_CASES]


def pack_reference(x, tiles, count, tile):
    """float64 packed [..., capacity, h, w] for x [..., R, C]."""
    x = f64(x)
    *lead, rows, cols = x.shape
    h, w = tile
    tc = math.ceil(cols / w)
    cap = tiles.shape[-1]
    out = np.zeros((*lead, cap, h, w))
    for b in np.ndindex(*lead):
        for s in range(min(int(count[b]), cap)):
            r0, c0 = (tiles[b][s] // tc) * h, (tiles[b][s] % tc) * w
            blk = x[b][r0 : r0 + h, c0 : c0 + w]
            out[b][s, : blk.shape[0], : blk.shape[1]] = blk
    return out


def build_index(rng, shape, tile, density, capacity=None):
    """A random bool mask over `shape` and the jit-able function that indexes it."""
    mask, live = tiled_sparse(rng, shape, tile, density, jnp.bool_)
    return mask, live, lambda m: pit_jax.index(m, tile, capacity=capacity, group_by="both")


def sread_case(target, platform, dtype, tile, shape, density):
    """Runs `target` (pit_sread or pit_sread_live) on random x with an index built in the
    same jit; returns (x, tile, lead, live, packed, tiles, count, msg)."""
    rng, seed = fresh_rng()
    tile = resolve(tile, shape)
    lead = (2,) if seed % 2 else (2, 2)
    shape = (*lead, *shape)
    x = randn(rng, shape, dtype)
    mask, live, index = build_index(rng, shape, tile, density)

    def f(m, x):
        idx = index(m)
        packed = ffi(target, (*lead, idx.capacity, *tile), dtype, x, idx.tiles, idx.count,
                     tile_h=tile[0], tile_w=tile[1])
        return packed, idx.tiles, idx.count

    packed, tiles, count = run(platform, f, mask, x)
    return x, tile, lead, live, packed, tiles, count, f"seed={seed} lead={lead}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("tile,shape,density", PACK_CASES, ids=PACK_IDS)
def test_sread(platform, dtype, tile, shape, density):
    x, tile, lead, live, packed, tiles, count, msg = sread_case("pit_sread", platform, dtype, tile, shape, density)
    np.testing.assert_array_equal(flat_listed(tiles, count, *live.shape[-2:]), live, err_msg=f"{msg}: index")
    got = f64(packed)
    assert not np.isnan(got).any(), f"{msg}: NaN in packed (an element was not written)"
    np.testing.assert_array_equal(got, pack_reference(x, tiles, count, tile), err_msg=msg)
    for b in np.ndindex(*lead):
        assert (got[b][int(count[b]) :] == 0).all(), f"{msg}: slots past the count must be zero"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("tile,shape,density", PACK_CASES, ids=PACK_IDS)
def test_sread_live(platform, dtype, tile, shape, density):
    """pit_sread_live: the listed slots as pit_sread writes them, zeros in the slots whose
    rows lie below the next multiple of 192 rows, and (on the GPU) the other slots past the
    count left unwritten: still the NaN poison."""
    x, tile, lead, _, packed, tiles, count, msg = sread_case("pit_sread_live", platform, dtype, tile, shape, density)
    got, want = f64(packed), pack_reference(x, tiles, count, tile)
    cap = got.shape[-3]
    for b in np.ndindex(*lead):
        n = min(int(count[b]), cap)
        np.testing.assert_array_equal(got[b][:n], want[b][:n], err_msg=f"{msg}: live slots")
        # Slots whose first row lies below the row count rounded up to 192 are zeros.
        pad_rows = -(-(n * tile[0]) // PACKED_ROW_PAD) * PACKED_ROW_PAD
        pad_slots = [s for s in range(n, cap) if s * tile[0] < pad_rows]
        assert (got[b][pad_slots] == 0).all(), f"{msg}: padding slots must be zero"
        rest = [s for s in range(n, cap) if s not in pad_slots]
        if platform == "gpu" and rest:
            assert np.isnan(got[b][rest]).all(), f"{msg}: slots past the padding must be left unwritten"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("tile,shape,density", PACK_CASES, ids=PACK_IDS)
def test_swrite(platform, accumulate, tile, shape, density):
    rng, seed = fresh_rng()
    dtype = DTYPES[seed % 3]
    tile = resolve(tile, shape)
    lead = (3,)
    shape = (*lead, *shape)
    base = randn(rng, shape, dtype)  # non-zero: untouched elements must keep it
    mask, live, index = build_index(rng, shape, tile, density)
    cap = math.prod(grid(shape, tile))
    packed = randn(rng, (*lead, cap, *tile), dtype)

    def f(m, p, base):
        idx = index(m)
        out = ffi("pit_swrite", shape, dtype, p, idx.tiles, idx.count, base, aliases={3: 0}, accumulate=accumulate)
        return out, idx.tiles, idx.count

    out, tiles, count = run(platform, f, mask, packed, base)
    msg = f"seed={seed} dtype={dname(dtype)}"
    listed = expand(flat_listed(tiles, count, *grid(shape, tile)), tile, shape)
    np.testing.assert_array_equal(listed, expand(live, tile, shape), err_msg=f"{msg}: index")
    # Reference: unpack into a dense matrix through the same slot -> tile mapping.
    ref = f64(base)
    tc = grid(shape, tile)[1]
    for b in np.ndindex(*lead):
        for s in range(min(int(count[b]), cap)):
            r0, c0 = (tiles[b][s] // tc) * tile[0], (tiles[b][s] % tc) * tile[1]
            blk = ref[b][r0 : r0 + tile[0], c0 : c0 + tile[1]]
            p = f64(packed[b][s])[: blk.shape[0], : blk.shape[1]]
            blk[...] = blk + p if accumulate else p
    exact = ~listed if accumulate else np.ones(shape, bool)
    check_close(out, ref, dtype, msg, exact=exact)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_sread_swrite_count_past_capacity(platform):
    """A count above the capacity (dropped tiles) is clamped; round trip keeps listed tiles."""
    rng, seed = fresh_rng()
    shape, tile = (2, 50, 37), (4, 8)
    x = randn(rng, shape, jnp.bfloat16)
    base = randn(rng, shape, jnp.bfloat16)
    cap = 7

    def f(x, base):
        idx = pit_jax.index(x, tile, capacity=cap)
        packed = ffi("pit_sread", (2, cap, *tile), jnp.bfloat16, x, idx.tiles, idx.count, tile_h=4, tile_w=8)
        out = ffi("pit_swrite", shape, jnp.bfloat16, packed, idx.tiles, idx.count, base, aliases={3: 0},
                  accumulate=False)
        return packed, out, idx.tiles, idx.count

    packed, out, tiles, count = run(platform, f, x, base)
    msg = f"seed={seed}"
    assert (count > cap).all(), f"{msg}: every tile is live, count must exceed the capacity"
    np.testing.assert_array_equal(f64(packed), pack_reference(x, tiles, count, tile), err_msg=msg)
    listed = expand(flat_listed(tiles, count, *grid(shape, tile)), tile, shape)
    np.testing.assert_array_equal(f64(out), np.where(listed, f64(x), f64(base)), err_msg=msg)


# -- pit_row_gather_matmul -------------------------------------------------------------

# (h, (M, K, N)), on M not a multiple of h.
ROW_SHAPES = [(1, (37, 50, 20)), (3, (40, 33, 65)), (32, (100, 64, 48)), (16, (16, 7, 130))]
ROW_LEADS = {"single": ((), ()), "batched": ((3,), (3,)), "shared_b": ((3,), ()), "nested": ((2, 3), (2,))}
# The fused epilogue: (bias, activation code of the `activation` attribute).
ROW_EPILOGUES = [(False, 0), (True, 0), (True, 1), (True, 2), (False, 3), (True, 3), (True, 4)]
ROW_CASES = [
    (h, s, d, DTYPES[i % 3], bool(i % 2), list(ROW_LEADS)[(i // 2) % 4], bool((i // 3) % 2),
     ROW_EPILOGUES[i % len(ROW_EPILOGUES)])
    for i, ((h, s), d) in enumerate(itertools.product(ROW_SHAPES, DENSITIES))
]




@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
    "h,dims,density,dtype,trans_b,lead,allow_tf32,epilogue",
    ROW_CASES,
    ids=[f"h{c[0]}-{c[1]}-d{c[2]}-{dname(c[3])}-tb{int(c[4])}-{c[5]}-tf32{int(c[6])}-b{int(c[7][0])}a{c[7][1]}"
         for c in ROW_CASES],
)
def test_row_gather_matmul(platform, h, dims, density, dtype, trans_b, lead, allow_tf32, epilogue):
    rng, seed = fresh_rng()
    m, k, n = dims
    a_lead, b_lead = ROW_LEADS[lead]
    a = randn(rng, (*a_lead, m, k), dtype)
    b = randn(rng, (*b_lead, *((n, k) if trans_b else (k, n))), dtype)
    has_bias, act = epilogue
    bias = randn(rng, (n,), dtype) if has_bias else np.zeros((0,), dtype)
    # The dead rows' value is the caller's (act(bias), as pit_jax passes it): any row here.
    dead = randn(rng, (n,), dtype) if has_bias else np.zeros((0,), dtype)
    mask, live, index = build_index(rng, a.shape, (h, k), density)
    # Half the cases leave the dead rows unwritten (skip_dead): NaN there, the CPU's fill or
    # the poison, which shows the kernel stored nothing.
    skip = trans_b != allow_tf32

    def f(mk, a, b, bias, dead):
        idx = index(mk)
        c = ffi("pit_row_gather_matmul", (*a_lead, m, n), dtype, a, b, idx.tiles, idx.count, bias, dead, tile_h=h,
                trans_b=trans_b, allow_tf32=allow_tf32, activation=act, skip_dead=skip)
        return c, idx.tiles, idx.count

    c, tiles, count = run(platform, f, mask, a, b, bias, dead)
    msg = f"seed={seed}"
    rows = expand(flat_listed(tiles, count, math.ceil(m / h), 1), (h, 1), (m, 1))  # [..., M, 1]
    np.testing.assert_array_equal(rows, expand(live, (h, 1), (m, 1)), err_msg=f"{msg}: index")
    b64 = f64(bias) if has_bias else 0.0
    live_ref = activation64(batched_product(f64(a), f64(b), a_lead, False, trans_b) + b64, ACTIVATION_NAMES[act])
    if skip:
        dead_rows = np.broadcast_to(~rows, live_ref.shape)
        assert np.isnan(f64(c)[dead_rows]).all(), f"{msg}: skip_dead, yet a dead row was written"
        check_close(np.where(dead_rows, 0.0, f64(c)), np.where(rows, live_ref, 0.0), dtype, msg, allow_tf32)
        return
    ref = np.where(rows, live_ref, f64(dead) if has_bias else 0.0)
    # Dead rows are an exact copy of the dead row (zeros without one).
    check_close(c, ref, dtype, msg, allow_tf32, exact=np.broadcast_to(~rows, ref.shape))


# -- pit_row_gather_matmul_packed -------------------------------------------------------

# (tile_h, (M, K, N), density, dtype, a's leading dims): rows, K and N off the tile sizes,
# row blocks, batches, nothing / everything live, every dtype (f32: its kernels gather).
ROW_PACKED_CASES = [
    (1, (200, 136, 264), 0.3, jnp.bfloat16, ()),
    (4, (96, 72, 520), 0.5, jnp.float16, (3,)),
    (1, (300, 64, 64), 0.0, jnp.bfloat16, ()),
    (1, (333, 64, 128), 1.0, jnp.bfloat16, (2,)),
    (2, (130, 40, 48), 0.4, jnp.float32, ()),
]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("h,dims,density,dtype,lead", ROW_PACKED_CASES,
                         ids=[f"h{c[0]}-{c[1]}-d{c[2]}-{dname(c[3])}-{c[4]}" for c in ROW_PACKED_CASES])
def test_row_gather_matmul_packed(platform, h, dims, density, dtype, lead):
    """pit_row_gather_matmul_packed, given a's listed rows packed by pit_sread_live with the
    same list: the result of pit_row_gather_matmul (the sm_90a kernel reads the packed rows
    by TMA, every other path gathers from a)."""
    rng, seed = fresh_rng()
    m, k, n = dims
    a = randn(rng, (*lead, m, k), dtype)
    b = randn(rng, (k, n), dtype)
    mask, live, index = build_index(rng, a.shape, (h, k), density)
    empty = np.zeros((0,), dtype)

    def f(mk, a, b):
        idx = index(mk)
        packed = pack_live_rows(a, idx.tiles, idx.count, tile_h=h)
        c = ffi("pit_row_gather_matmul_packed", (*lead, m, n), dtype, a, packed, b, idx.tiles, idx.count, empty, empty,
                tile_h=h, trans_b=False, allow_tf32=False, activation=0, skip_dead=False)
        return c, idx.tiles, idx.count

    c, tiles, count = run(platform, f, mask, a, b)
    rows = expand(flat_listed(tiles, count, math.ceil(m / h), 1), (h, 1), (m, 1))
    ref = np.where(rows, batched_product(f64(a), f64(b), lead, False, False), 0.0)
    check_close(c, ref, dtype, f"seed={seed}", False, exact=np.broadcast_to(~rows, ref.shape))


@pytest.mark.parametrize("platform", [p for p in PLATFORMS if p == "gpu"])
def test_row_gather_matmul_packed_reads_the_packed_rows_gpu(platform):
    """On sm_90 the default form reads A from a_packed: packed rows scaled by 2 give twice
    the product (a size whose static tiles take the clustered form, 8192 x 4096)."""
    from pit_jax.primitives import _lowering

    if not _lowering.cuda_is_sm90():
        pytest.skip("A by TMA is the sm_90a kernel's")
    rng, seed = fresh_rng()
    m, k, n = 8192, 256, 4096
    a = randn(rng, (m, k), jnp.bfloat16)
    b = randn(rng, (k, n), jnp.bfloat16)
    mask, live, index = build_index(rng, a.shape, (1, k), 0.3)
    empty = np.zeros((0,), jnp.bfloat16)

    def f(mk, a, b):
        idx = index(mk)
        scaled = (pack_live_rows(a, idx.tiles, idx.count, tile_h=1).astype(jnp.float32) * 2).astype(a.dtype)
        return ffi("pit_row_gather_matmul_packed", (m, n), a.dtype, a, scaled, b, idx.tiles, idx.count, empty, empty,
                   tile_h=1, trans_b=False, allow_tf32=False, activation=0, skip_dead=False)

    c = run(platform, f, mask, a, b)
    rows = live  # [M, 1]: tile (1, K)
    ref = np.where(rows, 2 * (f64(a) @ f64(b)), 0.0)
    check_close(c, ref, jnp.bfloat16, f"seed={seed}", False, exact=np.broadcast_to(~rows, ref.shape))


# -- pit_stile_matmul ------------------------------------------------------------------

STILE_DIMS = (70, 100, 90)  # M, K, N: every stored dim >= 64 so (1, 64) and (32, 64) fit
STILE_TILES = [(32, 1), (1, 64), (32, 64), (3, 5), (8, None)]  # (8, None): (h, whole rows)
# (a leading dims, b leading dims, c leading dims): shared operands and batch sums.
LEADS = {
    "single": ((), (), ()),
    "batched": ((3,), (3,), (3,)),
    "shared_b": ((3,), (), (3,)),
    "shared_a": ((), (3,), (3,)),
    "sum": ((4,), (4,), ()),
    "sum2": ((4,), (4,), (2,)),
    "mixed": ((4,), (2,), (2,)),
    "nested": ((2, 3), (2,), (2, 3)),
}
LAYOUTS = list(itertools.product([False, True], repeat=4))  # sparse_b, trans_a, trans_b, trans_c
STILE_CASES = [
    (*lay, tile, DENSITIES[i % 4], DTYPES[(i // 4) % 3], list(LEADS)[i % 8], bool((i // 2) % 2))
    for i, (lay, tile) in enumerate(itertools.product(LAYOUTS, STILE_TILES))
]
# Every density x dtype once more on a fixed layout.
STILE_CASES += [
    (False, False, False, False, (32, 1), d, t, "batched", False) for d, t in itertools.product(DENSITIES, DTYPES)
]


def stile_case(rng, seed, sparse_b, trans_a, trans_b, trans_c, dtype, lead, dims=STILE_DIMS):
    m, k, n = dims
    a_lead, b_lead, c_lead = LEADS[lead]
    a = randn(rng, (*a_lead, *((k, m) if trans_a else (m, k))), dtype)
    b = randn(rng, (*b_lead, *((n, k) if trans_b else (k, n))), dtype)
    c_shape = (*c_lead, *((n, m) if trans_c else (m, n)))
    return a, b, c_shape, c_lead


def stile_reference(a, b, s_listed_elems, sparse_b, trans_a, trans_b, trans_c, c_lead):
    a, b = f64(a), f64(b)
    if sparse_b:
        b = b * s_listed_elems
    else:
        a = a * s_listed_elems
    return op(batched_product(a, b, c_lead, trans_a, trans_b), trans_c)


def stile_zero(counts, s_lead, sparse_b, gsz, m, n, a_lead, b_lead, c_lead, trans_c):
    """Elements of C every batch entry of whose group has an empty list: exactly zero."""
    cb = math.prod(c_lead)
    batch = max(math.prod(a_lead), math.prod(b_lead), cb)
    empty = counts.reshape(-1, counts.shape[-1])[full_entries(s_lead, batch)] <= 0  # [batch, groups]
    empty = empty.reshape(cb, batch // cb, -1).all(1)
    p = n if sparse_b else m
    lines = np.repeat(empty, gsz, axis=-1)[:, :p]  # [cb, P]: rows (S = A) or columns (S = B) of C
    z = lines[:, None, :] if sparse_b else lines[:, :, None]
    z = np.broadcast_to(z, (cb, m, n))
    return op(z, trans_c).reshape(*c_lead, *((n, m) if trans_c else (m, n)))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
    "sparse_b,trans_a,trans_b,trans_c,tile,density,dtype,lead,allow_tf32",
    STILE_CASES,
    ids=[
        f"sb{int(c[0])}{int(c[1])}{int(c[2])}{int(c[3])}-{c[4]}-d{c[5]}-{dname(c[6])}-{c[7]}-tf32{int(c[8])}"
        for c in STILE_CASES
    ],
)
def test_stile_matmul(platform, sparse_b, trans_a, trans_b, trans_c, tile, density, dtype, lead, allow_tf32):
    check_stile_matmul(platform, sparse_b, trans_a, trans_b, trans_c, tile, density, dtype, lead, allow_tf32)


# (32, 64) weight blocks with the rows of x, w and C whole 16-byte vectors: the Hopper
# weight-block kernel's cases (cuda/kernels/sm90/wblock_gemm.cu): the forward and the dx,
# edges that are not tile multiples, more than one 128 x 128 tile of C, batches.
WBLOCK_DIMS = [(200, 168, 200), (130, 1000, 264), (64, 64, 64), (300, 2048, 136), (8, 72, 64)]
WBLOCK_CASES = [
    (trans_b, dims, DENSITIES[i % 4], (jnp.bfloat16, jnp.float16)[i % 2], ("single", "batched", "shared_a", "shared_b")[(i // 2) % 4])
    for i, (trans_b, dims) in enumerate(itertools.product([False, True], WBLOCK_DIMS))
]
WBLOCK_CASES += [(tb, (200, 168, 200), d, jnp.bfloat16, "batched") for tb in (False, True) for d in (0.0, 1.0)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
    "trans_b,dims,density,dtype,lead", WBLOCK_CASES,
    ids=[f"tb{int(c[0])}-{'x'.join(map(str, c[1]))}-d{c[2]}-{dname(c[3])}-{c[4]}" for c in WBLOCK_CASES],
)
def test_stile_matmul_weight_blocks(platform, trans_b, dims, density, dtype, lead):
    check_stile_matmul(platform, True, False, trans_b, False, (32, 64), density, dtype, lead, False, dims=dims)


def check_stile_matmul(platform, sparse_b, trans_a, trans_b, trans_c, tile, density, dtype, lead, allow_tf32,
                       dims=STILE_DIMS):
    rng, seed = fresh_rng()
    a, b, c_shape, c_lead = stile_case(rng, seed, sparse_b, trans_a, trans_b, trans_c, dtype, lead, dims=dims)
    s = b if sparse_b else a
    s_lead = s.shape[:-2]
    tile = resolve(tile, s.shape)
    reduce_cols = trans_b if sparse_b else not trans_a
    mask, live, index = build_index(rng, s.shape, tile, density)

    def f(mk, a, b):
        idx = index(mk)
        lists, counts = (idx.row_tiles, idx.row_count) if reduce_cols else (idx.col_tiles, idx.col_count)
        c = ffi("pit_stile_matmul", c_shape, dtype, a, b, lists, counts, sparse_b=sparse_b, tile_h=tile[0],
                tile_w=tile[1], trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, allow_tf32=allow_tf32)
        return c, lists, counts

    c, lists, counts = run(platform, f, mask, a, b)
    msg = f"seed={seed} reduce_cols={reduce_cols}"
    listed = grouped_listed(lists, counts, reduce_cols, *grid(s.shape, tile))
    np.testing.assert_array_equal(listed, live, err_msg=f"{msg}: index")
    ref = stile_reference(a, b, expand(listed, tile, s.shape), sparse_b, trans_a, trans_b, trans_c, c_lead)
    m, n = dims[0], dims[2]
    gsz = tile[0] if reduce_cols else tile[1]
    a_lead, b_lead, _ = LEADS[lead]
    zero = stile_zero(counts, s_lead, sparse_b, gsz, m, n, a_lead, b_lead, c_lead, trans_c)
    check_close(c, ref, dtype, msg, allow_tf32, exact=zero)


# A flat list as the one group: the whole stored extent on the group axis, e.g. the M
# axis's weight gradient (x o m)^T @ dy (S = A, trans_a, micro-tile (h, M)).
FLAT_CASES = [
    # sparse_b, trans_a, trans_b, tile (None = whole extent), capacity
    (False, True, False, (8, None), None),
    (False, True, False, (1, None), 5),  # count past the capacity: clamped
    (False, False, False, (None, 16), None),
    (True, False, False, (4, None), None),
    (True, False, True, (None, 7), 3),
]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("sparse_b,trans_a,trans_b,tile,capacity", FLAT_CASES, ids=[str(c) for c in FLAT_CASES])
@pytest.mark.parametrize("density", [0.05, 0.5, 1.0])
def test_stile_matmul_flat_list(platform, sparse_b, trans_a, trans_b, tile, capacity, density):
    rng, seed = fresh_rng()
    dtype = DTYPES[seed % 3]
    lead = "sum" if seed % 2 else "batched"
    a, b, c_shape, c_lead = stile_case(rng, seed, sparse_b, trans_a, trans_b, False, dtype, lead, dims=(50, 77, 40))
    s = b if sparse_b else a
    tile = resolve(tile, s.shape)
    reduce_cols = trans_b if sparse_b else not trans_a
    assert (tile[0] if reduce_cols else tile[1]) == s.shape[-2 if reduce_cols else -1]  # one group
    mask, live, index = build_index(rng, s.shape, tile, density, capacity)

    def f(mk, a, b):
        idx = index(mk)
        lists, counts = idx.tiles[..., None, :], idx.count[..., None]
        c = ffi("pit_stile_matmul", c_shape, dtype, a, b, lists, counts, sparse_b=sparse_b, tile_h=tile[0],
                tile_w=tile[1], trans_a=trans_a, trans_b=trans_b, trans_c=False, allow_tf32=False)
        return c, idx.tiles, idx.count

    c, tiles, count = run(platform, f, mask, a, b)
    msg = f"seed={seed} dtype={dname(dtype)} lead={lead}"
    listed = flat_listed(tiles, count, *grid(s.shape, tile))
    if capacity is None:
        np.testing.assert_array_equal(listed, live, err_msg=f"{msg}: index")
    ref = stile_reference(a, b, expand(listed, tile, s.shape), sparse_b, trans_a, trans_b, False, c_lead)
    check_close(c, ref, dtype, msg)


# -- pit_sdd_matmul --------------------------------------------------------------------

SDD_DIMS = (70, 45, 130)  # M, K, N
SDD_TILES = [(32, 1), (1, 64), (32, 64), (3, 5), (16, None)]  # (16, None): (h, N) row blocks of C
SDD_LEADS = {  # a, b, c (= index) leading dims
    "single": ((), (), ()),
    "batched": ((3,), (3,), (3,)),
    "shared_b": ((3,), (), (3,)),
    "shared_a": ((), (3,), (3,)),
    "sum": ((4,), (4,), ()),
    "sum2": ((2, 2), (2, 2), (2,)),
}
SDD_CASES = [
    (ta, tb, tile, DENSITIES[i % 4], DTYPES[(i // 4) % 3], list(SDD_LEADS)[i % 6], bool((i // 2) % 2))
    for i, ((ta, tb), tile) in enumerate(itertools.product(itertools.product([False, True], repeat=2), SDD_TILES))
]
SDD_CASES += [(False, True, (32, 64), d, t, "sum", False) for d, t in itertools.product(DENSITIES, DTYPES)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
    "trans_a,trans_b,tile,density,dtype,lead,allow_tf32",
    SDD_CASES,
    ids=[f"t{int(c[0])}{int(c[1])}-{c[2]}-d{c[3]}-{dname(c[4])}-{c[5]}-tf32{int(c[6])}" for c in SDD_CASES],
)
def test_sdd_matmul(platform, trans_a, trans_b, tile, density, dtype, lead, allow_tf32):
    check_sdd_matmul(platform, trans_a, trans_b, tile, density, dtype, lead, allow_tf32)


# The weight gradient of a (32, 64)-block-pruned w, dw = (x^T @ dy) ∘ mask (trans_a: x and
# dy as stored), at the shapes sparse training meets: edges that are not tile multiples,
# token counts that are not multiples of 64, BERT's sizes (GPU only), empty and full
# masks, batches summed into dw or kept apart. (A Hopper kernel for these was tried on
# branch wip/wblock-wgrad: docs/notes/sm90_wblock.md.)
SDD_WBLOCK_CASES = [
    ((200, 300, 328), 0.3, jnp.bfloat16, "single"),
    ((200, 300, 328), 0.0, jnp.float16, "single"),
    ((200, 300, 328), 1.0, jnp.bfloat16, "single"),
    ((256, 130, 512), 0.05, jnp.bfloat16, "sum"),
    ((256, 130, 512), 0.5, jnp.float16, "batched"),
    ((256, 130, 512), 0.5, jnp.bfloat16, "shared_a"),
    ((136, 72, 264), 0.4, jnp.bfloat16, "single"),
    ((384, 96, 768), 0.5, jnp.float16, "sum2"),
    ((64, 1000, 64), 1.0, jnp.bfloat16, "sum"),
    ((768, 4096, 3072), 0.02, jnp.bfloat16, "single"),
    ((768, 4096, 2304), 0.2, jnp.bfloat16, "single"),
]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
    "dims,density,dtype,lead", SDD_WBLOCK_CASES,
    ids=[f"{'x'.join(map(str, c[0]))}-d{c[1]}-{dname(c[2])}-{c[3]}" for c in SDD_WBLOCK_CASES],
)
def test_sdd_matmul_weight_blocks(platform, dims, density, dtype, lead):
    if platform == "cpu" and dims[1] >= 4096:
        pytest.skip("BERT-size case: GPU only (the CPU kernel takes minutes)")
    check_sdd_matmul(platform, True, False, (32, 64), density, dtype, lead, False, dims=dims)


def check_sdd_matmul(platform, trans_a, trans_b, tile, density, dtype, lead, allow_tf32, dims=SDD_DIMS):
    rng, seed = fresh_rng()
    m, k, n = dims
    a_lead, b_lead, c_lead = SDD_LEADS[lead]
    a = randn(rng, (*a_lead, *((k, m) if trans_a else (m, k))), dtype)
    b = randn(rng, (*b_lead, *((n, k) if trans_b else (k, n))), dtype)
    c_shape = (*c_lead, m, n)
    tile = resolve(tile, (m, n))
    mask, live, index = build_index(rng, c_shape, tile, density)

    def f(mk, a, b):
        idx = index(mk)
        c = ffi("pit_sdd_matmul", c_shape, dtype, a, b, idx.tiles, idx.count, tile_h=tile[0], tile_w=tile[1],
                trans_a=trans_a, trans_b=trans_b, allow_tf32=allow_tf32)
        return c, idx.tiles, idx.count

    c, tiles, count = run(platform, f, mask, a, b)
    msg = f"seed={seed}"
    listed = flat_listed(tiles, count, *grid(c_shape, tile))
    np.testing.assert_array_equal(listed, live, err_msg=f"{msg}: index")
    keep = expand(listed, tile, c_shape)
    ref = np.where(keep, batched_product(f64(a), f64(b), c_lead, trans_a, trans_b), 0.0)
    check_close(c, ref, dtype, msg, allow_tf32, exact=~keep)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_sdd_matmul_count_past_capacity(platform):
    rng, seed = fresh_rng()
    m, k, n, tile, cap = 40, 24, 48, (8, 16), 5
    a, b = randn(rng, (2, m, k), jnp.float32), randn(rng, (2, k, n), jnp.float32)

    def f(a, b):
        idx = pit_jax.index(jnp.ones((2, m, n), jnp.bool_), tile, capacity=cap)
        c = ffi("pit_sdd_matmul", (2, m, n), jnp.float32, a, b, idx.tiles, idx.count, tile_h=tile[0],
                tile_w=tile[1], trans_a=False, trans_b=False, allow_tf32=False)
        return c, idx.tiles, idx.count

    c, tiles, count = run(platform, f, a, b)
    assert (count == 15).all()
    keep = expand(flat_listed(tiles, count, *grid((m, n), tile)), tile, (2, m, n))
    ref = np.where(keep, f64(a) @ f64(b), 0.0)
    check_close(c, ref, jnp.float32, f"seed={seed}", exact=~keep)


# -- robustness: ids that are not tiles of the grid -------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
def test_out_of_range_ids_never_read(platform):
    """Live slots holding ids outside the grid are skipped (or the call fails naming the
    target): never an out-of-bounds access."""
    rng, seed = fresh_rng()
    m, k, n, tile = 24, 16, 20, (8, 4)  # C grid 3 x 5 = 15 tiles
    a, b = randn(rng, (m, k), jnp.float32), randn(rng, (k, n), jnp.float32)
    tiles = np.array([3, 15, 1 << 30, 7, -5, 0], np.int32)
    count = np.array(6, np.int32)

    def f(a, b, t, cnt):
        return ffi("pit_sdd_matmul", (m, n), jnp.float32, a, b, t, cnt, tile_h=8, tile_w=4, trans_a=False,
                   trans_b=False, allow_tf32=False)

    try:
        c = run(platform, f, a, b, tiles, count)
    except Exception as err:  # reporting the bad ids is allowed too
        assert "pit_sdd_matmul" in str(err), err
        return
    keep = expand(flat_listed(np.array([3, 7, 0], np.int32), np.array(3), 3, 5), tile, (m, n))
    check_close(c, np.where(keep, f64(a) @ f64(b), 0.0), jnp.float32, f"seed={seed}", exact=~keep)


# -- bad input: an error naming the target, never a crash ------------------------------


def _s32(*shape):
    return np.zeros(shape, np.int32)


BAD_CALLS = {
    "row_gather_inner_dims": lambda: ffi(
        "pit_row_gather_matmul", (8, 6), jnp.float32, jnp.ones((8, 5)), jnp.ones((4, 6)), _s32(8), _s32(),
        jnp.zeros((0,)), jnp.zeros((0,)), tile_h=1, trans_b=False, allow_tf32=False, activation=0,
        skip_dead=False),
    "row_gather_dtypes": lambda: ffi(
        "pit_row_gather_matmul", (8, 6), jnp.float32, jnp.ones((8, 4)), jnp.ones((4, 6), jnp.bfloat16), _s32(8),
        _s32(), jnp.zeros((0,)), jnp.zeros((0,)), tile_h=1, trans_b=False, allow_tf32=False, activation=0,
        skip_dead=False),
    "row_gather_bias_shape": lambda: ffi(
        "pit_row_gather_matmul", (8, 6), jnp.float32, jnp.ones((8, 4)), jnp.ones((4, 6)), _s32(8), _s32(),
        jnp.zeros((5,)), jnp.zeros((0,)), tile_h=1, trans_b=False, allow_tf32=False, activation=0,
        skip_dead=False),
    "row_gather_dead_row_shape": lambda: ffi(
        "pit_row_gather_matmul", (8, 6), jnp.float32, jnp.ones((8, 4)), jnp.ones((4, 6)), _s32(8), _s32(),
        jnp.zeros((6,)), jnp.zeros((2, 3)), tile_h=1, trans_b=False, allow_tf32=False, activation=0,
        skip_dead=False),
    "row_gather_bias_dtype": lambda: ffi(
        "pit_row_gather_matmul", (8, 6), jnp.float32, jnp.ones((8, 4)), jnp.ones((4, 6)), _s32(8), _s32(),
        jnp.zeros((6,), jnp.bfloat16), jnp.zeros((0,)), tile_h=1, trans_b=False, allow_tf32=False, activation=0,
        skip_dead=False),
    "row_gather_activation": lambda: ffi(
        "pit_row_gather_matmul", (8, 6), jnp.float32, jnp.ones((8, 4)), jnp.ones((4, 6)), _s32(8), _s32(),
        jnp.zeros((0,)), jnp.zeros((0,)), tile_h=1, trans_b=False, allow_tf32=False, activation=7,
        skip_dead=False),
    "packed_rows_shape": lambda: ffi(
        "pit_row_gather_matmul_packed", (8, 6), jnp.float32, jnp.ones((8, 4)), jnp.ones((7, 4)), jnp.ones((4, 6)),
        _s32(8), _s32(), jnp.zeros((0,)), jnp.zeros((0,)), tile_h=1, trans_b=False, allow_tf32=False, activation=0,
        skip_dead=False),
    "stile_inner_dims": lambda: ffi(
        "pit_stile_matmul", (8, 6), jnp.float32, jnp.ones((8, 5)), jnp.ones((4, 6)), _s32(8, 5), _s32(8),
        sparse_b=False, tile_h=1, tile_w=1, trans_a=False, trans_b=False, trans_c=False, allow_tf32=False),
    "stile_group_count": lambda: ffi(
        "pit_stile_matmul", (8, 6), jnp.float32, jnp.ones((8, 4)), jnp.ones((4, 6)), _s32(3, 4), _s32(3),
        sparse_b=False, tile_h=2, tile_w=1, trans_a=False, trans_b=False, trans_c=False, allow_tf32=False),
    "stile_dtypes": lambda: ffi(
        "pit_stile_matmul", (8, 6), jnp.float16, jnp.ones((8, 4), jnp.float16), jnp.ones((4, 6)), _s32(8, 4),
        _s32(8), sparse_b=False, tile_h=1, tile_w=1, trans_a=False, trans_b=False, trans_c=False, allow_tf32=False),
    "sdd_inner_dims": lambda: ffi(
        "pit_sdd_matmul", (8, 6), jnp.float32, jnp.ones((8, 4)), jnp.ones((6, 3)), _s32(48), _s32(),
        tile_h=1, tile_w=1, trans_a=False, trans_b=True, allow_tf32=False),
    "sdd_dtypes": lambda: ffi(
        "pit_sdd_matmul", (8, 6), jnp.bfloat16, jnp.ones((8, 4), jnp.bfloat16), jnp.ones((4, 6), jnp.float16),
        _s32(48), _s32(), tile_h=1, tile_w=1, trans_a=False, trans_b=False, allow_tf32=False),
    "sdd_index_batch": lambda: ffi(
        "pit_sdd_matmul", (2, 8, 6), jnp.float32, jnp.ones((2, 8, 4)), jnp.ones((4, 6)), _s32(3, 48), _s32(3),
        tile_h=1, tile_w=1, trans_a=False, trans_b=False, allow_tf32=False),
    "sread_index_batch": lambda: ffi(
        "pit_sread", (2, 4, 2, 2), jnp.float32, jnp.ones((2, 4, 4)), _s32(3, 4), _s32(3), tile_h=2, tile_w=2),
    "swrite_dtypes": lambda: ffi(
        "pit_swrite", (4, 4), jnp.float32, jnp.ones((4, 2, 2), jnp.bfloat16), _s32(4), _s32(), jnp.ones((4, 4)),
        aliases={3: 0}, accumulate=False),
}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_is_an_error_naming_the_target(platform, case):
    target = {"row": "pit_row_gather_matmul", "sti": "pit_stile_matmul", "sdd": "pit_sdd_matmul",
              "sre": "pit_sread", "swr": "pit_swrite",
              "pac": r"pit_row_gather_matmul_packed: a_packed must have a's dtype and shape"}[case[:3]]
    assert_call_raises(platform, target, BAD_CALLS[case])


# -- degenerate shapes: empty batches and an empty reduction ---------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
def test_empty_batch_and_empty_reduction(platform):
    def f():
        x = jnp.ones((0, 8, 8))
        t, c = jnp.zeros((0, 16), jnp.int32), jnp.zeros((0,), jnp.int32)
        packed = ffi("pit_sread", (0, 16, 2, 2), jnp.float32, x, t, c, tile_h=2, tile_w=2)
        out = ffi("pit_swrite", (0, 8, 8), jnp.float32, packed, t, c, x, aliases={3: 0}, accumulate=True)
        rg = ffi("pit_row_gather_matmul", (0, 8, 5), jnp.float32, x, jnp.ones((8, 5)), jnp.zeros((0, 8), jnp.int32),
                 c, jnp.zeros((5,)), jnp.zeros((5,)), tile_h=1, trans_b=False, allow_tf32=False, activation=3,
                 skip_dead=False)
        st = ffi("pit_stile_matmul", (0, 8, 5), jnp.float32, x, jnp.ones((8, 5)), jnp.zeros((0, 4, 4), jnp.int32),
                 c[:, None].repeat(4, 1), sparse_b=False, tile_h=2, tile_w=2, trans_a=False, trans_b=False,
                 trans_c=False, allow_tf32=False)
        # K = 0: the product is all zeros, listed tiles included.
        sdd = ffi("pit_sdd_matmul", (6, 5), jnp.float32, jnp.ones((6, 0)), jnp.ones((0, 5)),
                  jnp.arange(6, dtype=jnp.int32), jnp.array(6, jnp.int32), tile_h=1, tile_w=5, trans_a=False,
                  trans_b=False, allow_tf32=False)
        return packed, out, rg, st, sdd

    with jax.default_device(jax.devices(platform)[0]):
        packed, out, rg, st, sdd = jax.tree_util.tree_map(np.asarray, jax.jit(f)())
    assert packed.shape == (0, 16, 2, 2) and out.shape == (0, 8, 8) and rg.shape == (0, 8, 5)
    assert st.shape == (0, 8, 5)
    np.testing.assert_array_equal(sdd, np.zeros((6, 5)))
