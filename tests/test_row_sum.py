"""pit_row_sum / row_bcast (column sums over the listed rows, and their transpose), and
what they are for: `sparse_dense(..., dead_rows="zeros")`, whose bias is on the live rows
only and whose bias gradient reads only those rows. Against float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import (PLATFORMS, activation64, assert_call_raises, check_close, check_sums, f64, fresh_rng,
                         listed_rows, live_rows, put, randn, row_index, unfused_z64)

import pit_jax
from pit_jax.primitives.row_sum import row_bcast, row_sum, slices

pytestmark = pytest.mark.usefixtures("poison_outputs")

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
# (M, N, tile_h): N a multiple of 8 (16-byte vectors) or not, M not a multiple of tile_h,
# and a list long enough to be summed in several slices (1000 x 3072).
# (5000, 136, 1): several rounds of list reads a thread (row_sum.cuh: kUnroll slots a round).
SHAPES = [(1, 8, 1), (37, 100, 1), (50, 96, 4), (33, 64, 32), (1000, 3072, 1), (5000, 136, 1)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("m,n,tile_h", SHAPES)
@pytest.mark.parametrize("lead", [(), (2,)], ids=["nobatch", "batch2"])
def test_row_sum_value(platform, dtype, density, m, n, tile_h, lead):
    rng, seed = fresh_rng()
    x = randn(rng, (*lead, m, n), dtype)
    live = live_rows(rng, lead, m, tile_h, density)
    xs, lv = put(platform, x, live)
    _, (tiles, count) = row_index(lv, tile_h)
    got = jax.jit(lambda x, t, c: row_sum(x, t, c, tile_h=tile_h))(xs, tiles, count)
    assert got.shape == (*lead, n) and got.dtype == jnp.dtype(dtype)
    want = np.where(live[..., None], f64(x), 0.0).sum(-2)
    check_sums(got, want, dtype, m, f"seed={seed}")
    assert np.isfinite(f64(got)).all(), f"seed={seed}: unwritten sums (poisoned)"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("capacity", [3, 10])
def test_row_sum_capacity_below_the_row_blocks(platform, capacity):
    """A list shorter than the live rows: the sums cover the rows the list holds."""
    rng, seed = fresh_rng()
    x = randn(rng, (40, 24), jnp.float32)
    live = live_rows(rng, (), 40, 1, 0.5)
    idx, (tiles, count) = row_index(put(platform, live), 1, capacity=capacity)
    got = jax.jit(lambda x: row_sum(x, tiles, count, tile_h=1))(put(platform, x))
    listed = listed_rows(idx, 40)
    check_close(got, np.where(listed[:, None], f64(x), 0.0).sum(0), jnp.float32, f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_row_sum_is_deterministic(platform):
    rng, _ = fresh_rng()
    x, live = put(platform, randn(rng, (2000, 768), jnp.bfloat16), live_rows(rng, (), 2000, 1, 0.6))
    _, (tiles, count) = row_index(live, 1)
    f = jax.jit(lambda x: row_sum(x, tiles, count, tile_h=1))
    assert slices(1, 2000, 768, jnp.bfloat16) > 1  # the order of the slices' sum is fixed
    np.testing.assert_array_equal(np.asarray(f(x).astype(jnp.float32)), np.asarray(f(x).astype(jnp.float32)))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_row_sum_and_row_bcast_transforms(platform):
    """Each is the other's transpose; jvp, vmap of the value and of the gradient, and
    an unbatched v broadcast over a batch (its gradient sums the entries)."""
    rng, seed = fresh_rng()
    m, n = 30, 16
    x = randn(rng, (3, m, n), jnp.float32)
    live = live_rows(rng, (3,), m, 1, 0.5)
    x, lv = put(platform, x, live)
    _, (tiles, count) = row_index(lv, 1)
    mask = jnp.asarray(live[..., None], jnp.float32)
    c = jnp.asarray(rng.standard_normal((3, n)), jnp.float32)
    loss = lambda x: jnp.sum(jnp.sin(row_sum(x, tiles, count, tile_h=1)) * c)  # noqa: E731
    ref = lambda x: jnp.sum(jnp.sin(jnp.sum(x * mask, -2)) * c)  # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss))(x)), np.asarray(jax.grad(ref)(x)), rtol=1e-5,
                               atol=1e-6, err_msg=f"seed={seed}")
    t = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    np.testing.assert_allclose(np.asarray(jax.jvp(loss, (x,), (t,))[1]), np.asarray(jax.jvp(ref, (x,), (t,))[1]),
                               rtol=1e-5, atol=1e-5)
    # vmap over the batch (the index mapped too), of the value and of the gradient
    f1 = lambda x, t, c: row_sum(x, t, c, tile_h=1)  # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(f1))(x, tiles, count)), np.asarray(jnp.sum(x * mask, -2)),
                               rtol=1e-5, atol=1e-5)
    g1 = jax.vmap(jax.grad(lambda x, t, cn, c: jnp.sum(jnp.sin(f1(x, t, cn)) * c)))
    np.testing.assert_allclose(np.asarray(jax.jit(g1)(x, tiles, count, c)),
                               np.asarray(mask * jnp.cos(jnp.sum(x * mask, -2))[:, None, :] * c[:, None, :]),
                               rtol=1e-5, atol=1e-6, err_msg=f"seed={seed}")
    # row_bcast of an unbatched v: value, and its gradient (row_sum, then the batch's sum)
    v = jnp.asarray(rng.standard_normal((n,)), jnp.float32)
    bc = lambda v: row_bcast(v, tiles, count, m=m, tile_h=1)  # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.jit(bc)(v)), np.asarray(mask * v), rtol=0, atol=0)
    ct = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    (dv,) = jax.linear_transpose(bc, v)(ct)
    np.testing.assert_allclose(np.asarray(dv), np.asarray(jnp.sum(ct * mask, (0, 1))), rtol=1e-5, atol=1e-5)
    (dx,) = jax.linear_transpose(lambda x: row_sum(x, tiles, count, tile_h=1), x)(c)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(mask * c[:, None, :]), rtol=0, atol=0)
    # second order through both: the Hessian-vector product of the loss
    hvp = lambda fn: jax.jvp(jax.grad(fn), (x,), (t,))[1]  # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.jit(lambda: hvp(loss))()), np.asarray(hvp(ref)), rtol=1e-4,
                               atol=1e-5)


def test_row_sum_bad_input_is_a_clear_error():
    x = jnp.ones((4, 8))
    tiles, count = jnp.zeros((4,), jnp.int32), jnp.zeros((), jnp.int32)
    with pytest.raises(TypeError, match="row_sum: x must be float32, bfloat16 or float16"):
        row_sum(jnp.ones((4, 8), jnp.int32), tiles, count, tile_h=1)
    with pytest.raises(ValueError, match=r"row_sum: x must be \[..., M, N\]"):
        row_sum(jnp.ones((8,)), tiles, count, tile_h=1)
    with pytest.raises(ValueError, match=r"row_sum: tile_h must be in \[1, M\] = \[1, 4\], got 5"):
        row_sum(x, tiles, count, tile_h=5)
    with pytest.raises(ValueError, match="row_sum: the index's batch dims"):
        row_sum(x, jnp.zeros((2, 4), jnp.int32), jnp.zeros((2,), jnp.int32), tile_h=1)
    with pytest.raises(ValueError, match=r"row_bcast: v must be \[N\] or \[..., N\]"):
        row_bcast(jnp.ones((3, 8)), tiles, count, m=4, tile_h=1)


def _raw(outs, *args, tile_h=1):
    return jax.ffi.ffi_call("pit_row_sum", outs)(*args, tile_h=np.int64(tile_h))


_X = jnp.ones((4, 8), jnp.float32)
_T, _C = jnp.zeros((4,), jnp.int32), jnp.zeros((), jnp.int32)
_S = jax.ShapeDtypeStruct((8,), jnp.float32)
RAW_BAD = {
    "sums must be \\[..., N\\]": lambda: _raw((jax.ShapeDtypeStruct((7,), jnp.float32), _S), _X, _T, _C),
    "work must be float32 \\[..., slices, N\\]": lambda: _raw((_S, jax.ShapeDtypeStruct((2, 7), jnp.float32)),
                                                              _X, _T, _C),
    "tile_h must be in \\[1, M\\]": lambda: _raw((_S, jax.ShapeDtypeStruct((0,), jnp.float32)), _X, _T, _C,
                                                   tile_h=5),
}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("what", list(RAW_BAD), ids=lambda c: c[:24])
def test_raw_target_refuses_bad_input(platform, what):
    assert_call_raises(platform, "pit_row_sum: .*" + what, RAW_BAD[what])


# -- sparse_dense(dead_rows="zeros") ---------------------------------------------------------

EPILOGUES = [("gelu_exact", True, 1), ("relu", True, 1), (None, True, 1), (None, False, 1), (None, True, 3),
             ("gelu", True, 3), (jnp.tanh, True, 1)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("activation,use_bias,parts", EPILOGUES,
                         ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("density", [0.0, 0.35, 1.0])
def test_sparse_dense_zero_dead_rows(platform, dtype, activation, use_bias, parts, density):
    """Live rows: act(x @ w + bias); dead rows: zeros. Gradients of x, w and bias are the
    masked expression's (the bias's sums the live rows only), and the backward reads the
    bias's sum from pit_row_sum where the bias is fused."""
    rng, seed = fresh_rng()
    m, k, n = 70, 48, 96
    x = randn(rng, (m, k), dtype)
    live = live_rows(rng, (), m, 1, density)
    x = np.where(live[:, None], np.asarray(x, np.float32), 0.0).astype(jnp.dtype(dtype))  # dead rows are zero
    w = randn(rng, (k, n), dtype)
    bias = randn(rng, (n,), dtype) if use_bias else None
    dy = randn(rng, (m, n), dtype)
    xs, ws, bs, dys, lv = put(platform, x, w, bias if use_bias else np.zeros((n,), np.float32), dy, live)
    bs = bs if use_bias else None

    def f(x, w, b):
        idx = pit_jax.index(x, "row")
        y = pit_jax.sparse_dense(x, w, idx, bias=b, activation=activation, out_parts=parts, dead_rows="zeros")
        return jnp.concatenate(y, -1) if parts > 1 else y

    def vjp(x, w, b):
        y, back = jax.vjp(f, x, w, b)
        return (y, *back(dys))

    y, dx, dw, db = jax.jit(vjp)(xs, ws, bs)
    act = (lambda v: v) if activation is None else (
        (lambda v: np.tanh(v)) if callable(activation) else (lambda v: activation64(v, activation)))
    z = f64(x) @ f64(w) + (f64(bias) if use_bias else 0.0)
    if callable(activation):  # the unfused path rounds the product, then the sum
        z = unfused_z64(x, w, f64(bias) if use_bias else 0.0, dtype)
    check_close(y, np.where(live[:, None], act(z), 0.0), dtype, f"seed={seed} y")
    assert not f64(y)[~live].any(), f"seed={seed}: dead rows must be zeros"

    def ref(x, w, b):  # the masked expression in float32, differentiated by JAX
        zz = x.astype(jnp.float32) @ w.astype(jnp.float32) + (0.0 if b is None else b.astype(jnp.float32))
        if activation == "relu":  # the kink where pit's rounded z has the sign: its y decides
            return jnp.where(lv[:, None] & (y > 0), zz, 0.0)
        a = zz if activation is None else (activation(zz) if callable(activation) else
                                           pit_jax._activations.ACTIVATIONS[activation](zz))
        return jnp.where(lv[:, None], a, 0.0)

    _, back = jax.vjp(ref, xs, ws, bs)
    want = back(dys.astype(jnp.float32))
    for name, got, w_ in zip(("dx", "dw", "db"), (dx, dw, db), want):
        if w_ is None:
            continue
        # 16-bit: the cotangents are rounded before they are summed (and the callable
        # activation's derivative runs in XLA in that type): a few units of the last place.
        tol = 1e-5 if dtype == jnp.float32 else 3e-2
        err, scale = np.abs(f64(got) - f64(w_)).max(), max(1.0, np.abs(f64(w_)).max())
        assert err <= tol * scale, f"seed={seed} {name}: max error {err:.3g} > {tol} * {scale:.3g}"
    if use_bias and (isinstance(activation, str) or activation is None) and density > 0:
        jaxpr = str(jax.make_jaxpr(vjp)(xs, ws, bs))
        # With parts, the parts' cotangents are joined and summed in one pass (row_split).
        target = "pit_row_concat_sum[" if parts == 3 else "pit_row_sum["
        assert target in jaxpr, "the fused bias's gradient is a sum over the live rows"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_zero_dead_rows_transforms(platform):
    """jit of a training step, vmap and vmap(grad), jvp (the bias tangent on live rows)."""
    rng, seed = fresh_rng()
    x = randn(rng, (3, 20, 16), jnp.float32)
    live = live_rows(rng, (3,), 20, 1, 0.5)
    x = np.where(live[..., None], x, 0.0).astype(np.float32)
    w, b = randn(rng, (16, 24), jnp.float32), randn(rng, (24,), jnp.float32)
    x, w, b, lv = put(platform, x, w, b, live)

    def f(x, w, b):
        return pit_jax.sparse_dense(x, w, bias=b, activation="silu", dead_rows="zeros")

    def ref(x, w, b):
        return jnp.where(lv[..., None], jax.nn.silu(x @ w + b), 0.0)

    loss = lambda fn: (lambda x, w, b: jnp.sum(jnp.sin(fn(x, w, b))))  # noqa: E731
    g = jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))(x, w, b)
    g_ref = jax.grad(loss(ref), argnums=(0, 1, 2))(x, w, b)
    for a, r in zip(g, g_ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-4, atol=1e-5, err_msg=f"seed={seed}")
    vf = jax.jit(jax.vmap(f, in_axes=(0, None, None)))(x, w, b)
    np.testing.assert_allclose(np.asarray(vf), np.asarray(ref(x, w, b)), rtol=1e-5, atol=1e-5)
    vg = jax.jit(jax.vmap(jax.grad(loss(f), argnums=2), in_axes=(0, None, None)))(x, w, b)
    ref1 = lambda x, w, b, l: jnp.sum(jnp.sin(jnp.where(l[:, None], jax.nn.silu(x @ w + b), 0.0)))  # noqa: E731
    vg_ref = jax.vmap(jax.grad(ref1, argnums=2), in_axes=(0, None, None, 0))(x, w, b, lv)
    np.testing.assert_allclose(np.asarray(vg), np.asarray(vg_ref), rtol=1e-4, atol=1e-5, err_msg=f"seed={seed}")
    tb = jnp.ones_like(b)
    t = jax.jvp(lambda b: f(x, w, b), (b,), (tb,))[1]
    t_ref = jax.jvp(lambda b: ref(x, w, b), (b,), (tb,))[1]
    np.testing.assert_allclose(np.asarray(t), np.asarray(t_ref), rtol=1e-5, atol=1e-6)


def test_dead_rows_bad_input_is_a_clear_error():
    x, w = jnp.ones((4, 8)), jnp.ones((8, 6))
    with pytest.raises(ValueError, match=r"dead_rows must be one of \('dense', 'zeros', 'unspecified'\), got 'zero'"):
        pit_jax.sparse_dense(x, w, dead_rows="zero")
    with pytest.raises(ValueError, match="dead_rows='zeros' needs the M axis .* got axis='k'"):
        pit_jax.sparse_dense(x, w, axis="k", dead_rows="zeros")
    with pytest.raises(ValueError, match="dead_rows='zeros' needs the M axis, and the plan is dense"):
        dense = pit_jax.Plan(axis=None, micro_tile=None, operand="x", dtype="float32", tf32=False, x_shape=(4, 8),
                             w_shape=(8, 6), expected_ms=1.0, dense_ms=1.0, density=1.0, runner_up=None,
                             candidates=(), database="test")
        pit_jax.sparse_dense(x, w, plan=dense, dead_rows="zeros")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_flax_layers_zero_dead_rows(platform):
    from flax import nnx

    from pit_jax.flax import SparseDense
    from pit_jax.flax.nnx import SparseDense as NnxSparseDense

    rng, seed = fresh_rng()
    live = live_rows(rng, (2,), 12, 1, 0.5)
    x = np.where(live[..., None], randn(rng, (2, 12, 16), jnp.float32), 0.0).astype(np.float32)
    x = put(platform, x)
    layer = SparseDense(8, activation="gelu", dead_rows="zeros",
                        bias_init=jax.nn.initializers.normal(1.0))
    params = layer.init(jax.random.PRNGKey(0), x)
    y = jax.jit(layer.apply)(params, x)
    dense = jax.nn.gelu(x @ params["params"]["kernel"] + params["params"]["bias"])
    np.testing.assert_allclose(np.asarray(y), np.where(live[..., None], np.asarray(dense), 0.0), rtol=1e-5,
                               atol=1e-5, err_msg=f"seed={seed}")
    layer2 = NnxSparseDense(16, 8, dead_rows="zeros", bias_init=jax.nn.initializers.normal(1.0),
                            rngs=nnx.Rngs(0))
    y2 = layer2(x)
    dense2 = x @ layer2.kernel[...] + layer2.bias[...]
    np.testing.assert_allclose(np.asarray(y2), np.where(live[..., None], np.asarray(dense2), 0.0), rtol=1e-5,
                               atol=1e-5, err_msg=f"seed={seed}")
