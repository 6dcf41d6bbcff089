"""The raw FFI contract of the MoE targets (docs/kernels.md, "MoE"), through jax.ffi.ffi_call.

pit_moe_index, pit_grouped_matmul and pit_grouped_wgrad run on every platform JAX sees
(the CPU handlers always, the CUDA ones on a GPU) against float64 NumPy references, on
fresh random data each run. Outputs are poisoned with NaN bytes before every kernel, so
an element a kernel fails to write shows up. The grouped products take the index that
pit_moe_index builds in the same jit, and the index is checked as a set per group
(order is free): every assignment exactly once, -1 past each count, out-of-range
expert ids (negative too) in the dropped group E.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import (PACKED_ROW_PAD, PLATFORMS, assert_call_raises, check_close, dname, f64, fresh_rng, randn,
                         run)

import pit_jax  # noqa: F401  (registers the FFI targets)


DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
# Max error allowed: pit_testing.FFI_TOL (check_close).

# NaN-poison native outputs for the whole module (fixture in conftest.py).
pytestmark = pytest.mark.usefixtures("poison_outputs")


# -- helpers ------------------------------------------------------------------------



def ffi(target, shapes, dtypes, *args, **attrs):
    """One raw call (one result, or several when `shapes` is a list): ints go as i64 attributes."""
    attrs = {k: v if isinstance(v, bool) else np.int64(v) for k, v in attrs.items()}
    if isinstance(shapes, list):
        out = [jax.ShapeDtypeStruct(tuple(s), d) for s, d in zip(shapes, dtypes)]
    else:
        out = jax.ShapeDtypeStruct(tuple(shapes), dtypes)
    return jax.ffi.ffi_call(target, out)(*args, **attrs)


def moe_index(ids, num_experts):
    lead, a = ids.shape[:-2], ids.shape[-2] * ids.shape[-1]
    return ffi("pit_moe_index", [(*lead, num_experts + 1, a), (*lead, num_experts + 1)], [jnp.int32] * 2, ids,
               num_experts=num_experts)





def routing(rng, lead, t, k, e, pattern):
    """Expert ids [*lead, t, k] (int32).

    uniform: distinct experts per token where k <= e; one: every choice on expert e-1;
    skewed: only the first experts used (the rest empty); dropped: ~1/4 of the ids out of
    range (negative or >= e), the rest uniform.
    """
    n = math.prod(lead) * t
    if pattern == "one":
        ids = np.full((n, k), e - 1)
    elif pattern == "skewed":
        ids = rng.integers(0, max(1, min(e, 3)), size=(n, k))
    elif k <= e <= 256:
        ids = np.argsort(rng.random((n, e)), axis=1)[:, :k]
    else:
        ids = rng.integers(0, e, size=(n, k))
    if pattern == "dropped":
        bad = rng.random((n, k)) < 0.25
        ids = np.where(bad, rng.choice([-1, -7, e, e + 3, 2**31 - 1, -(2**31)], size=(n, k)), ids)
    return np.asarray(ids, np.int64).astype(np.int32).reshape(*lead, t, k)


def groups_of(ids, e):
    """Group of every assignment [..., T*k]: the expert id, or e where it is out of range."""
    flat = ids.reshape(*ids.shape[:-2], -1).astype(np.int64)
    return np.where((flat >= 0) & (flat < e), flat, e)


def check_routing(lists, counts, ids, e, msg):
    groups = groups_of(ids, e)
    a = groups.shape[-1]
    assert lists.shape == (*groups.shape[:-1], e + 1, a) and counts.shape == (*groups.shape[:-1], e + 1), msg
    for b in np.ndindex(*groups.shape[:-1]):
        seen = np.zeros(a, int)
        for g in range(e + 1):
            want = np.flatnonzero(groups[b] == g)
            n = int(counts[b][g])
            assert n == len(want), f"{msg} entry {b} group {g}: count {n} != {len(want)}"
            got = lists[b][g]
            np.testing.assert_array_equal(np.sort(got[:n]), want, err_msg=f"{msg} entry {b} group {g}: members")
            assert (got[n:] == -1).all(), f"{msg} entry {b} group {g}: entries past the count must be -1"
            seen[got[:n]] += 1
        assert (seen == 1).all(), f"{msg} entry {b}: every assignment exactly once"


def entry(x_lead, full, b):
    """Entry of an operand with leading dims x_lead that full-batch entry b reads (prefix convention)."""
    return b // (math.prod(full) // math.prod(x_lead))


def matmul_reference(src, w, ids, e, row_div, trans_w, full):
    """float64 y [*full, A, F] and the mask of its dropped rows."""
    src, w = f64(src), f64(w)
    s2, w2 = src.reshape(-1, *src.shape[-2:]), w.reshape(-1, *w.shape[-3:])
    if trans_w:
        w2 = np.swapaxes(w2, -1, -2)
    groups = groups_of(ids, e)
    g2 = groups.reshape(-1, groups.shape[-1])
    a, f = g2.shape[-1], w2.shape[-1]
    nb = math.prod(full)
    y = np.zeros((nb, a, f))
    for b in range(nb):
        x = s2[entry(src.shape[:-2], full, b)]
        g = g2[entry(ids.shape[:-2], full, b)]
        wb = w2[entry(w.shape[:-3], full, b)]
        for ex in np.unique(g[g < e]):
            rows = np.flatnonzero(g == ex)
            y[b, rows] = x[rows // row_div] @ wb[ex]
    dropped = np.stack([g2[entry(ids.shape[:-2], full, b)] == e for b in range(nb)]) if nb else np.zeros((0, a), bool)
    return y.reshape(*full, a, f), np.broadcast_to(dropped[..., None], (nb, a, f)).reshape(*full, a, f)


def wgrad_reference(src, dy, ids, e, row_div, full, dw_lead):
    """float64 dw [*dw_lead, E, D, F] and the mask of its empty experts."""
    src, dy = f64(src), f64(dy)
    s2, d2 = src.reshape(-1, *src.shape[-2:]), dy.reshape(-1, *dy.shape[-2:])
    groups = groups_of(ids, e)
    g2 = groups.reshape(-1, groups.shape[-1])
    d, f = s2.shape[-1], d2.shape[-1]
    nb, nc = math.prod(full), math.prod(dw_lead)
    dw = np.zeros((nc, e, d, f))
    used = np.zeros((nc, e), bool)
    per = nb // nc if nc else 0
    for c in range(nc):
        for b in range(c * per, (c + 1) * per):
            x = s2[entry(src.shape[:-2], full, b)]
            g = g2[entry(ids.shape[:-2], full, b)]
            gy = d2[entry(dy.shape[:-2], full, b)]
            for ex in np.unique(g[g < e]):
                rows = np.flatnonzero(g == ex)
                dw[c, ex] += x[rows // row_div].T @ gy[rows]
                used[c, ex] = True
    empty = np.broadcast_to(~used[..., None, None], dw.shape)
    return dw.reshape(*dw_lead, e, d, f), empty.reshape(*dw_lead, e, d, f)


# -- pit_moe_index ---------------------------------------------------------------------

INDEX_CASES = [
    (e, k, pattern, lead)
    for (e, k), pattern, lead in itertools.product(
        [(1, 1), (1, 2), (8, 1), (8, 2), (8, 8), (64, 2), (64, 8), (256, 1), (256, 8)],
        ["uniform", "one", "skewed", "dropped"],
        [(), (3,)],
    )
]
INDEX_CASES += [(4097, 2, "uniform", (2,)), (5000, 1, "dropped", ())]  # E+1 past the shared histogram


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("e,k,pattern,lead", INDEX_CASES, ids=[f"E{c[0]}-k{c[1]}-{c[2]}-{c[3]}" for c in INDEX_CASES])
def test_moe_index(platform, e, k, pattern, lead):
    rng, seed = fresh_rng()
    t = int(rng.choice([1, 37, 300, 2500]))  # uneven T; 2500 * k spans several blocks
    ids = routing(rng, lead, t, k, e, pattern)
    lists, counts = run(platform, lambda x: moe_index(x, e), ids)
    check_routing(lists, counts, ids, e, f"seed={seed} T={t}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_moe_index_empty_and_nested_batch(platform):
    rng, seed = fresh_rng()
    ids = routing(rng, (2, 3), 5, 2, 4, "dropped")

    def f(x):
        return moe_index(x, 4), moe_index(jnp.zeros((0, 2), jnp.int32), 4), moe_index(x[:0], 4)

    (lists, counts), (l0, c0), (lb, cb) = run(platform, f, ids)
    check_routing(lists, counts, ids, 4, f"seed={seed}")
    assert l0.shape == (5, 0) and (c0 == 0).all(), "T = 0: empty lists, zero counts"
    assert lb.shape == (0, 3, 5, 10) and cb.shape == (0, 3, 5)


# -- pit_grouped_matmul ----------------------------------------------------------------

# (src, w, index) leading dims; y has the longest (the full batch).
MM_LEADS = {
    "single": ((), (), ()),
    "batched": ((3,), (3,), (3,)),
    "shared_w": ((3,), (), (3,)),  # index batched, weights shared
    "shared_src": ((), (2,), (2,)),
    "shared_index": ((2,), (2,), ()),
    "nested": ((2, 3), (2,), (2, 3)),
}
MM_CASES = [
    (e, k, pattern, DTYPES[i % 3], bool((i // 3) % 2), bool(i % 2), list(MM_LEADS)[i % 6], i % 7 == 0)
    for i, ((e, k), pattern) in enumerate(
        itertools.product([(1, 1), (8, 1), (8, 2), (64, 2), (256, 1), (256, 2)], ["uniform", "one", "skewed", "dropped"])
    )
]
# Every dtype x trans_w x allow_tf32 once more on one routing.
MM_CASES += [(8, 2, "uniform", d, tw, True, "shared_w", tf) for d, tw, tf in
             itertools.product(DTYPES, [False, True], [False, True]) if tf is False or d == jnp.float32]


def grouped_matmul_case(platform, e, k, pattern, dtype, trans_w, token_src, lead, allow_tf32, t=None, dims=None,
                        relu=False):
    rng, seed = fresh_rng()
    t = t or int(rng.choice([37, 64, 101]))
    d, f = dims or (int(rng.choice([40, 64, 33])), int(rng.choice([24, 72, 17])))
    src_lead, w_lead, idx_lead = MM_LEADS[lead]
    full = max(MM_LEADS[lead], key=len)
    row_div = k if token_src else 1
    a = t * k
    ids = routing(rng, idx_lead, t, k, e, pattern)
    src = randn(rng, (*src_lead, a // row_div, d), dtype)
    w = randn(rng, (*w_lead, e, *((f, d) if trans_w else (d, f))), dtype)

    def fn(ids, src, w):
        lists, counts = moe_index(ids, e)
        y = ffi("pit_grouped_matmul", (*full, a, f), dtype, src, w, lists, counts, row_div=row_div,
                trans_w=trans_w, allow_tf32=allow_tf32, activation=np.int64(1 if relu else 0))
        return y, lists, counts

    y, lists, counts = run(platform, fn, ids, src, w)
    msg = f"seed={seed} T={t} D={d} F={f} row_div={row_div} relu={relu}"
    check_routing(lists, counts, ids, e, msg + ": index")
    ref, dropped = matmul_reference(src, w, ids, e, row_div, trans_w, full)
    if relu:
        ref = np.maximum(ref, 0.0)
        assert (ref == 0).mean() > 0.3, "the reference must have clamped values"
    check_close(y, ref, dtype, msg, allow_tf32, exact=dropped)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
    "e,k,pattern,dtype,trans_w,token_src,lead,allow_tf32",
    MM_CASES,
    ids=[f"E{c[0]}-k{c[1]}-{c[2]}-{dname(c[3])}-tw{int(c[4])}-rd{'k' if c[5] else 1}-{c[6]}-tf32{int(c[7])}"
         for c in MM_CASES],
)
def test_grouped_matmul(platform, e, k, pattern, dtype, trans_w, token_src, lead, allow_tf32):
    grouped_matmul_case(platform, e, k, pattern, dtype, trans_w, token_src, lead, allow_tf32)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("trans_w", [False, True])
def test_grouped_matmul_large_tiles(platform, dtype, trans_w):
    """Many rows per expert and wide F: the kernels' large tiles and 16-byte paths."""
    grouped_matmul_case(platform, 8, 2, "uniform", dtype, trans_w, True, "batched", False, t=700, dims=(136, 264))


RELU_CASES = [(e, k, pattern, d, tw, lead, t, dims)
              for (e, k, pattern), d, tw, (lead, t, dims) in itertools.product(
                  [(8, 2, "dropped"), (64, 1, "skewed")], DTYPES, [False, True],
                  [("single", None, None), ("batched", 700, (136, 264))])]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("e,k,pattern,dtype,trans_w,lead,t,dims", RELU_CASES,
                         ids=[f"E{c[0]}-k{c[1]}-{c[2]}-{dname(c[3])}-tw{int(c[4])}-{c[5]}" for c in RELU_CASES])
def test_grouped_matmul_relu(platform, e, k, pattern, dtype, trans_w, lead, t, dims):
    """activation = 1: max(y, 0) before the rounding; dropped rows stay exactly 0."""
    grouped_matmul_case(platform, e, k, pattern, dtype, trans_w, True, lead, dtype == jnp.float32 and trans_w,
                        t=t, dims=dims, relu=True)


# -- pit_grouped_wgrad -----------------------------------------------------------------

# (src, dy, index, dw) leading dims; dw's are a prefix of the full batch and sum the rest.
WG_LEADS = {
    "single": ((), (), (), ()),
    "batched": ((3,), (3,), (3,), (3,)),
    "sum": ((3,), (3,), (3,), ()),  # a shared weight's gradient
    "sum2": ((2, 2), (2, 2), (2, 2), (2,)),
    "shared_src": ((), (3,), (3,), ()),
    "shared_index": ((2,), (2,), (), ()),
}
WG_CASES = [
    (e, k, pattern, DTYPES[i % 3], bool(i % 2), list(WG_LEADS)[i % 6], i % 5 == 0)
    for i, ((e, k), pattern) in enumerate(
        itertools.product([(1, 1), (8, 1), (8, 2), (64, 2), (256, 1), (256, 2)], ["uniform", "one", "skewed", "dropped"])
    )
]
WG_CASES += [(8, 2, "uniform", d, True, "sum", tf) for d, tf in
             itertools.product(DTYPES, [False, True]) if tf is False or d == jnp.float32]


def grouped_wgrad_case(platform, e, k, pattern, dtype, token_src, lead, allow_tf32, t=None, dims=None):
    rng, seed = fresh_rng()
    t = t or int(rng.choice([37, 64, 101]))
    d, f = dims or (int(rng.choice([40, 64, 33])), int(rng.choice([24, 72, 17])))
    src_lead, dy_lead, idx_lead, dw_lead = WG_LEADS[lead]
    full = max(WG_LEADS[lead][:3], key=len)
    row_div = k if token_src else 1
    a = t * k
    ids = routing(rng, idx_lead, t, k, e, pattern)
    src = randn(rng, (*src_lead, a // row_div, d), dtype)
    dy = randn(rng, (*dy_lead, a, f), dtype)

    def fn(ids, src, dy):
        lists, counts = moe_index(ids, e)
        dw = ffi("pit_grouped_wgrad", (*dw_lead, e, d, f), dtype, src, dy, lists, counts, row_div=row_div,
                 allow_tf32=allow_tf32)
        return dw, lists, counts

    dw, lists, counts = run(platform, fn, ids, src, dy)
    msg = f"seed={seed} T={t} D={d} F={f} row_div={row_div}"
    check_routing(lists, counts, ids, e, msg + ": index")
    ref, empty = wgrad_reference(src, dy, ids, e, row_div, full, dw_lead)
    check_close(dw, ref, dtype, msg, allow_tf32, exact=empty)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
    "e,k,pattern,dtype,token_src,lead,allow_tf32",
    WG_CASES,
    ids=[f"E{c[0]}-k{c[1]}-{c[2]}-{dname(c[3])}-rd{'k' if c[4] else 1}-{c[5]}-tf32{int(c[6])}" for c in WG_CASES],
)
def test_grouped_wgrad(platform, e, k, pattern, dtype, token_src, lead, allow_tf32):
    grouped_wgrad_case(platform, e, k, pattern, dtype, token_src, lead, allow_tf32)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_grouped_wgrad_large_tiles(platform, dtype):
    """Wide D and F over many experts: the kernel's large tiles and 16-byte paths."""
    grouped_wgrad_case(platform, 32, 2, "uniform", dtype, True, "single", False, t=600, dims=(136, 264))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("lead", ["single", "sum", "batched"])
@pytest.mark.parametrize("tail", ["dead", "identity"])
def test_grouped_wgrad_packed(platform, dtype, lead, tail):
    """pit_grouped_wgrad_packed: rows packed by pit_sread_live (row j is list entry j, zeros
    from the count up to the next multiple of PACKED_ROW_PAD rows). The rows after that
    padding are NaN here: no kernel may read them (the sm_90a one reads whole 96-row stages
    by TMA). The list entries past the count are -1 ("dead") or go on counting ("identity",
    the constant list the M-axis lowering passes): only the count may bound the rows read."""
    rng, seed = fresh_rng()
    a, d, f = 300, 136, 264
    _, _, idx_lead, dw_lead = WG_LEADS[lead]
    src_lead = dy_lead = idx_lead
    n = int(np.prod(idx_lead, dtype=np.int64))
    counts = rng.integers(0, a + 1, size=n)
    counts[0] = int(rng.choice([0, 64, 250, a]))  # none, whole stages, a partial one, every row
    src = np.asarray(randn(rng, (*src_lead, a, d), dtype), np.float32)
    dy = np.asarray(randn(rng, (*dy_lead, a, f), dtype), np.float32)
    for arr in (src, dy):  # every case here has one operand entry per index entry
        flat = arr.reshape(n, a, arr.shape[-1])
        for i in range(n):
            c = int(counts[i])
            pad = min(a, -(-c // PACKED_ROW_PAD) * PACKED_ROW_PAD)
            flat[i, c:pad] = 0
            flat[i, pad:] = np.nan
    src, dy = jnp.asarray(src, dtype), jnp.asarray(dy, dtype)
    j = np.arange(a)
    lists = np.full((*idx_lead, 2, a), -1, np.int32)
    lists.reshape(n, 2, a)[:, 0] = np.where((j[None] < counts[:, None]) | (tail == "identity"), j[None], -1)
    cnt = np.stack([counts, np.zeros_like(counts)], -1).astype(np.int32).reshape(*idx_lead, 2)

    def fn(src, dy, lists, cnt):
        return ffi("pit_grouped_wgrad_packed", (*dw_lead, 1, d, f), dtype, src, dy, lists, cnt, row_div=1,
                   allow_tf32=False)

    dw = np.asarray(run(platform, fn, src, dy, jnp.asarray(lists), jnp.asarray(cnt)), np.float64)
    s64 = np.nan_to_num(np.asarray(src, np.float64)).reshape(n, a, d)
    g64 = np.nan_to_num(np.asarray(dy, np.float64)).reshape(n, a, f)
    ref = np.stack([s64[i, : counts[i]].T @ g64[i, : counts[i]] for i in range(n)])
    ref = ref.reshape(*idx_lead, 1, d, f)
    if len(dw_lead) < len(idx_lead):
        ref = ref.reshape(-1, 1, d, f).sum(0)
    msg = f"seed={seed} counts={counts.tolist()}"
    assert not np.isnan(dw).any(), f"{msg}: NaN rows past the padding were read"
    check_close(dw, ref, dtype, msg, False, exact=bool((counts == 0).all()))


# -- degenerate shapes -------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
def test_empty_shapes(platform):
    """A = 0, D = 0 (y is zeros), an empty full batch (dw sums nothing: zeros)."""
    rng, seed = fresh_rng()
    ids = routing(rng, (), 6, 2, 4, "dropped")

    def fn(ids):
        lists, counts = moe_index(ids, 4)
        l0, c0 = moe_index(jnp.zeros((0, 2), jnp.int32), 4)
        y0 = ffi("pit_grouped_matmul", (0, 5), jnp.float32, jnp.ones((0, 3)), jnp.ones((4, 3, 5)), l0, c0, row_div=2,
                 trans_w=False, allow_tf32=False, activation=np.int64(0))
        y_d0 = ffi("pit_grouped_matmul", (12, 5), jnp.bfloat16, jnp.ones((6, 0), jnp.bfloat16),
                   jnp.ones((4, 0, 5), jnp.bfloat16), lists, counts, row_div=2, trans_w=False, allow_tf32=False,
                   activation=np.int64(1))
        lb = jnp.broadcast_to(lists, (2, 0, *lists.shape))
        cb = jnp.broadcast_to(counts, (2, 0, *counts.shape))
        dw = ffi("pit_grouped_wgrad", (2, 4, 3, 5), jnp.float16, jnp.ones((2, 0, 6, 3), jnp.float16),
                 jnp.ones((2, 0, 12, 5), jnp.float16), lb, cb, row_div=2, allow_tf32=False)
        dw0 = ffi("pit_grouped_wgrad", (4, 3, 5), jnp.float32, jnp.ones((0, 3)), jnp.ones((0, 5)), l0, c0, row_div=1,
                  allow_tf32=False)
        return y0, y_d0, dw, dw0

    y0, y_d0, dw, dw0 = run(platform, fn, ids)
    assert y0.shape == (0, 5)
    np.testing.assert_array_equal(f64(y_d0), np.zeros((12, 5)), err_msg=f"seed={seed}: D = 0")
    np.testing.assert_array_equal(f64(dw), np.zeros((2, 4, 3, 5)), err_msg="empty full batch")
    np.testing.assert_array_equal(f64(dw0), np.zeros((4, 3, 5)), err_msg="A = 0")


# -- bad input: InvalidArgument naming the target and the argument -----------------------


def _s32(*shape):
    return np.zeros(shape, np.int32)


def _f(*shape, dtype=jnp.float32):
    return jnp.ones(shape, dtype)


def _mm(y_shape, src, w, lists, counts, row_div=1, trans_w=False, dtype=jnp.float32, activation=0):
    return ffi("pit_grouped_matmul", y_shape, dtype, src, w, lists, counts, row_div=row_div, trans_w=trans_w,
               allow_tf32=False, activation=np.int64(activation))


def _wg(dw_shape, src, dy, lists, counts, row_div=1, dtype=jnp.float32):
    return ffi("pit_grouped_wgrad", dw_shape, dtype, src, dy, lists, counts, row_div=row_div, allow_tf32=False)


# name -> (call, regex the error must match). Valid baseline: E = 4, A = 6, D = 3, F = 5.
BAD_CALLS = {
    "index_ids_dtype": (lambda: moe_index(_f(3, 2), 4), "pit_moe_index: expert_ids must be int32"),
    "index_ids_rank": (lambda: ffi("pit_moe_index", [(5, 6), (5,)], [jnp.int32] * 2, _s32(6), num_experts=4),
                       "pit_moe_index: expert_ids must be"),
    "index_num_experts": (lambda: ffi("pit_moe_index", [(1, 6), (1,)], [jnp.int32] * 2, _s32(3, 2), num_experts=0),
                          "pit_moe_index: num_experts"),
    "index_lists_shape": (lambda: ffi("pit_moe_index", [(5, 7), (5,)], [jnp.int32] * 2, _s32(3, 2), num_experts=4),
                          "pit_moe_index: lists must be"),
    "index_counts_shape": (lambda: ffi("pit_moe_index", [(5, 6), (4,)], [jnp.int32] * 2, _s32(3, 2), num_experts=4),
                           "pit_moe_index: counts must be"),
    "index_lists_dtype": (lambda: ffi("pit_moe_index", [(5, 6), (5,)], [jnp.float32, jnp.int32], _s32(3, 2),
                                      num_experts=4), "pit_moe_index: lists must be int32"),
    "mm_w_dtype": (lambda: _mm((6, 5), _f(6, 3), _f(4, 3, 5, dtype=jnp.bfloat16), _s32(5, 6), _s32(5)),
                   "pit_grouped_matmul: w must have src's dtype"),
    "mm_src_dtype": (lambda: _mm((6, 5), _s32(6, 3), _s32(4, 3, 5), _s32(5, 6), _s32(5), dtype=jnp.int32),
                     "pit_grouped_matmul: src must be float32"),
    "mm_y_dtype": (lambda: _mm((6, 5), _f(6, 3), _f(4, 3, 5), _s32(5, 6), _s32(5), dtype=jnp.float16),
                   "pit_grouped_matmul: the result y must have src's dtype"),
    "mm_lists_dtype": (lambda: _mm((6, 5), _f(6, 3), _f(4, 3, 5), _f(5, 6), _s32(5)),
                       "pit_grouped_matmul: lists must be int32"),
    "mm_counts_dtype": (lambda: _mm((6, 5), _f(6, 3), _f(4, 3, 5), _s32(5, 6), _f(5)),
                        "pit_grouped_matmul: counts must be int32"),
    "mm_counts_shape": (lambda: _mm((6, 5), _f(6, 3), _f(4, 3, 5), _s32(5, 6), _s32(4)),
                        "pit_grouped_matmul: counts must be"),
    "mm_one_group": (lambda: _mm((6, 5), _f(6, 3), _f(0, 3, 5), _s32(1, 6), _s32(1)),
                     "pit_grouped_matmul: lists must have E\\+1 >= 2 groups"),
    "mm_experts": (lambda: _mm((6, 5), _f(6, 3), _f(3, 3, 5), _s32(5, 6), _s32(5)),
                   "pit_grouped_matmul: w has 3 experts .* E = 4"),
    "mm_w_rank": (lambda: _mm((6, 5), _f(6, 3), _f(3, 5), _s32(5, 6), _s32(5)), "pit_grouped_matmul: w must be"),
    "mm_inner": (lambda: _mm((6, 5), _f(6, 3), _f(4, 4, 5), _s32(5, 6), _s32(5)), "pit_grouped_matmul: w's D dim"),
    "mm_inner_trans": (lambda: _mm((6, 5), _f(6, 3), _f(4, 3, 5), _s32(5, 6), _s32(5), trans_w=True),
                       "pit_grouped_matmul: w's D dim"),
    "mm_row_div": (lambda: _mm((6, 5), _f(3, 3), _f(4, 3, 5), _s32(5, 6), _s32(5), row_div=3),
                   "pit_grouped_matmul: src has R = 3 rows"),
    "mm_row_div_zero": (lambda: _mm((6, 5), _f(6, 3), _f(4, 3, 5), _s32(5, 6), _s32(5), row_div=0),
                        "pit_grouped_matmul: row_div must be >= 1"),
    "mm_y_shape": (lambda: _mm((6, 4), _f(6, 3), _f(4, 3, 5), _s32(5, 6), _s32(5)),
                   "pit_grouped_matmul: the result y must be"),
    "mm_batch_prefix": (lambda: _mm((2, 3, 6, 5), _f(3, 6, 3), _f(4, 3, 5), _s32(2, 3, 5, 6), _s32(2, 3, 5)),
                        "pit_grouped_matmul: the leading dims of src"),
    "mm_y_batch": (lambda: _mm((6, 5), _f(2, 6, 3), _f(4, 3, 5), _s32(5, 6), _s32(5)),
                   "pit_grouped_matmul: the result y must have the full batch"),
    "mm_activation": (lambda: _mm((6, 5), _f(6, 3), _f(4, 3, 5), _s32(5, 6), _s32(5), activation=3),
                      "pit_grouped_matmul: activation must be 0 \\(none\\) or 1 \\(relu\\), got 3"),
    "wg_dy_dtype": (lambda: _wg((4, 3, 5), _f(6, 3), _f(6, 5, dtype=jnp.float16), _s32(5, 6), _s32(5)),
                    "pit_grouped_wgrad: dy must have src's dtype"),
    "wg_dy_rows": (lambda: _wg((4, 3, 5), _f(6, 3), _f(7, 5), _s32(5, 6), _s32(5)), "pit_grouped_wgrad: dy has 7 rows"),
    "wg_row_div": (lambda: _wg((4, 3, 5), _f(6, 3), _f(6, 5), _s32(5, 6), _s32(5), row_div=2),
                   "pit_grouped_wgrad: src has R = 6 rows"),
    "wg_dw_shape": (lambda: _wg((4, 5, 3), _f(6, 3), _f(6, 5), _s32(5, 6), _s32(5)),
                    "pit_grouped_wgrad: the result dw must be"),
    "wg_dw_experts": (lambda: _wg((5, 3, 5), _f(6, 3), _f(6, 5), _s32(5, 6), _s32(5)),
                      "pit_grouped_wgrad: the result dw must be"),
    "wg_dw_prefix": (lambda: _wg((3, 4, 3, 5), _f(2, 6, 3), _f(2, 6, 5), _s32(2, 5, 6), _s32(2, 5)),
                     "pit_grouped_wgrad: the leading dims of the result dw"),
    "wg_lists_rank": (lambda: _wg((4, 3, 5), _f(6, 3), _f(6, 5), _s32(6), _s32()), "pit_grouped_wgrad: lists must be"),
    "wg_batch_prefix": (lambda: _wg((4, 3, 5), _f(2, 6, 3), _f(3, 6, 5), _s32(5, 6), _s32(5)),
                        "pit_grouped_wgrad: the leading dims of"),
}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_is_an_error_naming_the_target(platform, case):
    call, pattern = BAD_CALLS[case]
    assert_call_raises(platform, pattern, call)
