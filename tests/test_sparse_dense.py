"""pit_jax.sparse_dense against float64 NumPy: values, gradients, transformations, errors.

Semantics checked: (x * mask(index)) @ w for axes "m" / "k", x @ (w * mask(index)) for
axis "w"; gradients are those of that masked expression. Fresh random data every run;
native outputs are poisoned (NaN) before each kernel, so unwritten elements fail.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from pit_testing import BILINEAR_FD_STEP, PLATFORMS, child_env, fresh_rng, put, requires_gpu, tiled_sparse

import pit_jax

TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2, jnp.float16: 1e-2}
TF32_TOL = 2e-3
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]

# axis -> (x shape, w shape, micro_tile); shapes are not multiples of the tiles.
CASES = {
    "m": [((70, 50), (50, 36), (1, None)), ((45, 33), (33, 20), (3, None))],
    "k": [((70, 50), (50, 36), (32, 1)), ((45, 66), (66, 20), (8, 4))],
    "w": [((30, 80), (80, 72), (32, 64)), ((20, 70), (70, 40), (1, 16))],
}


# NaN-poison native outputs for the whole module (fixture in conftest.py).
pytestmark = pytest.mark.usefixtures("poison_outputs")


def f64(a):
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def rel_err(got, want):
    got, want = f64(got), np.asarray(want, np.float64)
    assert not np.isnan(got).any(), "NaN in the output: an element was not written"
    scale = max(np.abs(want).max(), 1e-30)
    return np.abs(got - want).max() / scale


def resolve(tile, shape):
    return tuple(shape[i] if t is None else t for i, t in enumerate(tile))


def make_case(rng, axis, xs, ws, tile, density, dtype, lead=()):
    """x, w (numpy in dtype) and the element mask of the sparse operand (x, or w for "w")."""
    if axis == "w":
        x = np.asarray(jnp.asarray(rng.standard_normal((*lead, *xs)), dtype))
        w, live = tiled_sparse(rng, ws, resolve(tile, ws), density, dtype)
        mask = np.repeat(np.repeat(live, resolve(tile, ws)[0], -2), resolve(tile, ws)[1], -1)[: ws[0], : ws[1]]
    else:
        x, live = tiled_sparse(rng, (*lead, *xs), resolve(tile, xs), density, dtype)
        h, wt = resolve(tile, xs)
        mask = np.repeat(np.repeat(live, h, -2), wt, -1)[..., : xs[0], : xs[1]]
        w = np.asarray(jnp.asarray(rng.standard_normal(ws), dtype))
    return x, w, mask.astype(np.float64)


def masked_ref(axis, x, w, mask):
    x, w = f64(x), f64(w)
    return (x @ (w * mask)) if axis == "w" else ((x * mask) @ w)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("density", [0.0, 0.05, 0.5, 1.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("axis,case", [(a, i) for a in CASES for i in range(len(CASES[a]))])
def test_forward_matches_float64(platform, density, dtype, axis, case):
    rng, seed = fresh_rng()
    xs, ws, tile = CASES[axis][case]
    x, w, mask = make_case(rng, axis, xs, ws, tile, density, dtype)
    f = jax.jit(lambda a, b: pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile))
    y = f(*put(platform, x, w))
    assert y.dtype == jnp.dtype(dtype) and y.shape == (xs[0], ws[1])
    err = rel_err(y, masked_ref(axis, x, w, mask))
    assert err < TOL[dtype], f"seed={seed}: relative error {err:.2e}"
    if density == 0.0:
        assert not np.asarray(y, np.float32).any(), "no live tile: the result must be all zeros"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", ["m", "k", "w"])
def test_explicit_index_masks_dense_operand(platform, axis):
    """An index from ANOTHER pattern masks a dense operand: (x * mask) @ w, not x @ w."""
    rng, seed = fresh_rng()
    xs, ws, tile = CASES[axis][0]
    owner = ws if axis == "w" else xs
    pattern, live = tiled_sparse(rng, owner, resolve(tile, owner), 0.4, jnp.bool_)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    h, wt = resolve(tile, owner)
    mask = np.repeat(np.repeat(live, h, 0), wt, 1)[: owner[0], : owner[1]].astype(np.float64)

    def f(a, b, p):
        idx = pit_jax.index(p, tile, group_by=None if axis == "m" else "both")
        return pit_jax.sparse_dense(a, b, idx, axis=axis)

    y = jax.jit(f)(*put(platform, x, w, pattern))
    assert rel_err(y, masked_ref(axis, x, w, mask)) < TOL[jnp.float32], f"seed={seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", ["m", "k", "w"])
def test_tf32_precision(platform, axis):
    rng, seed = fresh_rng()
    xs, ws, tile = CASES[axis][0]
    x, w, mask = make_case(rng, axis, xs, ws, tile, 0.5, jnp.float32)
    for precision in ("tensorfloat32", jax.lax.Precision.DEFAULT):
        y = jax.jit(lambda a, b: pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile, precision=precision))(
            *put(platform, x, w)
        )
        assert rel_err(y, masked_ref(axis, x, w, mask)) < TF32_TOL, f"seed={seed}"
    y = jax.jit(lambda a, b: pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile, precision="highest"))(
        *put(platform, x, w)
    )
    assert rel_err(y, masked_ref(axis, x, w, mask)) < TOL[jnp.float32], f"seed={seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", ["m", "k", "w"])
@pytest.mark.parametrize("w_batch", ["shared", "batched", "broadcast"])
def test_batch_dims_like_matmul(platform, axis, w_batch):
    rng, seed = fresh_rng()
    xs, ws, tile = CASES[axis][0]
    lead = (2, 3)
    if axis == "w":
        w_lead = {"shared": (), "batched": lead, "broadcast": (3,)}[w_batch]
        x = rng.standard_normal((*lead, *xs)).astype(np.float32)
        w, live = tiled_sparse(rng, (*w_lead, *ws), resolve(tile, ws), 0.5, jnp.float32)
        h, wt = resolve(tile, ws)
        mask = np.repeat(np.repeat(live, h, -2), wt, -1)[..., : ws[0], : ws[1]]
        ref = f64(x) @ (f64(w) * mask)
    else:
        x, _, _ = make_case(rng, axis, xs, ws, tile, 0.5, jnp.float32, lead)
        w_lead = {"shared": (), "batched": lead, "broadcast": (3,)}[w_batch]
        w = rng.standard_normal((*w_lead, *ws)).astype(np.float32)
        ref = f64(x) @ f64(w)  # the index comes from x: the forward is x @ w exactly
    y = jax.jit(lambda a, b: pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile))(*put(platform, x, w))
    assert y.shape == ref.shape
    assert rel_err(y, ref) < TOL[jnp.float32], f"seed={seed}"


def test_vector_input():
    x = np.maximum(np.random.default_rng().standard_normal(40), 0).astype(np.float32)
    w = np.random.default_rng().standard_normal((40, 8)).astype(np.float32)
    y = pit_jax.sparse_dense(x, w, axis="k", micro_tile=(1, 1))
    assert y.shape == (8,) and rel_err(y, f64(x) @ f64(w)) < 1e-5


# -- autodiff ---------------------------------------------------------------------------


def _grads_ref(axis, x, w, mask, g):
    x, w, g = f64(x), f64(w), f64(g)
    if axis == "w":
        return (g @ (w * mask).T), (x.T @ g) * mask
    return ((g @ w.T) * mask), ((x * mask).T @ g)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("axis,case", [(a, i) for a in CASES for i in range(len(CASES[a]))])
def test_grad_matches_masked_reference(platform, dtype, axis, case):
    rng, seed = fresh_rng()
    xs, ws, tile = CASES[axis][case]
    x, w, mask = make_case(rng, axis, xs, ws, tile, 0.5, dtype)
    g = np.asarray(jnp.asarray(rng.standard_normal((xs[0], ws[1])), dtype))

    def loss(a, b, gg):
        return jnp.sum(pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile).astype(jnp.float32) * gg)

    dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(*put(platform, x, w, g))
    rx, rw = _grads_ref(axis, x, w, mask, g)
    assert rel_err(dx, rx) < 2 * TOL[dtype], f"seed={seed}: dx"
    assert rel_err(dw, rw) < 2 * TOL[dtype], f"seed={seed}: dw"


# (axis, x shape, w shape): matrices smaller than the axis's default micro-tile ((32, 1) for
# k, (32, 64) for w) in one dim or both.
SMALL_DEFAULT_CASES = [("k", (17, 40), (40, 24)), ("k", (1, 8), (8, 5)), ("w", (9, 17), (17, 24)),
                       ("w", (12, 40), (40, 100)), ("w", (3, 1), (1, 1))]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis,xs,ws", SMALL_DEFAULT_CASES)
def test_default_micro_tile_clipped_to_small_matrices(platform, axis, xs, ws):
    """The default micro-tile is clipped to a smaller matrix (the cover of a partial edge
    tile), as the Flax layers clip it: values and gradients are the masked reference's with
    the clipped tile, under jit, grad and vmap. An explicit larger one stays an error."""
    rng, seed = fresh_rng()
    owner = ws if axis == "w" else xs
    default = {"k": (32, 1), "w": (32, 64)}[axis]
    tile = (min(default[0], owner[0]), min(default[1], owner[1]))
    x, w, mask = make_case(rng, axis, xs, ws, tile, 0.5, jnp.float32)
    g = rng.standard_normal((xs[0], ws[1])).astype(np.float32)

    def loss(a, b, gg):
        return jnp.sum(pit_jax.sparse_dense(a, b, axis=axis) * gg)

    y = jax.jit(lambda a, b: pit_jax.sparse_dense(a, b, axis=axis))(*put(platform, x, w))
    assert rel_err(y, masked_ref(axis, x, w, mask)) < TOL[jnp.float32], f"seed={seed}: forward"
    dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(*put(platform, x, w, g))
    rx, rw = _grads_ref(axis, x, w, mask, g)
    assert rel_err(dx, rx) < 2 * TOL[jnp.float32], f"seed={seed}: dx"
    assert rel_err(dw, rw) < 2 * TOL[jnp.float32], f"seed={seed}: dw"
    if axis == "k":  # vmap over x's rows' batch: each entry its own (clipped) index
        xb = np.stack([x, x[::-1]])
        yb = jax.jit(jax.vmap(lambda a: pit_jax.sparse_dense(a, w, axis=axis)))(put(platform, xb))
        for i in range(2):
            ref = masked_ref(axis, xb[i], w, mask if i == 0 else mask[::-1])
            assert rel_err(yb[i], ref) < TOL[jnp.float32], f"seed={seed}: vmap entry {i}"
    big = (owner[0] + 1, 1)
    with pytest.raises(ValueError, match=r"is larger than the matrix it tiles"):
        pit_jax.sparse_dense(x, w, axis=axis, micro_tile=big)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize(
    "lead,w_batched,h,capacity",
    [((), False, 1, None), ((2, 3), False, 1, None), ((2, 3), True, 4, None), ((4,), False, 4, None),
     ((), False, 5, None), ((), False, 1, 20)],
)
def test_m_axis_weight_grad_16bit(platform, dtype, lead, w_batched, h, capacity):
    """The M axis's weight gradient, reduced over the live rows only (on CUDA the grouped
    weight-gradient kernel with one group where rows % h == 0, else the stile kernel):
    batch dims summed into a shared w or kept for a batched one, row blocks of h rows,
    and an index whose capacity is below the number of row blocks."""
    rng, seed = fresh_rng()
    rows, k, n = 48, 40, 24
    x, live = tiled_sparse(rng, (*lead, rows, k), (h, k), 0.5, dtype)
    if capacity is not None:  # keep at most `capacity` live blocks so nothing overflows
        flat = live.reshape(-1)
        flat[np.flatnonzero(flat)[capacity:]] = False
        x = np.where(np.repeat(live, h, -2)[..., :rows, :], x, 0).astype(x.dtype)
    w = np.asarray(jnp.asarray(rng.standard_normal((*(lead if w_batched else ()), k, n)), dtype))
    g = np.asarray(jnp.asarray(rng.standard_normal((*lead, rows, n)), dtype))
    mask = np.repeat(live, h, -2)[..., :rows, :].astype(np.float64)

    def loss(a, b, gg):
        idx = pit_jax.index(a, (h, None), capacity=capacity)
        return jnp.sum(pit_jax.sparse_dense(a, b, idx, axis="m").astype(jnp.float32) * gg.astype(jnp.float32))

    dw = jax.jit(jax.grad(loss, argnums=1))(*put(platform, x, w, g))
    rw = np.swapaxes(f64(x) * mask, -1, -2) @ f64(g)
    if not w_batched:
        rw = rw.reshape(-1, k, n).sum(0)
    assert dw.shape == w.shape and dw.dtype == w.dtype
    assert rel_err(dw, rw) < 2 * TOL[dtype], f"seed={seed}"


@requires_gpu
def test_m_axis_weight_grad_lowers_to_grouped_wgrad_on_cuda():
    """bf16 M-axis backward on CUDA: dW through the grouped weight gradient (one group),
    dx through the row-gather product, both on the forward's index."""
    x = jnp.ones((64, 32), jnp.bfloat16)
    w = jnp.ones((32, 16), jnp.bfloat16)
    loss = lambda a, b: jnp.sum(pit_jax.sparse_dense(a, b, axis="m").astype(jnp.float32))  # noqa: E731
    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*put("gpu", x, w)).as_text()
    assert hlo.count("@pit_grouped_wgrad(") == 1 and "@pit_stile_matmul(" not in hlo
    assert hlo.count("@pit_index(") == 1


@pytest.mark.parametrize("trans_a, trans_b, trans_c", [(True, False, False), (False, True, True)])
@pytest.mark.parametrize("lead, out_batch", [((3,), 0), ((2, 3), 1), ((2, 3), 0)])
def test_dense_route_sums_batches_inside_the_product(trans_a, trans_b, trans_c, lead, out_batch):
    """The CUDA dense route's product with summed batch dims that both operands carry (a
    shared weight's gradient) contracts them in the GEMM: no per-entry float32 products and
    reduce after it. Same values as the product per entry summed in float64; 16-bit results
    in their dtype."""
    from pit_jax.primitives import _dense_route

    rng, seed = fresh_rng()
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)):
        a = jnp.asarray(rng.standard_normal((*lead, 24, 40)), dtype)
        b = jnp.asarray(rng.standard_normal((*lead, 24, 16) if trans_a else (*lead, 16, 40)), dtype)
        kw = dict(trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, allow_tf32=False, out_batch=out_batch)
        got = jax.jit(lambda a, b: _dense_route.product(a, b, **kw))(a, b)
        opa = np.swapaxes(np.asarray(a, np.float64), -1, -2) if trans_a else np.asarray(a, np.float64)
        opb = np.swapaxes(np.asarray(b, np.float64), -1, -2) if trans_b else np.asarray(b, np.float64)
        want = (opa @ opb).sum(axis=tuple(range(out_batch, len(lead))))
        want = np.swapaxes(want, -1, -2) if trans_c else want
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * np.abs(want).max(),
                                   err_msg=f"seed {seed}")
        jaxpr = str(jax.make_jaxpr(lambda a, b: _dense_route.product(a, b, **kw))(a, b))
        assert "reduce_sum" not in jaxpr and "dot_general" in jaxpr


def _packed_route(monkeypatch, force, why):
    """Skips (saying `why`) off sm_90, where the M axis's backward packs no rows; `force`:
    the packed route on small shapes too (PACKED_WGRAD_MIN_KN = 0)."""
    from pit_jax.primitives import _lowering, stile_matmul as sm

    if not _lowering.cuda_is_sm90():
        pytest.skip(why)
    if force:
        monkeypatch.setattr(sm, "PACKED_WGRAD_MIN_KN", 0)


@requires_gpu
@pytest.mark.parametrize(
    "lead,rows,k,n,h,density,capacity,force,overflow",
    [((), 1000, 136, 264, 1, 0.3, None, True, False),  # rows and the live count not multiples of 64
     ((2, 3), 200, 72, 520, 4, 0.5, None, True, False),  # batch summed into one dW, row blocks of 4
     ((), 300, 64, 64, 1, 0.0, None, True, False),  # nothing live: zeros
     ((), 333, 64, 128, 1, 1.0, None, True, False),  # every row live: the last stage reads past the end
     ((3,), 777, 128, 64, 1, 0.1, 50, True, False),  # capacity at the live count
     ((2,), 500, 64, 136, 1, 0.4, 64, True, True),  # more live rows than slots: the listed ones count
     ((), 4096, 2048, 2048, 1, 0.27, None, False, False)],  # packed by default (K * N at the threshold)
)
def test_m_axis_weight_grad_packed_gpu(monkeypatch, lead, rows, k, n, h, density, capacity, force, overflow):
    """The M axis's weight gradient through packed rows: pit_sread_live packs the live rows
    of x and dy (zeros up to a multiple of 192 rows), then the Hopper kernel reads whole
    stages of them by TMA. `force`: on small shapes too (PACKED_WGRAD_MIN_KN = 0);
    `overflow`: x keeps more live rows than the index has slots. Checked against float64,
    for determinism with one index, and for the targets it lowers to."""
    _packed_route(monkeypatch, force, "the packed weight gradient is for sm_90 devices")
    rng, seed = fresh_rng()
    x, live = tiled_sparse(rng, (*lead, rows, k), (h, k), density, jnp.bfloat16)
    if capacity is not None and not overflow:  # at most `capacity` live blocks per entry
        flat = live.reshape(-1, live.shape[-2] * live.shape[-1]).copy()
        for row in flat:
            row[np.flatnonzero(row)[capacity:]] = False
        live = flat.reshape(live.shape)
        x = np.where(np.repeat(live, h, -2)[..., :rows, :], x, 0).astype(x.dtype)
    g = np.asarray(jnp.asarray(rng.standard_normal((*lead, rows, n)), jnp.bfloat16))
    w = np.asarray(jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16))
    dw_fn = jax.jit(jax.grad(lambda a, b, gg, i: jnp.sum(
        pit_jax.sparse_dense(a, b, i, axis="m").astype(jnp.float32) * gg.astype(jnp.float32)), argnums=1))
    args = put("gpu", x, w, g)
    idx = jax.jit(lambda a: pit_jax.index(a, (h, None), capacity=capacity))(args[0])
    if overflow:  # the index keeps `capacity` of the live blocks (atomic order): those count
        assert (np.asarray(idx.count) > capacity).all(), "the case must overflow"
        kept = np.zeros_like(live)
        for e, (t, c) in enumerate(zip(np.asarray(idx.tiles).reshape(-1, capacity), np.asarray(idx.count).reshape(-1))):
            kept.reshape(-1, live.shape[-2])[e, t[: min(c, capacity)]] = True
        live = kept
    hlo = dw_fn.lower(*args, idx).as_text()
    assert hlo.count("@pit_grouped_wgrad_packed(") == 1 and hlo.count("@pit_sread_live(") == 2, "packed route"
    dw, dw2 = dw_fn(*args, idx), dw_fn(*args, idx)
    mask = np.repeat(live, h, -2)[..., :rows, :].astype(np.float64)
    rw = (np.swapaxes(f64(x) * mask, -1, -2) @ f64(g)).reshape(-1, k, n).sum(0)
    assert dw.shape == w.shape and not np.isnan(np.asarray(dw, np.float32)).any(), f"seed={seed}"
    assert rel_err(dw, rw) < 2 * TOL[jnp.bfloat16] or np.abs(rw).max() == 0, f"seed={seed}"
    if np.abs(rw).max() == 0:
        assert (np.asarray(dw, np.float32) == 0).all(), f"seed={seed}: nothing live must give zeros"
    assert np.array_equal(np.asarray(dw), np.asarray(dw2)), "deterministic"


def _m_axis_grads(argnums):
    """jit(grad) of sum(sparse_dense(x, w, index, axis="m") * g) w.r.t. `argnums`."""
    return jax.jit(jax.grad(lambda a, b, gg, i: jnp.sum(
        pit_jax.sparse_dense(a, b, i, axis="m").astype(jnp.float32) * gg.astype(jnp.float32)), argnums=argnums))


@pytest.mark.parametrize("lead", [(), (2,)])
@pytest.mark.parametrize("argnums,packed", [((0, 1), True), (0, False), (1, False)])
def test_m_axis_dx_reads_packed_dy_only_with_dw(monkeypatch, lead, argnums, packed):
    """Lowered for an sm_90 GPU (here on the CPU): with both gradients taken, dx asks for
    dy's live rows packed (the weight gradient packs them: XLA's CSE merges the two
    pit_sread_live calls) and reads them from there; with w frozen, dx alone does not pack
    (packing for it alone would cost more than it saves). A batch under the shared w folds
    its rows alike in both products."""
    from pit_jax import _native
    from pit_jax.primitives import _lowering

    if not _native.has_cuda():
        pytest.skip("built without the CUDA module: nothing lowers for CUDA")

    class _H200:
        compute_capability, device_kind = "9.0", "NVIDIA H200"

    monkeypatch.setattr(_lowering, "_first_cuda_device", lambda: _H200())
    monkeypatch.delenv("PIT_JAX_HOPPER", raising=False)
    _lowering.cuda_is_sm90.cache_clear()
    try:
        x = jax.ShapeDtypeStruct((*lead, 4096 // max(1, math.prod(lead)), 2048), jnp.bfloat16)
        w = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
        g = jax.ShapeDtypeStruct(x.shape, jnp.bfloat16)
        idx = jax.eval_shape(lambda a: pit_jax.index(a, "row"), x)
        text = _m_axis_grads(argnums).trace(x, w, g, idx).lower(lowering_platforms=("cuda",)).as_text()
    finally:
        _lowering.cuda_is_sm90.cache_clear()
    assert text.count("@pit_row_gather_matmul_packed(") == (1 if packed else 0)
    # x's and dy's packings for the weight gradient, and dy's again for dx (merged by XLA).
    assert text.count("@pit_sread_live(") == {(0, 1): 3, 0: 0, 1: 2}[argnums]


@requires_gpu
@pytest.mark.parametrize(
    "lead,rows,k,n,h,density,force",
    [((), 1000, 136, 264, 1, 0.3, True),  # rows, K and N off the tile sizes
     ((), 512, 64, 72, 4, 0.5, True),  # row blocks of 4
     ((), 300, 64, 64, 1, 0.0, True),  # nothing live: zeros
     ((), 333, 64, 128, 1, 1.0, True),  # every row live
     ((3,), 200, 72, 136, 2, 0.4, True),  # a batch under the shared w: both products fold its rows
     ((), 4096, 2048, 2048, 1, 0.27, False)],  # by default (K * N at the packing threshold)
)
def test_m_axis_dx_reads_packed_dy_gpu(monkeypatch, lead, rows, k, n, h, density, force):
    """The M axis's dx and dw taken together on sm_90: dy's live rows are packed once (CSE)
    for both, dx reads them by TMA. Against float64; `force`: small shapes too."""
    _packed_route(monkeypatch, force, "dx reads packed rows on sm_90 devices")
    rng, seed = fresh_rng()
    x, live = tiled_sparse(rng, (*lead, rows, k), (h, k), density, jnp.bfloat16)
    g = np.asarray(jnp.asarray(rng.standard_normal((*lead, rows, n)), jnp.bfloat16))
    w = np.asarray(jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16))
    fn = _m_axis_grads((0, 1))
    args = put("gpu", x, w, g)
    idx = jax.jit(lambda a: pit_jax.index(a, (h, None)))(args[0])
    hlo = fn.lower(*args, idx).compile().as_text()
    assert len(re.findall(r'custom_call_target="pit_row_gather_matmul_packed"', hlo)) == 1, "dx reads packed dy"
    assert len(re.findall(r'custom_call_target="pit_sread_live"', hlo)) == 2, "dy packed once (CSE), and x"
    dx, dw = fn(*args, idx)
    mask = np.repeat(live, h, -2)[..., :rows, :1].astype(np.float64)
    rdx = mask * (f64(g) @ f64(w).T)
    rdw = (np.swapaxes(f64(x) * mask, -1, -2) @ f64(g)).reshape(-1, k, n).sum(0)
    for got, want, what in ((dx, rdx, "dx"), (dw, rdw, "dw")):
        assert got.shape == want.shape and not np.isnan(np.asarray(got, np.float32)).any(), f"seed={seed}: {what}"
        if np.abs(want).max() == 0:
            assert (np.asarray(got, np.float32) == 0).all(), f"seed={seed}: {what} of nothing live"
        else:
            assert rel_err(got, want) < 2 * TOL[jnp.bfloat16], f"seed={seed}: {what}"
    assert (np.asarray(dx, np.float32)[~mask[..., 0].astype(bool)] == 0).all(), f"seed={seed}: dead rows of dx"


@requires_gpu
@pytest.mark.parametrize("rows,k,n", [(4096, 768, 768), (4096, 3072, 768), (2048, 256, 1024)])
def test_m_axis_weight_grad_few_tiles_gpu(rows, k, n):
    """BERT-like sizes (about a quarter of the rows live, few 128 x 256 tiles of dW): the
    Hopper weight-gradient kernel splits each tile's rows over a cluster of CTAs and sums
    the partial tiles in a fixed order; the result must match float64 and be identical
    on a second call with the same index (the list order of an index is that of its
    atomics, so a rebuilt index may sum in another order)."""
    rng, seed = fresh_rng()
    x, live = tiled_sparse(rng, (rows, k), (1, k), 0.27, jnp.bfloat16)
    g = np.asarray(jnp.asarray(rng.standard_normal((rows, n)), jnp.bfloat16))
    w = np.asarray(jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16))
    dw_fn = jax.jit(jax.grad(lambda a, b, gg, i: jnp.sum(
        pit_jax.sparse_dense(a, b, i, axis="m").astype(jnp.float32) * gg.astype(jnp.float32)), argnums=1))
    args = put("gpu", x, w, g)
    idx = jax.jit(lambda a: pit_jax.index(a, "row"))(args[0])
    dw, dw2 = dw_fn(*args, idx), dw_fn(*args, idx)
    rw = (f64(x) * live.astype(np.float64)).T @ f64(g)
    assert rel_err(dw, rw) < 2 * TOL[jnp.bfloat16], f"seed={seed}"
    assert np.array_equal(np.asarray(dw), np.asarray(dw2)), "deterministic"


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,n", [(4096, 3072, 768), (4096, 2048, 1536), (4096, 2056, 2048), (1500, 2056, 264)])
def test_m_axis_small_problems_split_k_gpu(rows, k, n, dtype):
    """Few live row tiles and long reductions (BERT's ffn_out at 27 % valid tokens): the
    Hopper row-gather kernel splits K over 4 or 2 CTAs of a cluster (or runs them as
    independent CTAs when the tiles fill the GPU, as at n=2048) and sums the partials in
    shared memory. Forward and dx (its K is n: the short ones take the usual kernel)
    against float64, dead rows exactly zero, the same bits on a second call."""
    rng, seed = fresh_rng()
    x, live = tiled_sparse(rng, (rows, k), (1, k), 0.27, dtype)
    w = np.asarray(jnp.asarray(rng.standard_normal((k, n)) / math.sqrt(k), dtype))
    g = np.asarray(jnp.asarray(rng.standard_normal((rows, n)), dtype))
    prec = "tensorfloat32" if dtype == jnp.float32 else None
    tol = TF32_TOL if dtype == jnp.float32 else TOL[dtype]
    fwd = jax.jit(lambda a, b, i: pit_jax.sparse_dense(a, b, i, axis="m", precision=prec))
    dx_fn = jax.jit(jax.grad(lambda a, b, gg, i: jnp.sum(
        pit_jax.sparse_dense(a, b, i, axis="m", precision=prec).astype(jnp.float32) * gg.astype(jnp.float32))))
    xd, wd, gd = put("gpu", x, w, g)
    idx = jax.jit(lambda a: pit_jax.index(a, "row"))(xd)
    keep = live.reshape(rows, 1).astype(np.float64)
    y, y2 = fwd(xd, wd, idx), fwd(xd, wd, idx)
    assert rel_err(y, (f64(x) * keep) @ f64(w)) < tol, f"forward, seed={seed}"
    assert not f64(y)[~live.reshape(-1)].any(), f"dead rows must be zero, seed={seed}"
    assert np.array_equal(np.asarray(y), np.asarray(y2)), "deterministic"
    dx = dx_fn(xd, wd, gd, idx)
    assert rel_err(dx, keep * (f64(g) @ f64(w).T)) < tol, f"dx, seed={seed}"


@requires_gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("rows,k,n,density", [
    (16384, 264, 2056, 0.06), (16384, 136, 4096, 0.004), (9000, 520, 4096, 0.1), (16384, 200, 1240, 0.2),
    (16384, 128, 2048, 0.3)])
@pytest.mark.parametrize("bias", [False, True])
def test_m_axis_few_live_row_tiles_narrow_gpu(rows, k, n, density, dtype, bias):
    """Large static row spaces (more than 4 tiles an SM) with few live row tiles: the
    clustered Hopper kernel walks 128 x 208 tiles there (pairs of row tiles sharing B, the
    odd one's tiles spread over the CTAs) when they fill rounds better than 128 x 256
    ones, and the wide tiles at 30 %. N not a multiple of 208 or 256, one live row tile
    (0.4 %), with and without a bias: against float64, dead rows exactly zero (and the
    bias's dead rows: `dead_rows="zeros"`), the same bits on a second call."""
    rng, seed = fresh_rng()
    x, live = tiled_sparse(rng, (rows, k), (1, k), density, dtype)
    w = np.asarray(jnp.asarray(rng.standard_normal((k, n)) / math.sqrt(k), dtype))
    b = np.asarray(jnp.asarray(rng.standard_normal((n,)), dtype)) if bias else None
    fwd = jax.jit(lambda a, ww, bb, i: pit_jax.sparse_dense(a, ww, i, axis="m", bias=bb, dead_rows="zeros"))
    xd, wd, bd = put("gpu", x, w, b) if bias else (*put("gpu", x, w), None)
    idx = jax.jit(lambda a: pit_jax.index(a, "row"))(xd)
    keep = live.reshape(rows, 1).astype(np.float64)
    want = (f64(x) * keep) @ f64(w) + (keep * f64(b) if bias else 0.0)
    y, y2 = fwd(xd, wd, bd, idx), fwd(xd, wd, bd, idx)
    assert rel_err(y, want) < TOL[dtype], f"seed={seed}"
    assert not f64(y)[~live.reshape(-1)].any(), f"dead rows must be zero, seed={seed}"
    assert np.array_equal(np.asarray(y), np.asarray(y2)), "deterministic"


# Shapes the Hopper stile kernel covers (M, N multiples of 8; K ragged): on CUDA the
# lowering hands it x stored transposed (see stile_matmul._gather_rows_layout).
HOPPER_LAYOUT_CASES = [
    ("k", (64, 70), (70, 48), (32, 1)),
    ("k", (96, 45), (45, 40), (8, 4)),
    ("w", (40, 70), (70, 64), (1, 64)),
    ("w", (24, 66), (66, 72), (1, 16)),
    ("w", (16, 65), (65, 128), (3, 64)),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("lead", [(), (2,)], ids=["", "batch2"])
@pytest.mark.parametrize("axis,xs,ws,tile", HOPPER_LAYOUT_CASES)
def test_transposed_x_layout_is_the_same_product(monkeypatch, dtype, lead, axis, xs, ws, tile):
    """The CUDA lowering's layout rewrite (x^T with trans_a, the masked x's micro-tile turned,
    the same lists) run through the CPU target: the same product as the masked reference."""
    from pit_jax.primitives import _lowering, stile_matmul as sm

    monkeypatch.setattr(_lowering, "cuda_is_sm90", lambda: True)
    rng, seed = fresh_rng()
    x, w, mask = make_case(rng, axis, xs, ws, tile, 0.4, dtype, lead=lead)
    owner = w if axis == "w" else x
    idx = pit_jax.index(jnp.asarray(owner), tile, group_by="both")
    sparse = "b" if axis == "w" else "a"
    params = dict(sparse=sparse, tile=tile, trans_a=False, trans_b=False, trans_c=False, allow_tf32=False,
                  out_batch=len(lead))
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, w, *idx.arrays)]
    p = sm.plan(avals[0], avals[1], avals[2:], sparse=sparse, tile=tile, trans_a=False, trans_b=False,
                trans_c=False, out_batch=len(lead))
    assert sm._gather_rows_layout(avals[0], avals[1], p, sparse=sparse, tile=tile, trans_a=False, trans_b=False,
                                  trans_c=False, out_batch=len(lead)) == (axis == "k" or tile[0] % 8 != 0)
    native = jax.jit(lambda a, b, *i: sm._native(a, b, *i, cuda=True, **params))
    y = native(jnp.asarray(x), jnp.asarray(w), *idx.arrays)
    assert rel_err(y, masked_ref(axis, x, w, mask)) < TOL[dtype], f"seed={seed}"
    hlo = native.lower(jnp.asarray(x), jnp.asarray(w), *idx.arrays).as_text()
    assert "transpose" in hlo or axis == "w" and tile[0] % 8 == 0


# (case, sparse operand tile, a, b shapes, trans_a, trans_b, lead): the CUDA lowering's
# other routes, each run through the CPU targets against the pure-JAX reference.
CUDA_ROUTE_CASES = [
    ("sdd long reduction", (32, 64), (1100, 96), (1100, 128), True, False, ()),  # weight-block dw
    ("sdd thin tile", (16, 1), (40, 200), (72, 200), False, True, (2,)),  # K-axis dx
    ("stile w^T", (16, 8), (40, 72), (48, 72), False, True, ()),  # weight-block dx, w^T stored
    ("stile w^T batch", (32, 32), (2, 24, 128), (96, 128), False, True, (2,)),
    # (32, 64) blocks: the Hopper weight-block kernel reads w as stored (no w^T).
    ("stile wblock dx", (32, 64), (2, 24, 128), (96, 128), False, True, (2,)),
    ("stile thin group", (32, 1), (40, 96), (96, 56), False, False, ()),  # 32x1 weight strips
    ("stile thin run", (1, 32), (40, 64), (96, 64), False, True, ()),  # their dx: runs of 1
]


@pytest.mark.parametrize("sm90", [True, False], ids=["sm90", "other"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("case,tile,a_shape,b_shape,trans_a,trans_b,lead", CUDA_ROUTE_CASES, ids=[c[0] for c in CUDA_ROUTE_CASES])
def test_cuda_routes_are_the_same_product(monkeypatch, sm90, dtype, case, tile, a_shape, b_shape, trans_a, trans_b, lead):
    """The CUDA lowerings' rewrites (w^T for weight-block dx other than (32, 64) blocks, the
    dense product for tiles too thin to gather and for long SDD reductions) equal the
    reference product; (32, 64) blocks' dx keeps w as stored."""
    from pit_jax import reference
    from pit_jax.primitives import _lowering, sdd_matmul as sdd, stile_matmul as sm

    monkeypatch.setattr(_lowering, "cuda_is_sm90", lambda: sm90)
    rng, seed = fresh_rng()
    a = jnp.asarray(rng.standard_normal(a_shape), dtype)
    b = jnp.asarray(rng.standard_normal(b_shape), dtype)
    common = dict(tile=tile, trans_a=trans_a, trans_b=trans_b, allow_tf32=False, out_batch=len(lead))
    if case.startswith("sdd"):
        m = a.shape[-1] if trans_a else a.shape[-2]
        n = b.shape[-2] if trans_b else b.shape[-1]
        live = rng.random((*lead, math.ceil(m / tile[0]), math.ceil(n / tile[1]))) < 0.4
        idx = pit_jax.index(jnp.asarray(np.repeat(np.repeat(live, tile[0], -2), tile[1], -1)[..., :m, :n], jnp.float32),
                            tile)
        want = reference.sdd_matmul(a, b, *idx.arrays, **common)
        native = jax.jit(lambda *args: sdd._native(*args, cuda=True, **common))
        assert sdd._dense_is_faster(sdd._shape(a, b, idx.arrays, trans_a=trans_a, trans_b=trans_b, out_batch=len(lead)), tile)
    else:
        b_np, _ = tiled_sparse(rng, (*lead, *b_shape), tile, 0.4, np.float32)
        b = jnp.asarray(b_np, dtype)
        idx = pit_jax.index(b, tile, group_by="both")
        common.update(sparse="b", trans_c=False)
        want = reference.stile_matmul(a, b, *idx.arrays, **common)
        native = jax.jit(lambda *args: sm._native(*args, cuda=True, **common))
    got = native(a, b, *idx.arrays)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert rel_err(got, want) < TOL[dtype], f"seed={seed}"
    hlo = native.lower(a, b, *idx.arrays).as_text()
    dense = "@pit_" not in hlo
    if case == "stile w^T" or case == "stile w^T batch":
        assert not dense and ("transpose" in hlo) == (sm90 and dtype == jnp.bfloat16)
    elif case == "stile wblock dx":
        assert not dense and "transpose" not in hlo
    else:
        assert dense, case


@requires_gpu
@pytest.mark.parametrize("density", [0.0, 0.03, 0.5, 1.0])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize(
    "axis,xs,ws,tile,lead",
    [
        ("k", (512, 1000), (1000, 768), (32, 1), ()),
        ("k", (264, 520), (520, 200), (32, 1), (2,)),
        ("k", (256, 512), (512, 256), (64, 8), ()),
        ("w", (520, 1024), (1024, 768), (32, 64), ()),
        ("w", (264, 1000), (1000, 200), (32, 64), (2,)),
        ("w", (512, 1024), (1024, 512), (1, 64), ()),
        ("w", (256, 515), (515, 264), (1, 32), (3,)),
        ("w", (256, 512), (512, 512), (32, 32), ()),
    ],
)
def test_k_and_weight_blocks_at_kernel_sizes_gpu(density, dtype, axis, xs, ws, tile, lead):
    """Sizes where the Hopper stile kernel (cuda/kernels/sm90/stile_gemm.cu) runs: many
    groups and tiles, ragged K and group edges, a shared weight over a batch."""
    rng, seed = fresh_rng()
    x, w, mask = make_case(rng, axis, xs, ws, tile, density, dtype, lead=lead)
    f = jax.jit(lambda a, b: pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile))
    y = f(*put("gpu", x, w))
    assert y.shape == (*lead, xs[0], ws[1])
    assert rel_err(y, masked_ref(axis, x, w, mask)) < TOL[dtype], f"seed={seed}"
    if density == 0.0:
        assert not np.asarray(y, np.float32).any(), "no live tile: the result must be all zeros"


@requires_gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize(
    "axis,xs,ws,tile,lead",
    [
        ("k", (4096, 640), (640, 1032), (32, 1), ()),  # 128 row groups, 3 wide tiles
        ("k", (1000, 520), (520, 520), (32, 1), (3,)),  # a batch over one w: one table
        ("k", (32 * 4096, 64), (64, 64), (32, 1), ()),  # 4096 groups: the largest table
        ("k", (32 * 4100 + 8, 64), (64, 64), (32, 1), ()),  # 4101 groups: no table
        ("w", (1000, 1024), (1024, 2048), (1, 64), ()),  # 32 column groups
        ("w", (264, 512), (512, 1000), (32, 32), (2,)),
    ],
    ids=["k-groups128", "k-batch3", "k-groups4096", "k-groups4101", "w-1x64", "w-32x32-batch2"],
)
def test_k_and_weight_blocks_clustered_groups_gpu(dtype, axis, xs, ws, tile, lead):
    """Listed groups in clusters, as left padding leaves them (of each 4 consecutive groups
    only the last one or two listed): the Hopper stile kernel deals the listed groups'
    tiles over its CTAs from a table (sm90_stile::TileOrder), the others' zero tiles after."""
    rng, seed = fresh_rng()
    x, w, mask = make_case(rng, axis, xs, ws, tile, 0.3, dtype, lead=lead)
    # The groups: column groups of w, or row groups of x (the axis the mask keeps below).
    g = np.arange(ws[1]) // tile[1] if axis == "w" else np.arange(xs[0]) // tile[0]
    keep = (g % 4 == 3) | ((g % 4 == 2) & (rng.random(g.shape) < 0.5)[g])
    kept = keep[None, :] if axis == "w" else keep[:, None]
    if axis == "w":
        w = np.where(kept, w, 0).astype(w.dtype)
    else:
        x = np.where(kept, x, 0).astype(x.dtype)
    mask = mask * kept
    f = jax.jit(lambda a, b: pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile))
    y = np.asarray(f(*put("gpu", x, w)), np.float32)
    assert y.shape == (*lead, xs[0], ws[1])
    assert rel_err(y, masked_ref(axis, x, w, mask)) < TOL[dtype], f"seed={seed}"
    if axis == "k":
        assert not y[..., ~keep, :].any(), "rows of unlisted groups must be exactly zero"


def _index_operand_shapes(jaxpr):
    """The operand shape of every pit_index equation in a (closed) jaxpr, nested jaxprs included."""
    found = []

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive.name == "pit_index":
                found.append(tuple(eqn.invars[0].aval.shape))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr.jaxpr)
    return found


def _value_and_grads(axis, tile):
    """jit of x, w, g -> ((sum(y * g), y), (dx, dw)) with y = sparse_dense(x, w)."""

    def loss(a, b, gg):
        y = pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile)
        return jnp.sum(y.astype(jnp.float32) * gg), y

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _check_shared_weight_grads(fn, platform, axis, dtype, x, w, g, mask, seed):
    """fn's y, dx and dw (summed over x's batch into the shared w) against the float64
    masked reference; the masked operand's gradient exactly 0 off its live tiles."""
    (_, y), (dx, dw) = fn(*put(platform, x, w, g))
    xm, wm = (f64(x), f64(w) * mask) if axis == "w" else (f64(x) * mask, f64(w))
    want_dx = f64(g) @ wm.T if axis == "w" else (f64(g) @ wm.T) * mask
    want_dw = np.einsum("...mk,...mn->...kn", xm, f64(g)).reshape(-1, *w.shape[-2:]).sum(0)
    want_dw = want_dw * mask if axis == "w" else want_dw
    assert dw.shape == w.shape
    assert rel_err(y, xm @ wm) < TOL[dtype], f"seed={seed}: y"
    assert rel_err(dx, want_dx) < 2 * TOL[dtype], f"seed={seed}: dx"
    assert rel_err(dw, want_dw) < 2 * TOL[dtype], f"seed={seed}: dw"
    masked_grad = np.asarray(dw if axis == "w" else dx, np.float32)  # the masked operand's, of its shape
    assert not masked_grad[mask == 0].any(), "the gradient off the live tiles must be exactly 0"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize(
    "xs,ws,tile,lead",
    [((64, 64), (64, 64), (32, 64), (4,)), ((40, 70), (70, 50), (16, 32), (2, 3))],
)
def test_w_axis_shared_weight_over_a_batch(platform, dtype, xs, ws, tile, lead):
    """x with batch dims against a w without: w and its index stay shared (one index build,
    no copy of w per batch entry); forward and both gradients as the masked reference's,
    dw summed over the batch."""
    rng, seed = fresh_rng()
    x, w, mask = make_case(rng, "w", xs, ws, tile, 0.5, dtype, lead=lead)
    g = np.asarray(jnp.asarray(rng.standard_normal((*lead, xs[0], ws[1])), dtype))
    fn = _value_and_grads("w", tile)
    shapes = _index_operand_shapes(jax.make_jaxpr(fn)(x, w, g))
    assert shapes and all(s == w.shape for s in shapes), f"the index is built from the shared w alone, got {shapes}"
    _check_shared_weight_grads(fn, platform, "w", dtype, x, w, g, mask, seed)


@requires_gpu
@pytest.mark.parametrize("density", [0.0, 0.2, 1.0])
@pytest.mark.parametrize(
    "xs,ws,tile,lead",
    [((512, 768), (768, 2304), (32, 64), (2,)), ((264, 1000), (1000, 200), (32, 64), (3,)),
     ((256, 515), (515, 264), (1, 32), (2,))],
)
def test_w_axis_shared_weight_over_a_batch_gpu(density, xs, ws, tile, lead):
    """The same at the CUDA kernels' sizes (the sm90 weight-block kernel, its dx, the weight
    gradient summing the batch in the product), bf16, outputs checked everywhere."""
    rng, seed = fresh_rng()
    x, w, mask = make_case(rng, "w", xs, ws, tile, density, jnp.bfloat16, lead=lead)
    g = np.asarray(jnp.asarray(rng.standard_normal((*lead, xs[0], ws[1])), jnp.bfloat16))
    _check_shared_weight_grads(_value_and_grads("w", tile), "gpu", "w", jnp.bfloat16, x, w, g, mask, seed)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize(
    "xs,ws,tile,lead",
    [((64, 40), (40, 24), (32, 1), (3,)), ((16, 36), (36, 20), (8, 4), (2, 3)), ((20, 36), (36, 20), (8, 4), (2,))],
    ids=["whole-tile-rows", "whole-tile-rows-2d-batch", "partial-tile-rows"],
)
def test_k_axis_batched_x_shared_weight(platform, dtype, xs, ws, tile, lead):
    """K axis with x batched (its index per entry) and w shared, entries of whole and of
    partial tile rows: forward and both gradients as the masked reference's, dw summed
    over the batch."""
    rng, seed = fresh_rng()
    x, w, mask = make_case(rng, "k", xs, ws, tile, 0.4, dtype, lead=lead)
    g = np.asarray(jnp.asarray(rng.standard_normal((*lead, xs[0], ws[1])), dtype))
    _check_shared_weight_grads(_value_and_grads("k", tile), platform, "k", dtype, x, w, g, mask, seed)


@requires_gpu
@pytest.mark.parametrize("density", [0.0, 0.2, 1.0])
@pytest.mark.parametrize("xs,ws,lead", [((512, 768), (768, 2304), (2,)), ((256, 1000), (1000, 264), (3,))])
def test_k_axis_batched_x_shared_weight_gpu(density, xs, ws, lead):
    """The forward at the Hopper stile kernel's sizes (x stored transposed per entry), bf16."""
    rng, seed = fresh_rng()
    tile = (32, 1)
    x, w, mask = make_case(rng, "k", xs, ws, tile, density, jnp.bfloat16, lead=lead)
    y = jax.jit(lambda a, b: pit_jax.sparse_dense(a, b, axis="k", micro_tile=tile))(*put("gpu", x, w))
    assert y.shape == (*lead, xs[0], ws[1])
    assert rel_err(y, (f64(x) * mask) @ f64(w)) < TOL[jnp.bfloat16], f"seed={seed}"
    if density == 0.0:
        assert not np.asarray(y, np.float32).any(), "no live tile: the result must be all zeros"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize(
    "xs,ws,h,lead,folds",
    [((48, 40), (40, 24), 1, (3,), True), ((20, 36), (36, 20), 2, (2, 3), True), ((21, 36), (36, 20), 2, (3,), False)],
    ids=["rows", "row-pairs-2d-batch", "partial-row-block"],
)
def test_m_axis_batched_x_shared_weight(platform, dtype, xs, ws, h, lead, folds):
    """M axis with x batched and w shared, an entry with no live row and one with every row
    live among them: the products (forward, dx, dw) run on the entries' stacked rows with
    one folded index where M is a multiple of the row block (the custom calls' index operands
    1-D), per entry where it is not; values and both gradients as the masked reference's."""
    rng, seed = fresh_rng()
    tile = (h, None)
    x, w, mask = make_case(rng, "m", xs, ws, tile, 0.4, dtype, lead=lead)
    x, mask = np.array(x).reshape(-1, *xs), np.array(mask).reshape(-1, *xs)
    x[0], mask[0] = 0, 0
    x[-1], mask[-1] = np.asarray(jnp.asarray(rng.standard_normal(xs), dtype)), 1
    x, mask = x.reshape(*lead, *xs), mask.reshape(*lead, *xs)
    g = np.asarray(jnp.asarray(rng.standard_normal((*lead, xs[0], ws[1])), dtype))
    fn = _value_and_grads("m", tile)
    hlo = fn.lower(*put(platform, x, w, g)).as_text()
    calls = [ln for ln in hlo.splitlines() if "custom_call @pit_" in ln and "@pit_index(" not in ln]
    tr = -(-xs[0] // h)
    per_entry = f"tensor<{'x'.join(map(str, (*lead, tr)))}xi32>"
    folded = [ln for ln in calls if re.search(rf"[<x]{math.prod(lead) * tr}xi32>", ln)]
    if folds:  # no product reads the per-entry lists; the forward and dx read the folded ones
        assert len(folded) >= 2 and not any(per_entry in ln for ln in calls), calls
    else:
        assert not folded and sum(per_entry in ln for ln in calls) >= 2, calls
    _check_shared_weight_grads(fn, platform, "m", dtype, x, w, g, mask, seed)


# Small problems: check_grads' float32 finite differences are projections onto random
# directions, whose rounding noise grows with the number of elements summed.
GRAD_CHECK_CASES = {"m": ((12, 10), (10, 6), (3, None)), "k": ((12, 10), (10, 6), (4, 2)), "w": ((6, 12), (12, 10), (4, 5))}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", ["m", "k", "w"])
def test_check_grads_both_modes(platform, axis):
    """With the index fixed the op is bilinear: numerical and analytic derivatives agree."""
    rng, seed = fresh_rng()
    xs, ws, tile = GRAD_CHECK_CASES[axis]
    x, w, _ = make_case(rng, axis, xs, ws, tile, 0.5, jnp.float32)
    x, w = put(platform, x, w)
    owner = w if axis == "w" else x
    idx = pit_jax.index(owner, tile, group_by=None if axis == "m" else "both")
    f = lambda a, b: pit_jax.sparse_dense(a, b, idx, axis=axis)  # noqa: E731
    check_grads(f, (x, w), order=2, modes=("fwd", "rev"), atol=5e-2, rtol=5e-2, eps=BILINEAR_FD_STEP)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", ["m", "k", "w"])
def test_jvp(platform, axis):
    rng, seed = fresh_rng()
    xs, ws, tile = CASES[axis][0]
    x, w, mask = make_case(rng, axis, xs, ws, tile, 0.5, jnp.float32)
    tx = rng.standard_normal(xs).astype(np.float32)
    tw = rng.standard_normal(ws).astype(np.float32)
    owner = w if axis == "w" else x
    idx = pit_jax.index(put(platform, owner), tile, group_by=None if axis == "m" else "both")
    f = lambda a, b: pit_jax.sparse_dense(a, b, idx, axis=axis)  # noqa: E731
    y, t = jax.jit(lambda a, b, ta, tb: jax.jvp(f, (a, b), (ta, tb)))(*put(platform, x, w, tx, tw))
    want = masked_ref(axis, tx, w, mask) + masked_ref(axis, x, tw, mask)
    assert rel_err(t, want) < 1e-4, f"seed={seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", ["m", "k", "w"])
@pytest.mark.parametrize("in_axes", [(0, None), (0, 0), (1, None)])
def test_vmap_and_vmap_grad(platform, axis, in_axes):
    rng, seed = fresh_rng()
    xs, ws, tile = CASES[axis][0]
    n = 3
    xs_b = [make_case(rng, axis, xs, ws, tile, 0.5, jnp.float32) for _ in range(n)]
    x = np.stack([c[0] for c in xs_b])
    w = np.stack([c[1] for c in xs_b]) if in_axes[1] == 0 else xs_b[0][1]
    masks = [c[2] for c in xs_b]
    if axis == "w" and in_axes[1] is None:  # one shared w: one mask
        masks = [xs_b[0][2]] * n
    x_in = np.moveaxis(x, 0, in_axes[0])
    f = lambda a, b: pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile)  # noqa: E731
    y = jax.jit(jax.vmap(f, in_axes=in_axes))(*put(platform, x_in, w))
    for i in range(n):
        wi = w[i] if in_axes[1] == 0 else w
        assert rel_err(y[i], masked_ref(axis, x[i], wi, masks[i])) < TOL[jnp.float32], f"seed={seed} entry {i}"

    loss = lambda a, b: jnp.sum(f(a, b) ** 2)  # noqa: E731
    gx, gw = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=in_axes))(*put(platform, x_in, w))
    for i in range(n):
        wi = w[i] if in_axes[1] == 0 else w
        g = 2 * masked_ref(axis, x[i], wi, masks[i])
        rx, rw = _grads_ref(axis, x[i], wi, masks[i], g)
        assert rel_err(gx[i], rx) < 1e-4, f"seed={seed} dx entry {i}"
        assert rel_err(gw[i], rw) < 1e-4, f"seed={seed} dw entry {i}"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_vmap_over_index(platform):
    """One x, a batch of masks: vmap over the index alone."""
    rng, seed = fresh_rng()
    x = rng.standard_normal((40, 24)).astype(np.float32)
    w = rng.standard_normal((24, 16)).astype(np.float32)
    masks = rng.random((4, 40, 1)) < 0.5

    def f(m):
        idx = pit_jax.index(m, "row")
        return pit_jax.sparse_dense(x, w, idx, axis="m")

    y = jax.jit(jax.vmap(f))(put(platform, masks))
    for i in range(4):
        assert rel_err(y[i], (f64(x) * masks[i]) @ f64(w)) < 1e-5, f"seed={seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_index_reused_in_backward(platform):
    """The backward runs on the forward's index: one pit_index call per grouping (the
    forward's per-row lists, the gradient's per-column lists), none rebuilt."""
    x = np.maximum(np.random.default_rng().standard_normal((64, 48)), 0).astype(np.float32)
    w = np.random.default_rng().standard_normal((48, 32)).astype(np.float32)
    loss = lambda a, b: jnp.sum(pit_jax.sparse_dense(a, b, axis="k", micro_tile=(16, 1)))  # noqa: E731
    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*put(platform, x, w)).as_text()
    calls = [line for line in hlo.splitlines() if "@pit_index(" in line]
    assert len(calls) == 2, "the index must be built once per grouping, in the forward"
    assert sum("group_rows = true" in c for c in calls) == 1 and sum("group_cols = true" in c for c in calls) == 1
    if platform == "cpu":  # (on CUDA float32 16x1 tiles take the masked dense products: _dense_route)
        assert "@pit_sdd_matmul(" in hlo and "@pit_stile_matmul(" in hlo


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", ["k", "w"])
def test_forward_only_builds_one_grouping(platform, axis):
    """Without differentiation the grouping only the gradient reads is never built: XLA
    drops its index call (the K/W forward pays for one list set, not two)."""
    x = np.random.default_rng().standard_normal((64, 48)).astype(np.float32)
    w = np.random.default_rng().standard_normal((48, 32)).astype(np.float32)
    tile = (16, 1) if axis == "k" else (8, 8)
    f = lambda a, b: pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile)  # noqa: E731
    hlo = jax.jit(f).lower(*put(platform, x, w)).compile().as_text()
    calls = [line for line in hlo.splitlines() if 'custom_call_target="pit_index"' in line]
    assert len(calls) == 1, calls


# -- the kill switch and errors ----------------------------------------------------------


@pytest.mark.parametrize("axis", ["m", "k", "w"])
def test_reference_switch(axis):
    rng, _ = fresh_rng()
    xs, ws, tile = CASES[axis][0]
    x, w, mask = make_case(rng, axis, xs, ws, tile, 0.5, jnp.float32)
    f = lambda a, b: pit_jax.sparse_dense(a, b, axis=axis, micro_tile=tile)  # noqa: E731
    with pit_jax.use_reference():
        hlo = jax.jit(f).lower(x, w).as_text()
        y_ref = jax.jit(f)(x, w)
    assert "pit_" not in hlo
    assert rel_err(y_ref, masked_ref(axis, x, w, mask)) < 1e-5
    assert rel_err(jax.jit(f)(x, w), y_ref) < 1e-5


def test_reference_switch_per_op(monkeypatch):
    """The switch for named ops only: the others keep their custom calls."""
    from pit_jax import config

    x = jnp.asarray(np.random.default_rng().standard_normal((32, 16)), jnp.float32).at[::3].set(0.0)
    w, s = jnp.ones((16, 16)), jnp.ones((16,))

    def f(x, w, s):
        idx = pit_jax.index(x, "row")
        return pit_jax.layer_norm(pit_jax.sparse_dense(x, w, idx), s, s, idx)

    with pit_jax.use_reference(ops=("layer_norm",)):
        hlo = jax.jit(f).lower(x, w, s).as_text()
        y = jax.jit(f)(x, w, s)
    assert "pit_index" in hlo and "pit_row_gather_matmul" in hlo and "pit_row_layer_norm" not in hlo
    assert rel_err(y, jax.jit(f)(x, w, s)) < 1e-5
    with pit_jax.use_reference(ops="sparse_dense"):
        assert config.reference_enabled("sparse_dense") and not config.reference_enabled("index")
        assert not config.reference_enabled()  # "every op" only when all are on
    monkeypatch.setenv("PIT_JAX_REFERENCE", "moe, sread")
    assert config.reference_enabled("moe") and config.reference_enabled("sread")
    assert not config.reference_enabled("sparse_dense")
    with pit_jax.use_reference(False):
        assert not config.reference_enabled("moe")
    monkeypatch.setenv("PIT_JAX_REFERENCE", "1")
    assert all(config.reference_enabled(op) for op in config.OPS) and config.reference_enabled()
    monkeypatch.setenv("PIT_JAX_REFERENCE", "sparse_dens")
    with pytest.raises(ValueError, match=r"PIT_JAX_REFERENCE='sparse_dens'.*unknown op\(s\) \['sparse_dens'\]"):
        config.reference_enabled("moe")
    with pytest.raises(ValueError, match=r"use_reference: ops: unknown op\(s\) \['dense'\]"):
        with pit_jax.use_reference(ops=("dense",)):
            pass


def test_errors_at_trace_time():
    x, w = jnp.ones((8, 16)), jnp.ones((16, 4))
    with pytest.raises(ValueError, match=r"inner dimensions differ: x is \(8, 16\), w is \(15, 4\)"):
        pit_jax.sparse_dense(x, jnp.ones((15, 4)))
    with pytest.raises(ValueError, match=r"axis must be one of \('m', 'k', 'w'\), got 'n'"):
        pit_jax.sparse_dense(x, w, axis="n")
    with pytest.raises(TypeError, match=r"must be float32, bfloat16 or float16, got int32"):
        pit_jax.sparse_dense(x.astype(jnp.int32), w.astype(jnp.int32))
    with pytest.raises(ValueError, match=r"w must have rank >= 2"):
        pit_jax.sparse_dense(x, jnp.ones((16,)))
    with pytest.raises(ValueError, match=r"the index was built for a \(6, 16\) matrix but x is \(8, 16\)"):
        pit_jax.sparse_dense(x, w, pit_jax.index(jnp.ones((6, 16)), "row"))
    with pytest.raises(ValueError, match=r"the index was built for a \(8, 8\) matrix but x is \(8, 16\)"):
        pit_jax.sparse_dense(x, w, pit_jax.index(jnp.ones((8, 8)), (2, 2), group_by="both"), axis="k")
    with pytest.raises(ValueError, match=r"micro_tile \(2, 1\) differs from the index's \(4, 1\)"):
        pit_jax.sparse_dense(x, w, pit_jax.index(x, (4, 1), group_by="both"), axis="k", micro_tile=(2, 1))
    with pytest.raises(ValueError, match=r"axis='m' needs an index of row micro-tiles \(h, 16\)"):
        pit_jax.sparse_dense(x, w, pit_jax.index(x, (4, 1)), axis="m")
    with pytest.raises(ValueError, match=r"axis='m' gathers whole rows"):
        pit_jax.sparse_dense(x, w, axis="m", micro_tile=(1, 8))
    with pytest.raises(ValueError, match=r"needs the index's per-row lists; build the index with group_by='row'"):
        pit_jax.sparse_dense(x, w, pit_jax.index(x, (4, 1)), axis="k")
    with pytest.raises(TypeError, match=r"index must be a pit_jax.PitIndex"):
        pit_jax.sparse_dense(x, w, index=np.zeros(3))
    with pytest.raises(ValueError, match=r"precision must be None, a jax.lax.Precision or one of"):
        pit_jax.sparse_dense(x, w, precision="fp8")
    with pytest.raises(ValueError, match=r"the index has batch dims \(3,\), x has \(2,\)"):
        pit_jax.sparse_dense(jnp.ones((2, 8, 16)), w, pit_jax.index(jnp.ones((3, 8, 16)), "row"))
    with pytest.raises(TypeError, match=r"micro_tile\[0\] must be a static Python int"):
        jax.jit(lambda a, h: pit_jax.sparse_dense(a, w, axis="k", micro_tile=(h, 1)))(x, 2)


def test_precision_follows_jax_default_matmul_precision():
    from pit_jax.ops.sparse_dense import allow_tf32

    assert allow_tf32(None) is False
    with jax.default_matmul_precision("tensorfloat32"):
        assert allow_tf32(None) is True
    with jax.default_matmul_precision("float32"):
        assert allow_tf32(None) is False
    assert allow_tf32(jax.lax.Precision.HIGHEST) is False and allow_tf32("high") is True


def test_output_dtype_follows_matmul():
    x = jnp.ones((8, 16), jnp.bfloat16)
    for wdt in (jnp.bfloat16, jnp.float16, jnp.float32):
        w = jnp.ones((16, 4), wdt)
        assert pit_jax.sparse_dense(x, w).dtype == jnp.matmul(x, w).dtype


# -- CUDA graphs (XLA command buffers) ----------------------------------------------------


@requires_gpu
def test_jitted_step_under_command_buffers():
    """A jitted forward+backward runs from an XLA command buffer (CUDA graph) and agrees.

    Captured handlers are traced into the graph once and not re-run on replay, so the
    CUDA module's host-call counter must grow by less than (calls per step) x (steps).
    """
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np, pit_jax
        cuda = pit_jax._native._cuda
        rng = np.random.default_rng(0)
        x = jnp.asarray(np.maximum(rng.standard_normal((256, 128)), 0), jnp.bfloat16)
        w = jnp.asarray(rng.standard_normal((128, 64)), jnp.bfloat16)
        def step(x, w):
            f = lambda a, b: jnp.sum(pit_jax.sparse_dense(a, b, axis="k").astype(jnp.float32) ** 2)
            l, (gx, gw) = jax.value_and_grad(f, argnums=(0, 1))(x, w)
            return l, gx, w - 1e-3 * gw
        c = jax.jit(step).lower(x, w).compile()
        c0 = cuda.handler_calls()
        out = jax.block_until_ready(c(x, w))
        first = cuda.handler_calls() - c0
        for _ in range(5):
            out = jax.block_until_ready(c(x, w))
        replays = cuda.handler_calls() - c0 - first
        with pit_jax.use_reference():
            ref = jax.jit(step)(x, w)
        err = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))) /
                  (float(jnp.max(jnp.abs(b.astype(jnp.float32)))) + 1e-30)) for a, b in zip(out, ref))
        print("FIRST", first, "REPLAYS", replays, "ERR", err)
        """
    )
    env = child_env(XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,"
                    "CUSTOM_CALL --xla_gpu_graph_min_graph_size=1")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(pit_jax.__file__))))
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"FIRST (\d+) REPLAYS (\d+) ERR (\S+)", out.stdout)
    assert m, out.stdout + out.stderr[-2000:]
    first, replays, err = int(m.group(1)), int(m.group(2)), float(m.group(3))
    assert first >= 3, "the step runs at least the index and two products"
    assert replays < 5 * first, f"handlers re-ran on every replay ({first} per step, {replays} in 5 replays): not captured"
    assert err < 2e-2
