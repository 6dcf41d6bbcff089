"""sparse_dense with bias and activation: act((x * mask) @ w + bias) against float64.

On the M axis a named activation (with its [N] bias, if any) runs in the row-gather
kernel's epilogue (primitives/row_linear.py): live rows get act(product + bias), dead rows
act(bias) without a product; differentiated, one kernel writes act(z) and z = product +
bias (pit_row_gather_matmul_pre, z on the live rows only) and the activation's derivative
runs on the live rows (pit_row_activation_bwd). Everything else (a
bias alone, callables, batched biases, the K and W axes) is the unfused expression. Fresh random data every run; native outputs are
poisoned (NaN) before each kernel.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from pit_testing import PLATFORMS, activation64, f64, fresh_rng, put, randn, requires_gpu, tiled_sparse

import pit_jax
from pit_jax.flax import SparseDense
from pit_jax.flax.nnx import SparseDense as NnxSparseDense

pytestmark = pytest.mark.usefixtures("poison_outputs")

TOL = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 1e-2}
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
NAMES = ["relu", "gelu", "gelu_exact", "silu", None]


def rows_case(rng, lead, m, k, n, density, dtype):
    """x with random live rows (dead rows all zero), w, bias, and the [..., M, 1] row mask."""
    x, live = tiled_sparse(rng, (*lead, m, k), (1, k), density, dtype)
    w = randn(rng, (k, n), dtype)
    b = randn(rng, (n,), dtype)
    return x, w, b, live.astype(np.float64)


def ref(x, w, b, mask, name):
    y = (f64(x) * mask) @ f64(w)
    return activation64(y + (0.0 if b is None else f64(b)), name)


def rel_err(got, want):
    got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
    assert not np.isnan(got).any(), "NaN in the output: an element was not written"
    return np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)


CASES = [(DTYPES[i % 3], NAMES[i % 5], [0.0, 0.3, 1.0][i % 3], i % 2 == 0) for i in range(15)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype,name,density,with_bias", CASES,
                         ids=[f"{jnp.dtype(c[0]).name}-{c[1]}-d{c[2]}-b{int(c[3])}" for c in CASES])
def test_m_axis_fused_matches_float64(platform, dtype, name, density, with_bias):
    rng, seed = fresh_rng()
    x, w, b, mask = rows_case(rng, (), 75, 40, 72, density, dtype)
    b = b if with_bias else None
    f = jax.jit(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation=name))
    y = f(*put(platform, x, w), b if b is None else put(platform, b))
    assert y.dtype == jnp.dtype(dtype) and y.shape == (75, 72)
    err = rel_err(y, ref(x, w, b, mask, name))
    assert err < TOL[jnp.dtype(dtype).name], f"seed={seed}: relative error {err:.2e}"
    if b is None:  # act(0) = 0: dead rows exactly zero
        dead = np.asarray(y, np.float32)[mask[:, 0] == 0]
        assert not dead.any(), f"seed={seed}: dead rows must be 0 without a bias"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("m,k,n", [(75, 40, 72), (1500, 768, 3072)], ids=["small", "hopper"])
def test_fused_relu_keeps_nan(platform, dtype, m, k, n):
    """A NaN in a live row gives a NaN row through the fused ReLU, as jax.nn.relu does
    (the device's fmaxf used to give 0 there); the other rows are exact."""
    if platform == "cpu" and m > 100:
        pytest.skip("the sm_90 kernel's shapes: GPU only")
    rng, seed = fresh_rng()
    x, w, b, mask = rows_case(rng, (), m, k, n, 0.5, dtype)
    live = np.flatnonzero(mask[:, 0])
    bad = int(live[rng.integers(len(live))])
    x = np.array(x)
    x[bad, rng.integers(k)] = np.nan
    prec = "tensorfloat32" if dtype == jnp.float32 and m > 100 else None
    f = jax.jit(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation="relu", precision=prec))
    y = np.asarray(jnp.asarray(f(*put(platform, x, w, b)), jnp.float32), np.float64)
    assert np.isnan(y[bad]).all(), f"seed={seed}: row {bad} lost its NaN"
    keep = np.arange(m) != bad
    want = ref(x, w, b, mask, "relu")[keep]
    tol = 3e-3 if prec else TOL[jnp.dtype(dtype).name]
    assert rel_err(y[keep], want) < tol, f"seed={seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_dead_rows_hold_activation_of_bias(platform):
    """No live row at all: every row is act(bias), written without a product."""
    rng, seed = fresh_rng()
    x, w, b, mask = rows_case(rng, (), 33, 24, 40, 0.0, jnp.float32)
    y = jax.jit(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation="silu"))(*put(platform, x, w, b))
    want = np.broadcast_to(activation64(f64(b), "silu"), (33, 40))
    assert rel_err(y, want) < 1e-6, f"seed={seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_batch_dims_vector_and_index(platform):
    rng, seed = fresh_rng()
    x, w, b, mask = rows_case(rng, (2, 3), 20, 16, 24, 0.5, jnp.float32)
    idx_src = np.asarray(x)

    def f(x, w, b, p):
        idx = pit_jax.index(p, (1, None))
        return pit_jax.sparse_dense(x, w, idx, bias=b, activation="gelu_exact")

    y = jax.jit(f)(*put(platform, x, w, b, idx_src))
    assert rel_err(y, ref(x, w, b, mask, "gelu_exact")) < TOL["float32"], f"seed={seed}"
    v = jax.jit(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation="relu"))(*put(platform, x[0, 0, 3], w, b))
    assert v.shape == (24,)
    assert rel_err(v, ref(x[0, 0, 3][None], w, b, mask[0, 0, 3][None], "relu")[0]) < TOL["float32"], f"seed={seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", ["k", "w"])
def test_other_axes_and_callables_are_unfused(platform, axis):
    rng, seed = fresh_rng()
    x = randn(rng, (40, 64), jnp.float32)
    x = np.where(rng.random((40, 64)) < 0.5, 0.0, x).astype(np.float32)
    w = randn(rng, (64, 48), jnp.float32)
    b = randn(rng, (48,), jnp.float32)
    tile = (8, 4) if axis == "k" else (16, 16)
    f = jax.jit(lambda x, w, b: pit_jax.sparse_dense(x, w, axis=axis, micro_tile=tile, bias=b, activation=jnp.tanh))
    y = f(*put(platform, x, w, b))
    # x's zeros make the masked product the dense one on the k axis; for w the index comes from w (dense).
    want = np.tanh(f64(x) @ f64(w) + f64(b))
    assert rel_err(y, want) < TOL["float32"], f"seed={seed}"
    # A batched bias on the M axis: broadcast after the product.
    bb = randn(rng, (3, 1, 48), jnp.float32)
    xb = np.stack([x] * 3)
    y = jax.jit(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation="gelu"))(*put(platform, xb, w, bb))
    assert rel_err(y, activation64(f64(xb) @ f64(w) + f64(bb), "gelu")) < TOL["float32"], f"seed={seed}"


def _loss_pit(x, w, b, name):
    y = pit_jax.sparse_dense(x, w, bias=b, activation=name)
    return jnp.sum(jnp.sin(y.astype(jnp.float32)))


JAX_ACTIVATIONS = {None: lambda v: v, "relu": jax.nn.relu, "gelu": jax.nn.gelu,
                   "gelu_exact": lambda v: jax.nn.gelu(v, approximate=False), "silu": jax.nn.silu}


def _loss_ref(x, w, b, name):
    live = jnp.any(x != 0, axis=-1, keepdims=True)
    y = jnp.matmul(jnp.where(live, x, 0.0), w, precision="highest") + b
    return jnp.sum(jnp.sin(JAX_ACTIVATIONS[name](y)))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", NAMES)
def test_gradients_and_vmap(platform, name):
    """grad w.r.t. x, w and bias (the fused product, then pit_row_activation on the live
    rows), vmap, vmap(grad): against the pure-JAX expression."""
    rng, seed = fresh_rng()
    x, w, b, mask = rows_case(rng, (3,), 30, 20, 24, 0.4, jnp.float32)
    args = put(platform, x, w, b)
    g = jax.jit(jax.grad(_loss_pit, argnums=(0, 1, 2)), static_argnums=3)(*args, name)
    with jax.default_device(jax.devices("cpu")[0]):
        want = jax.grad(_loss_ref, argnums=(0, 1, 2))(*(jnp.asarray(a) for a in (x, w, b)), name)
    for what, got, exp in zip(("dx", "dw", "dbias"), g, want):
        exp = np.asarray(exp, np.float64) * (mask if what == "dx" else 1.0)
        assert rel_err(got, exp) < 1e-4, f"seed={seed}: {what}"
    # vmap over x (shared w and bias) and over the bias too (the unfused route).
    fwd = jax.jit(jax.vmap(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation=name), (0, None, None)))
    assert rel_err(fwd(*args), ref(x, w, b, mask, name)) < TOL["float32"], f"seed={seed}"
    bs = np.stack([b, 2 * b, -b]).astype(np.float32)
    fwd_b = jax.jit(jax.vmap(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation=name), (0, None, 0)))
    want_b = np.stack([ref(x[i], w, bs[i], mask[i], name) for i in range(3)])
    assert rel_err(fwd_b(args[0], args[1], put(platform, bs)), want_b) < TOL["float32"], f"seed={seed}"
    vg = jax.jit(jax.vmap(jax.grad(_loss_pit, argnums=(1, 2)), (0, None, None, None)), static_argnums=3)(*args, name)
    with jax.default_device(jax.devices("cpu")[0]):
        vwant = jax.vmap(jax.grad(_loss_ref, argnums=(1, 2)), (0, None, None, None))(
            *(jnp.asarray(a) for a in (x, w, b)), name)
    for got, exp in zip(vg, vwant):
        assert rel_err(got, np.asarray(exp, np.float64)) < 1e-4, f"seed={seed}: vmap(grad)"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("name", ["gelu_exact", None])
def test_tangents_in_some_operands(platform, parts, name):
    """Forward mode with tangents in some operands only (the fused JVP's branches: the bias
    alone, x alone without a bias, w alone), for one result and for three parts."""
    rng, seed = fresh_rng()
    x, w, b, _ = rows_case(rng, (), 40, 16, 24, 0.5, jnp.float32)
    tx, tw, tb = (randn(rng, a.shape, jnp.float32) for a in (x, w, b))
    X, W, B, TX, TW, TB = put(platform, x, w, b, tx, tw, tb)

    def pit(x, w, b):
        y = pit_jax.sparse_dense(x, w, bias=b, activation=name, out_parts=parts)
        return jnp.concatenate(y, axis=-1) if parts > 1 else y

    def reference(x, w, b):
        live = jnp.any(x != 0, axis=-1, keepdims=True)
        y = jnp.matmul(jnp.where(live, x, 0.0), w, precision="highest")
        return JAX_ACTIVATIONS[name](y if b is None else y + b)

    cases = {"bias": (lambda b: pit(X, W, b), lambda b: reference(x, w, b), (B,), (TB,), (b,), (tb,)),
             "x, no bias": (lambda x: pit(x, W, None), lambda x: reference(x, w, None), (X,), (TX,), (x,), (tx,)),
             "w": (lambda w: pit(X, w, B), lambda w: reference(x, w, b), (W,), (TW,), (w,), (tw,))}
    for what, (f, fr, p, t, pr, tr) in cases.items():
        y, ty = jax.jit(lambda p, t: jax.jvp(f, p, t))(p, t)
        with jax.default_device(jax.devices("cpu")[0]):
            wy, wt = jax.jvp(fr, tuple(map(jnp.asarray, pr)), tuple(map(jnp.asarray, tr)))
        assert rel_err(y, np.asarray(wy, np.float64)) < 1e-5, f"seed={seed}: {what}: value"
        assert rel_err(ty, np.asarray(wt, np.float64)) < 1e-4, f"seed={seed}: {what}: tangent"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_flax_layers_equal_activation_of_dense(platform, dtype):
    """SparseDense(activation=...) == act(nn.Dense(x)) with the same params, padding
    rows included (x's padding rows are zero, so nn.Dense gives act(bias) there too)."""
    rng, seed = fresh_rng()
    x, _, _, mask = rows_case(rng, (2,), 24, 32, 40, 0.5, dtype)
    layer = SparseDense(40, dtype=dtype, activation="gelu_exact", bias_init=nn.initializers.normal(1.0))
    params = layer.init(jax.random.PRNGKey(seed % 2**31), x)
    got = jax.jit(layer.apply)(put(platform, params), put(platform, x))
    dense = nn.Dense(40, dtype=dtype)
    want = jax.nn.gelu(dense.apply(params, jnp.asarray(x, jnp.float32).astype(dtype)).astype(jnp.float32),
                       approximate=False)
    assert rel_err(got, np.asarray(want, np.float64)) < TOL[jnp.dtype(dtype).name], f"seed={seed}"

    nl = NnxSparseDense(32, 40, dtype=dtype, activation="relu", bias_init=nnx.initializers.normal(1.0),
                        rngs=nnx.Rngs(seed % 2**31))
    want = ref(x, np.asarray(nl.kernel[...]).astype(dtype), np.asarray(nl.bias[...]).astype(dtype), mask, "relu")
    got = nnx.jit(lambda m, x: m(x))(nl, put(platform, x))
    assert rel_err(got, want) < TOL[jnp.dtype(dtype).name], f"seed={seed}"


def _f32_bias_pair(platform, x, w, b32, **kw):
    """sparse_dense with the float32 bias as it is, and with the bias cast to x's dtype
    first; and whether the float32 one reached a fused primitive uncast."""
    def f(x, w, b):
        y = pit_jax.sparse_dense(x, w, bias=b, **kw)
        return jnp.concatenate(y, axis=-1) if isinstance(y, tuple) else y
    X, W, B = put(platform, x, w, b32)
    got = jax.jit(f)(X, W, B)
    want = jax.jit(f)(X, W, B.astype(x.dtype))
    eqns = jax.make_jaxpr(f)(X, W, B).jaxpr.eqns
    fused = [e for e in eqns if e.primitive.name in ("pit_row_linear", "pit_row_linear_parts")]
    uncast = bool(fused) and all(e.invars[2].aval.dtype == jnp.float32 for e in fused)
    return got, want, uncast


F32_BIAS_CASES = [("gelu_exact", 1, "dense"), ("relu", 3, "dense"), (None, 1, "zeros"), (None, 3, "zeros"),
                  ("silu", 1, "zeros")]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name,parts,dead", F32_BIAS_CASES, ids=[f"{c[0]}-p{c[1]}-{c[2]}" for c in F32_BIAS_CASES])
def test_float32_bias_equals_the_bias_cast_first(platform, dtype, name, parts, dead):
    """A float32 bias with 16-bit x and w goes into the fused kernel uncast (no cast kernel
    per call) and gives exactly the result of the bias cast to x's dtype first; its
    gradient is float32 and agrees with the cast path's to 16-bit precision."""
    rng, seed = fresh_rng()
    x, w, _, mask = rows_case(rng, (), 75, 40, 72, 0.4, dtype)
    b32 = (rng.standard_normal(72) * 3).astype(np.float32)  # not representable in 16 bits
    kw = dict(activation=name, out_parts=parts, dead_rows=dead)
    got, want, uncast = _f32_bias_pair(platform, x, w, b32, **kw)
    assert uncast, "the float32 bias must reach the fused primitive uncast"
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32), err_msg=f"seed={seed}")
    want64 = ref(x, w, b32.astype(dtype), mask, name) * (mask if dead == "zeros" else 1.0)
    assert rel_err(got, want64) < TOL[jnp.dtype(dtype).name], f"seed={seed}"

    def loss(b, cast):
        y = pit_jax.sparse_dense(*put(platform, x, w), bias=b.astype(dtype) if cast else b, **kw)
        y = jnp.concatenate(y, axis=-1) if parts > 1 else y
        return jnp.sum(jnp.sin(y.astype(jnp.float32)))
    g32, gcast = (jax.jit(jax.grad(loss), static_argnums=1)(put(platform, b32), c) for c in (False, True))
    assert g32.dtype == jnp.float32
    # Both are 16-bit approximations of one gradient: the cast path sums the bias's
    # cotangent in x's dtype, the float32 path in float32.
    err = rel_err(g32, np.asarray(gcast, np.float64))
    assert err < TOL[jnp.dtype(dtype).name], f"seed={seed}: gradient relative difference {err:.2e}"


@requires_gpu
@pytest.mark.parametrize("k,n,parts,name,dead", [(768, 2304, 3, None, "zeros"), (768, 3072, 1, "gelu_exact", "zeros"),
                                                 (3072, 768, 1, None, "zeros"), (256, 520, 1, "relu", "dense")],
                         ids=["qkv-parts", "ffn_in", "split_k", "n520"])
def test_float32_bias_hopper_shapes_gpu(k, n, parts, name, dead):
    """The sm_90 kernel's float32-bias loads (the 16-bit stores, the three-part stores, the
    split-K reduction) at BERT-like shapes: bitwise the bias cast first."""
    rng, seed = fresh_rng()
    x, w, _, _ = rows_case(rng, (), 1500, k, n, 0.27, jnp.bfloat16)
    b32 = (rng.standard_normal(n) * 3).astype(np.float32)
    got, want, uncast = _f32_bias_pair("gpu", x, w, b32, activation=name, out_parts=parts, dead_rows=dead)
    assert uncast
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32), err_msg=f"seed={seed}")


PRE_CASES = [(jnp.bfloat16, 75, 40, 72, "gelu_exact", True), (jnp.float16, 75, 40, 72, "silu", False),
             (jnp.float32, 75, 40, 72, "relu", True), (jnp.bfloat16, 33, 24, 20, "gelu", True)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype,m,k,n,name,dead", PRE_CASES,
                         ids=[f"{jnp.dtype(c[0]).name}-{c[4]}-{c[2]}x{c[3]}" for c in PRE_CASES])
def test_pre_activation_kernel_equals_the_two_products(platform, dtype, m, k, n, name, dead):
    """row_linear_pre (pit_row_gather_matmul_pre), the primal of a differentiated product
    with an activation: act(z) bitwise row_linear's value and z bitwise the product with
    its bias and no activation, on the listed rows (z's other rows are not written: the
    poison stays there). N = 20 is no multiple of 8: the generic kernel on the GPU."""
    _pre_case(platform, dtype, m, k, n, name, dead, 0.4)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("k,n", [(768, 3072), (3072, 768), (256, 520)], ids=["ffn_in", "split_k", "n520"])
def test_pre_activation_kernel_hopper_shapes_gpu(dtype, k, n):
    """The same at BERT-like shapes on the GPU: the sm_90 kernel's 16-bit stores, the
    split-K reduction and the TF32 stores write z as well."""
    _pre_case("gpu", dtype, 1500, k, n, "gelu_exact", True, 0.27)


def _pre_case(platform, dtype, m, k, n, name, dead, density):
    from pit_jax.primitives.row_linear import row_linear, row_linear_pre_p

    rng, seed = fresh_rng()
    x, w, b, mask = rows_case(rng, (), m, k, n, density, dtype)
    index = pit_jax.index(put(platform, x), "row")
    tf32 = dtype == jnp.float32 and platform == "gpu"
    kw = dict(tile_h=1, allow_tf32=tf32, zero_dead=dead)
    args = put(platform, x, w, b)

    @jax.jit
    def both(x, w, b):
        y, z = row_linear_pre_p.bind(x, w, b, *index.arrays, activation=name, **kw)
        return y, z, row_linear(x, w, b, index.arrays, activation=name, **kw), \
            row_linear(x, w, b, index.arrays, activation=None, **kw)

    y, z, y1, z1 = (np.asarray(jnp.asarray(a, jnp.float32)) for a in both(*args))
    live = mask[:, 0] > 0
    np.testing.assert_array_equal(y, y1, err_msg=f"seed={seed}: act(z)")
    np.testing.assert_array_equal(z[live], z1[live], err_msg=f"seed={seed}: z on the listed rows")
    tol = 3e-3 if tf32 else TOL[jnp.dtype(dtype).name]
    assert rel_err(y, ref(x, w, b, mask, name) * (mask if dead else 1.0)) < tol, f"seed={seed}"
    assert rel_err(z[live], (ref(x, w, b, mask, None))[live]) < tol, f"seed={seed}"


def test_raw_pre_target_errors_name_it():
    """pit_row_gather_matmul_pre called directly: no activation, or a z unlike c, is an
    error naming the target; the primitive refuses a missing activation at trace time."""
    from pit_jax.primitives.row_linear import row_linear_pre_p

    with jax.default_device(jax.devices("cpu")[0]):
        x, w = jnp.ones((8, 4)), jnp.ones((4, 6))
        idx = pit_jax.index(x, "row")
        empty = jnp.zeros((0,), jnp.float32)
        out = jax.ShapeDtypeStruct((8, 6), jnp.float32)
        attrs = dict(tile_h=np.int64(1), trans_b=False, allow_tf32=False, skip_dead=False)
        for outs, act, msg in (((out, out), 0, "needs an activation"),
                               ((out, jax.ShapeDtypeStruct((8, 5), jnp.float32)), 1, "z must have c's shape")):
            with pytest.raises(Exception, match=f"pit_row_gather_matmul_pre: {msg}"):
                call = jax.ffi.ffi_call("pit_row_gather_matmul_pre", outs)
                jax.block_until_ready(call(x, w, idx.tiles, idx.count, empty, empty, activation=np.int64(act), **attrs))
        with pytest.raises(ValueError, match="row_linear_pre: needs an activation"):
            row_linear_pre_p.bind(x, w, empty, *idx.arrays, tile_h=1, activation=None, allow_tf32=False,
                                  zero_dead=False)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_differentiated_step_takes_act_and_z_from_one_kernel(platform):
    """A grad step of a product with an activation runs one fused kernel for act(z) and z
    (pit_row_gather_matmul_pre), no forward pit_row_activation; second order (a
    Hessian-vector product) differentiates it again."""
    rng, seed = fresh_rng()
    x, w, b, mask = rows_case(rng, (), 40, 16, 24, 0.5, jnp.float32)
    args = put(platform, w, x, b)
    loss = lambda w, x, b: _loss_pit(x, w, b, "gelu_exact")  # noqa: E731
    text = jax.jit(jax.grad(loss)).lower(*args).as_text()
    assert "pit_row_gather_matmul_pre" in text, "the primal is not the act-and-z kernel"
    forward = ('"pit_row_activation"', "@pit_row_activation(")
    assert not any(f in text for f in forward), "a forward activation pass is left"
    assert "pit_row_activation_bwd" in text
    tangent = randn(rng, w.shape, jnp.float32)
    hvp = jax.jit(lambda w, t: jax.jvp(jax.grad(loss), (w, *args[1:]), (t, jnp.zeros_like(args[1]),
                                                                         jnp.zeros_like(args[2])))[1])
    with jax.default_device(jax.devices("cpu")[0]):
        ref_loss = lambda w, x, b: _loss_ref(x, w, b, "gelu_exact")  # noqa: E731
        want = jax.jvp(jax.grad(ref_loss), (jnp.asarray(w), jnp.asarray(x), jnp.asarray(b)),
                       (jnp.asarray(tangent), jnp.zeros_like(jnp.asarray(x)), jnp.zeros_like(jnp.asarray(b))))[1]
    assert rel_err(hvp(args[0], put(platform, tangent)), np.asarray(want, np.float64)) < 1e-4, f"seed={seed}"
    # dead_rows="zeros": the bias on the live rows, z's cotangent left unwritten off them.
    zeros = lambda w, x, b: jnp.sum(jnp.sin(pit_jax.sparse_dense(x, w, bias=b, activation="gelu_exact",  # noqa: E731
                                                                 dead_rows="zeros")))
    with jax.default_device(jax.devices("cpu")[0]):
        def zeros_ref(w, x, b):
            y = jnp.matmul(jnp.asarray(mask, jnp.float32) * x, w, precision="highest") + b
            return jnp.sum(jnp.sin(jnp.asarray(mask, jnp.float32) * jax.nn.gelu(y, approximate=False)))
        want = jax.grad(zeros_ref, argnums=(0, 1, 2))(jnp.asarray(w), jnp.asarray(x), jnp.asarray(b))
    assert "dead_zeros=False" in str(jax.make_jaxpr(jax.grad(zeros))(*args)), "dz's dead rows are written"
    got = jax.jit(jax.grad(zeros, argnums=(0, 1, 2)))(*args)
    for what, g, e in zip(("dw", "dx", "dbias"), got, want):
        e = np.asarray(e, np.float64) * (mask if what == "dx" else 1.0)
        assert rel_err(g, e) < 1e-4, f"seed={seed}: dead_rows='zeros' {what}"
    # Reverse over reverse (a gradient penalty): z's unwritten rows must not leak (NaN * 0).
    penalty = lambda w: jnp.sum(jax.grad(loss)(w, *args[1:]) ** 2)  # noqa: E731
    with jax.default_device(jax.devices("cpu")[0]):
        want_p = jax.grad(lambda w: jnp.sum(jax.grad(ref_loss)(w, jnp.asarray(x), jnp.asarray(b)) ** 2))(
            jnp.asarray(w))
    assert rel_err(jax.jit(jax.grad(penalty))(args[0]), np.asarray(want_p, np.float64)) < 1e-4, f"seed={seed}"


@pytest.mark.parametrize("trans_b", [False, True])
def test_dense_route_ignores_the_other_operands_dead_rows(trans_b):
    """The masked cuBLAS route of thin products on CUDA (_dense_route.stile), as a weight
    gradient x^T dz with x's rows listed: dz's unlisted rows may hold anything (the GELU
    backward leaves them unwritten), so NaN there must leave the product finite and equal
    to the product of the listed rows."""
    from pit_jax.primitives import _dense_route

    rng, seed = fresh_rng()
    x, _, _, mask = rows_case(rng, (), 40, 16, 24, 0.5, jnp.float32)
    dz = rng.standard_normal((40, 24)).astype(np.float32)
    live = mask[:, 0] > 0
    dz_nan = np.where(live[:, None], dz, np.nan).astype(np.float32)
    b = dz_nan.T if trans_b else dz_nan
    got = _dense_route.stile(jnp.asarray(x), jnp.asarray(b), jnp.asarray(live[:, None]), sparse="a", tile=(1, 16),
                             trans_a=True, trans_b=trans_b, trans_c=False, allow_tf32=False, out_batch=0)
    want = (f64(x) * mask).T @ (dz * mask)
    assert rel_err(got, want) < 1e-5, f"seed={seed}"


def test_bad_bias_and_activation_are_clear_errors():
    x, w = jnp.ones((8, 4)), jnp.ones((4, 6))
    with pytest.raises(ValueError, match=r"bias must be \[\.\.\., N\] with N = 6"):
        pit_jax.sparse_dense(x, w, bias=jnp.ones((5,)))
    with pytest.raises(ValueError, match="activation must be a callable or one of"):
        pit_jax.sparse_dense(x, w, bias=jnp.ones((6,)), activation="tanhh")


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("k,n", [(3072, 768), (768, 3072), (256, 520)])
def test_m_axis_epilogue_hopper_shapes_gpu(dtype, k, n):
    """BERT-like shapes on the GPU: the sm_90 kernel (multicast pairs; split-K at K = 3072
    with few live rows), f32 with TF32; 27 % live rows, dead rows act(bias)."""
    rng, seed = fresh_rng()
    x, w, b, mask = rows_case(rng, (), 1500, k, n, 0.27, dtype)
    prec = "tensorfloat32" if dtype == jnp.float32 else None
    f = jax.jit(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation="gelu_exact", precision=prec))
    y = f(*put("gpu", x, w, b))
    tol = 3e-3 if dtype == jnp.float32 else TOL[jnp.dtype(dtype).name]
    assert rel_err(y, ref(x, w, b, mask, "gelu_exact")) < tol, f"seed={seed}"
    again = f(*put("gpu", x, w, b))
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(again, np.float32), err_msg=f"seed={seed}")
