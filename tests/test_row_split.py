"""row_split / row_concat_sum (pit_row_concat_sum): a product's tangent split into column
parts with a bias on the listed rows, and its transpose, which concatenates the parts'
cotangents and sums them over the listed rows in one pass. What they are for: the
gradient of `sparse_dense(..., out_parts=P, dead_rows="zeros")` (BERT's q / k / v) with no
concatenation over every row. Against float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import (PLATFORMS, assert_call_raises, check_close, check_sums, f64, fresh_rng, listed_rows, live_rows,
                         put, randn, requires_gpu, row_index, tiled_sparse)

import pit_jax
from pit_jax.primitives.row_split import row_concat_sum, row_split

pytestmark = pytest.mark.usefixtures("poison_outputs")

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
# (M, Np, tile_h): Np a multiple of 8 (16-byte vectors) or not, M not a multiple of
# tile_h, BERT's q / k / v (4096 x 768), and a list summed in several slices.
SHAPES = [(1, 8, 1), (37, 12, 1), (50, 32, 4), (33, 64, 32), (4096, 768, 1), (1000, 1000, 1)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("m,np_,tile_h", SHAPES)
@pytest.mark.parametrize("lead", [(), (2,)], ids=["nobatch", "batch2"])
def test_concat_sum_value(platform, dtype, density, m, np_, tile_h, lead):
    """cat holds the parts side by side on the listed rows, exactly; sums are its column
    sums over them (float32, one rounding). The other rows of cat are not specified."""
    if m * np_ * (2 if lead else 1) > 2_000_000 and platform == "cpu" and dtype != jnp.bfloat16:
        pytest.skip("the large shapes once a dtype on the CPU")
    rng, seed = fresh_rng()
    xs = [randn(rng, (*lead, m, np_), dtype) for _ in range(3)]
    live = live_rows(rng, lead, m, tile_h, density)
    args = put(platform, *xs, live)
    _, (tiles, count) = row_index(args[3], tile_h)
    cat, sums = jax.jit(lambda a, b, c, t, n: row_concat_sum([a, b, c], t, n, tile_h=tile_h))(*args[:3], tiles, count)
    assert cat.shape == (*lead, m, 3 * np_) and sums.shape == (*lead, 3 * np_) and cat.dtype == jnp.dtype(dtype)
    whole = np.concatenate([f64(x) for x in xs], axis=-1)
    np.testing.assert_array_equal(f64(cat)[live], whole[live], err_msg=f"seed={seed}: cat's listed rows")
    want = np.where(live[..., None], whole, 0.0).sum(-2)
    check_sums(sums, want, dtype, m, f"seed={seed}: sums")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("capacity", [3, 10])
def test_concat_sum_capacity_below_the_row_blocks(platform, capacity):
    """A list shorter than the live rows: cat and the sums cover the rows the list holds."""
    rng, seed = fresh_rng()
    xs = [randn(rng, (40, 16), jnp.float32) for _ in range(3)]
    live = live_rows(rng, (), 40, 1, 0.5)
    idx, (tiles, count) = row_index(put(platform, live), 1, capacity=capacity)
    cat, sums = jax.jit(lambda *a: row_concat_sum(list(a), tiles, count, tile_h=1))(*put(platform, *xs))
    listed = listed_rows(idx, 40)
    whole = np.concatenate([f64(x) for x in xs], axis=-1)
    np.testing.assert_array_equal(f64(cat)[listed], whole[listed], err_msg=f"seed={seed}")
    check_close(sums, np.where(listed[:, None], whole, 0.0).sum(0), jnp.float32, f"seed={seed}")


def test_concat_sum_leaves_other_rows_nan_on_the_cpu():
    """The CPU handler writes NaN on cat's unlisted rows (unspecified), so a reader of them
    shows; two parts or four (no kernel) concatenate in jnp."""
    with jax.default_device(jax.devices("cpu")[0]):
        live = np.array([True, False, True, False, False])
        _, (tiles, count) = row_index(jnp.asarray(live), 1)
        xs = [jnp.full((5, 8), float(k + 1)) for k in range(3)]
        cat, sums = row_concat_sum(xs, tiles, count, tile_h=1)
        assert np.isnan(np.asarray(cat)[~live]).all() and not np.isnan(np.asarray(cat)[live]).any()
        np.testing.assert_array_equal(np.asarray(sums), np.repeat([2.0, 4.0, 6.0], 8))
        for parts in (2, 4):
            cat, sums = row_concat_sum(xs[:1] * parts, tiles, count, tile_h=1)
            assert cat.shape == (5, 8 * parts)
            np.testing.assert_array_equal(np.asarray(sums), np.full(8 * parts, 2.0))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_split_and_concat_sum_are_each_others_transpose(platform):
    """row_split (t + bias on the listed rows, split) and row_concat_sum are linear and
    transposes of each other on the listed rows (the unlisted rows of cat don't count);
    vmap of both, and the jvp of row_concat_sum."""
    rng, seed = fresh_rng()
    b, m, n = 2, 24, 48
    live = live_rows(rng, (b,), m, 1, 0.5)
    t, db = randn(rng, (b, m, n), jnp.float32), randn(rng, (b, n), jnp.float32)
    cts = [randn(rng, (b, m, n // 3), jnp.float32) for _ in range(3)]
    t, db, lv, *cts = put(platform, t, db, live, *cts)
    _, (tiles, count) = row_index(lv, 1)
    split = lambda t, db: row_split(t, db, tiles, count, parts=3, tile_h=1)  # noqa: E731
    parts = jax.jit(split)(t, db)
    want = f64(t) + np.where(live[..., None], f64(db)[:, None], 0.0)
    for k, p in enumerate(parts):
        np.testing.assert_allclose(f64(p), want[..., 16 * k:16 * (k + 1)], rtol=1e-6, err_msg=f"seed={seed}")
    ct_t, ct_db = jax.jit(jax.linear_transpose(split, t, db))(cts)
    whole = np.concatenate([f64(c) for c in cts], axis=-1)
    np.testing.assert_array_equal(f64(ct_t)[live], whole[live], err_msg=f"seed={seed}: t's cotangent")
    check_close(ct_db, np.where(live[..., None], whole, 0.0).sum(-2), jnp.float32, f"seed={seed}: db's")
    # <split(t, db), c> == <(t, db), transpose(c)> on the listed rows (t's dead rows: zero)
    t_live = jnp.where(lv[..., None], t, 0.0)
    lhs = sum(jnp.vdot(p, c) for p, c in zip(split(t_live, db), cts))
    rhs = jnp.vdot(jnp.where(lv[..., None], ct_t, 0.0), t_live) + jnp.vdot(ct_db, db)
    np.testing.assert_allclose(float(lhs), float(rhs), rtol=1e-4, err_msg=f"seed={seed}: adjoint")
    v = jax.jit(jax.vmap(lambda a, c, d, tt, nn: row_concat_sum([a, c, d], tt, nn, tile_h=1)))(*cts, tiles, count)
    np.testing.assert_array_equal(f64(v[0])[live], whole[live], err_msg=f"seed={seed}: vmap")
    vs = jax.jit(jax.vmap(lambda a, d, tt, nn: row_split(a, d, tt, nn, parts=3, tile_h=1)))(t, db, tiles, count)
    for p, q in zip(vs, parts):
        np.testing.assert_allclose(f64(p), f64(q), rtol=1e-6, err_msg=f"seed={seed}: vmap of row_split")
    _, (dcat, dsums) = jax.jvp(lambda *a: row_concat_sum(list(a), tiles, count, tile_h=1), cts, cts)
    np.testing.assert_array_equal(f64(dcat)[live], whole[live], err_msg=f"seed={seed}: jvp")


def _parts_loss(dead_rows, activation):
    def loss(x, w, b, cot):
        ys = pit_jax.sparse_dense(x, w, pit_jax.index(x, (1, None)), bias=b, out_parts=3, dead_rows=dead_rows,
                                  activation=activation)
        return sum(jnp.sum(y.astype(jnp.float32) * c) for y, c in zip(ys, jnp.split(cot, 3, axis=-1)))
    return loss


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("activation", [None, "silu"])
def test_parts_zeros_gradient_has_no_concatenation(platform, activation):
    """sparse_dense(..., out_parts=3, dead_rows="zeros"): the gradient concatenates and
    sums the parts' cotangents in pit_row_concat_sum (no XLA concatenate), and x's, w's
    and the bias's gradients match float64 (the bias on the live rows only)."""
    rng, seed = fresh_rng()
    m, k, n = 40, 24, 48
    x, live = tiled_sparse(rng, (m, k), (1, k), 0.4, jnp.float32)
    w, b = randn(rng, (k, n), jnp.float32), randn(rng, (n,), jnp.float32)
    cot = rng.standard_normal((m, n)).astype(np.float32)
    args = put(platform, x, w, b, cot)
    grad = jax.jit(jax.grad(_parts_loss("zeros", activation), argnums=(0, 1, 2)))
    text = grad.lower(*args).as_text()
    assert "pit_row_concat_sum" in text and "concatenate" not in text, "the parts' cotangents were concatenated"
    mask = live.any(-1).astype(np.float64)[:, None]  # the live rows
    z = (f64(x) * mask) @ f64(w) + f64(b)
    if activation is None:
        dz = f64(cot) * mask
    else:
        s = 1 / (1 + np.exp(-z))
        dz = f64(cot) * s * (1 + z * (1 - s)) * mask
    want = {"dx": (dz @ f64(w).T) * mask, "dw": (f64(x) * mask).T @ dz, "dbias": dz.sum(0)}
    for what, got in zip(("dx", "dw", "dbias"), grad(*args)):
        check_close(got, want[what], jnp.float32, f"seed={seed}: {what}")


@requires_gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
def test_parts_zeros_gradient_gpu_bert_shape(dtype):
    """BERT's q / k / v shape on the GPU (the cluster kernel): dead_rows="zeros", the
    gradient through pit_row_concat_sum, against float64."""
    rng, seed = fresh_rng()
    m, k = 4096, 768
    x, live = tiled_sparse(rng, (m, k), (1, k), 0.27, dtype)
    w, b = randn(rng, (k, 2304), dtype), randn(rng, (2304,), dtype)
    cot = rng.standard_normal((m, 2304)).astype(np.float32)
    args = put("gpu", x, w, b, cot)
    grad = jax.jit(jax.grad(_parts_loss("zeros", None), argnums=(0, 1, 2)))
    assert "pit_row_concat_sum" in grad.lower(*args).as_text()
    mask = live.any(-1).astype(np.float64)[:, None]  # the live rows
    dz = f64(cot) * mask
    want = {"dx": (dz @ f64(w).T) * mask, "dw": (f64(x) * mask).T @ dz, "dbias": dz.sum(0)}
    for what, got in zip(("dx", "dw", "dbias"), grad(*args)):
        check_close(got, want[what], dtype, f"seed={seed}: {what}")


def _raw(xs, cat_shape, sums_shape, dtype=jnp.float32):
    outs = (jax.ShapeDtypeStruct(cat_shape, dtype), jax.ShapeDtypeStruct(sums_shape, dtype),
            jax.ShapeDtypeStruct((0,), jnp.float32))
    tiles, count = jnp.zeros((4,), jnp.int32), jnp.zeros((), jnp.int32)
    return jax.ffi.ffi_call("pit_row_concat_sum", outs)(*xs, tiles, count, tile_h=np.int64(1))


_F = lambda *s: jnp.ones(s, jnp.float32)  # noqa: E731
RAW_BAD = {
    "x1 and x2 must have x0's shape and dtype": lambda: _raw([_F(4, 8), _F(4, 8), _F(4, 7)], (4, 24), (24,)),
    "cat must be \\[\\.\\.\\., M, 3 Np\\]": lambda: _raw([_F(4, 8)] * 3, (4, 16), (24,)),
    "sums must be \\[\\.\\.\\., N\\]": lambda: _raw([_F(4, 8)] * 3, (4, 24), (16,)),
}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", list(RAW_BAD))
def test_raw_target_refuses_bad_input(platform, case):
    assert_call_raises(platform, "pit_row_concat_sum: " + case, RAW_BAD[case])


def test_bad_input_is_a_clear_error():
    tiles, count = jnp.zeros((4,), jnp.int32), jnp.zeros((), jnp.int32)
    with pytest.raises(ValueError, match=r"row_concat_sum: every part must be \(4, 8\) float32"):
        row_concat_sum([_F(4, 8), _F(4, 6)], tiles, count, tile_h=1)
    with pytest.raises(ValueError, match=r"row_split: t must be \[\.\.\., M, N\] with N a multiple of parts = 3"):
        row_split(_F(4, 8), None, tiles, count, parts=3, tile_h=1)
    with pytest.raises(ValueError, match=r"row_split: db must be \[N\] or \[\.\.\., N\]"):
        row_split(_F(4, 9), _F(8), tiles, count, parts=3, tile_h=1)
