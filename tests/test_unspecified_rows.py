"""`dead_rows="unspecified"`: inference that leaves the rows an M-axis index does not list
unwritten, in `sparse_dense` (every M-axis form: fused activation, bias alone, no bias,
three column parts, an unfused callable) and `layer_norm`. The listed rows are checked
against float64; the unlisted ones must be NaN: on the CPU (and in the jnp reference) the
documented fill, on the GPU the poison the handlers write first (conftest's
`poison_outputs`), which shows that the kernels stored nothing there. Autodiff gives what
"zeros" gives (the unlisted rows carry no gradient, their cotangent is ignored); jit and
vmap work; the Flax layers and the example BERT take the mode, in inference and training."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import PLATFORMS, activation64, check_close, f64, fresh_rng, live_rows, put, randn, unfused_z64

import pit_jax

pytestmark = pytest.mark.usefixtures("poison_outputs")

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
# (activation, bias, parts): the fused epilogue, a bias alone, no bias, column parts (the
# three-result kernel for 16-bit N / 3 = 256 on sm_90a), and a callable (the unfused path).
FORMS = [("gelu_exact", True, 1), (None, True, 1), (None, False, 1), ("relu", True, 3), (None, False, 3),
         (jnp.tanh, True, 1)]




def _act64(activation):
    if activation is None:
        return lambda v: v
    if callable(activation):
        return np.tanh
    return lambda v: activation64(v, activation)


def _check_rows(got, want, live, dtype, msg):
    """The listed rows against float64, NaN (unwritten) everywhere else."""
    got = f64(got)
    check_close(got[live], want[live], dtype, msg)
    assert np.isnan(got[~live]).all(), f"{msg}: an unlisted row was written"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("activation,use_bias,parts", FORMS, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("density", [0.0, 0.35, 1.0])
def test_sparse_dense_leaves_dead_rows_unwritten(platform, dtype, activation, use_bias, parts, density):
    rng, seed = fresh_rng()
    m, k = 300, 64
    n = 768 if parts == 3 else 200  # N / 3 = 256: the kernel that writes the parts itself
    live = live_rows(rng, (), m, 1, density)
    x = np.where(live[:, None], randn(rng, (m, k), jnp.float32), 0.0).astype(jnp.dtype(dtype))
    w = randn(rng, (k, n), dtype)
    bias = randn(rng, (n,), jnp.float32)
    xs, ws, bs = put(platform, x, w, bias)

    @jax.jit
    def f(x, w, b):
        y = pit_jax.sparse_dense(x, w, pit_jax.index(x, "row"), bias=b if use_bias else None,
                                 activation=activation, out_parts=parts, dead_rows="unspecified")
        return jnp.concatenate(y, -1) if parts > 1 else y

    y = f(xs, ws, bs)
    assert y.shape == (m, n) and y.dtype == jnp.dtype(dtype)
    b64 = f64(jnp.asarray(bias).astype(dtype)) if use_bias else 0.0  # rounded to the product's dtype first
    z = f64(x) @ f64(w) + b64
    if callable(activation):  # the unfused path rounds the product, then the sum
        z = unfused_z64(x, w, b64, dtype)
    want = _act64(activation)(z)
    _check_rows(y, want, live, dtype, f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("density", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("m,h,tile_h", [(1, 8, 1), (130, 768, 1), (50, 96, 4)])
def test_layer_norm_leaves_dead_rows_unwritten(platform, dtype, density, m, h, tile_h):
    rng, seed = fresh_rng()
    live = live_rows(rng, (), m, tile_h, density)
    x, r = randn(rng, (m, h), dtype), randn(rng, (m, h), dtype)
    scale, offset, bias = (randn(rng, (h,), jnp.float32) for _ in range(3))
    xs, rs, ss, os_, bs, lv = put(platform, x, r, scale, offset, bias, live)

    @jax.jit
    def f(x, r, s, o, b, lv):
        idx = pit_jax.index(lv[:, None], (tile_h, 1))
        return pit_jax.layer_norm(x, s, o, idx, residual=r, bias=b, epsilon=1e-6, dead_rows="unspecified")

    y = f(xs, rs, ss, os_, bs, lv)
    hh = f64(x) + f64(r) + f64(bias)
    mean = hh.mean(-1, keepdims=True)
    want = (hh - mean) / np.sqrt(hh.var(-1, keepdims=True) + 1e-6) * f64(scale) + f64(offset)
    _check_rows(y, want, live, dtype, f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_batched_vmapped_and_full_capacity(platform):
    """Batch dims, vmap over a leading axis, and a row micro-tile taller than one row."""
    rng, seed = fresh_rng()
    live = live_rows(rng, (3,), 40, 1, 0.5)
    x = np.where(live[..., None], randn(rng, (3, 40, 32), jnp.float32), 0.0).astype(jnp.bfloat16)
    w, b = randn(rng, (32, 64), jnp.bfloat16), randn(rng, (64,), jnp.float32)
    xs, ws, bs = put(platform, x, w, b)
    f = lambda x: pit_jax.sparse_dense(x, ws, bias=bs, activation="silu", dead_rows="unspecified")  # noqa: E731
    want = activation64(f64(x) @ f64(w) + f64(jnp.asarray(b).astype(jnp.bfloat16)), "silu")
    _check_rows(jax.jit(f)(xs), want, live, jnp.bfloat16, f"seed={seed} batched")
    _check_rows(jax.jit(jax.vmap(f))(xs), want, live, jnp.bfloat16, f"seed={seed} vmap")
    # tile_h = 4 (a block of rows live or dead as one), layer norm under vmap
    live4 = live_rows(rng, (2,), 30, 4, 0.5)
    xn = randn(rng, (2, 30, 16), jnp.float32)
    xns, lv4 = put(platform, xn, live4)
    ln = lambda x, lv: pit_jax.layer_norm(x, jnp.ones(16), jnp.zeros(16), pit_jax.index(lv[:, None], (4, 1)),  # noqa
                                          dead_rows="unspecified")
    hh = f64(xn)
    want = (hh - hh.mean(-1, keepdims=True)) / np.sqrt(hh.var(-1, keepdims=True) + 1e-6)
    _check_rows(jax.jit(jax.vmap(ln))(xns, lv4), want, live4, jnp.float32, f"seed={seed} ln vmap")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("reference", [False, True], ids=["kernels", "reference"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_autodiff_matches_zeros(platform, reference, dtype):
    """grad (a cotangent on every row, the unlisted ones included) and jvp (on the listed
    rows) of each form with "unspecified" equal those with "zeros", whose unlisted rows are
    constants: the same kernels run, and the unwritten rows are never read. (Within the
    dtype's tolerance: on a GPU two calls of the same op may differ in the last bits, the
    index's list order coming from atomics.)"""
    rng, seed = fresh_rng()
    m, k, n = 300, 64, 768
    live = live_rows(rng, (), m, 1, 0.35)
    x = np.where(live[:, None], randn(rng, (m, k), jnp.float32), 0.0).astype(jnp.dtype(dtype))
    xs, ws, bs = put(platform, x, randn(rng, (k, n), dtype), randn(rng, (n,), jnp.float32))
    xn = put(platform, randn(rng, (m, n), dtype))  # the layer norm's operand
    lv = put(platform, live)
    ct = put(platform, randn(rng, (m, n), dtype))
    tx, tw, tb = put(platform, randn(rng, (m, k), dtype), randn(rng, (k, n), dtype), randn(rng, (n,), jnp.float32))
    forms = {
        "fused": lambda d: lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation="gelu", dead_rows=d),
        "bias": lambda d: lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, dead_rows=d),
        "plain": lambda d: lambda x, w, b: pit_jax.sparse_dense(x, w, dead_rows=d) + 0 * b[0].astype(x.dtype),
        "parts": lambda d: lambda x, w, b: jnp.concatenate(
            pit_jax.sparse_dense(x, w, bias=b, activation="relu", out_parts=3, dead_rows=d), axis=-1),
        "callable": lambda d: lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation=jnp.tanh, dead_rows=d),
        "layer_norm": lambda d: lambda x, w, b: pit_jax.layer_norm(
            x @ w, b, b * 0.5, pit_jax.index(lv[:, None], "row"), residual=xn, dead_rows=d),
    }
    ctx = pit_jax.use_reference() if reference else contextlib.nullcontext()
    with ctx:
        for name, form in forms.items():
            msg = f"seed={seed} {name}"
            outs = {}
            for d in ("zeros", "unspecified"):
                f = form(d)
                y, vjp = jax.vjp(f, xs, ws, bs)
                _, y_dot = jax.jit(lambda *a: jax.jvp(f, (xs, ws, bs), a))(tx, tw, tb)
                outs[d] = (y, jax.jit(vjp)(ct), y_dot)
            (yz, gz, tz), (yu, gu, tu) = outs["zeros"], outs["unspecified"]
            check_close(f64(yu)[live], f64(yz)[live], dtype, msg + " value")
            for a, b, what in zip(gu, gz, ("x", "w", "bias")):
                assert np.isfinite(f64(a)).all(), f"{msg} grad {what}"
                check_close(f64(a), f64(b), dtype, f"{msg} grad {what}")
            check_close(f64(tu)[live], f64(tz)[live], dtype, msg + " jvp")


def test_bad_dead_rows_is_a_clear_error():
    x, w = jnp.ones((4, 8)), jnp.ones((8, 6))
    with pytest.raises(ValueError, match=r"dead_rows must be one of \('dense', 'zeros', 'unspecified'\), got 'none'"):
        pit_jax.sparse_dense(x, w, dead_rows="none")
    with pytest.raises(ValueError, match="dead_rows='unspecified' needs the M axis .* got axis='k'"):
        pit_jax.sparse_dense(x, w, axis="k", dead_rows="unspecified")
    with pytest.raises(ValueError, match=r"layer_norm: dead_rows must be one of \('zeros', 'unspecified'\), "
                                         r"got 'dense'"):
        pit_jax.layer_norm(x, jnp.ones(8), jnp.zeros(8), dead_rows="dense")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_flax_layers_take_unspecified(platform):
    from flax import nnx

    from pit_jax.flax import LayerNorm, SparseDense
    from pit_jax.flax.nnx import LayerNorm as NnxLayerNorm
    from pit_jax.flax.nnx import SparseDense as NnxSparseDense

    rng, seed = fresh_rng()
    live = live_rows(rng, (2,), 12, 1, 0.5)
    x = put(platform, np.where(live[..., None], randn(rng, (2, 12, 16), jnp.float32), 0.0).astype(np.float32))
    layer = SparseDense(8, activation="gelu", dead_rows="unspecified", bias_init=jax.nn.initializers.normal(1.0))
    params = layer.init(jax.random.PRNGKey(0), x)
    y = jax.jit(layer.apply)(params, x)
    want = activation64(f64(x) @ f64(params["params"]["kernel"]) + f64(params["params"]["bias"]), "gelu")
    _check_rows(y, want, live, jnp.float32, f"seed={seed} linen SparseDense")
    idx = pit_jax.index(jnp.reshape(jnp.asarray(live), (-1, 1)), "row")
    norm = LayerNorm(dead_rows="unspecified")
    flat = jnp.reshape(x, (-1, 16))
    y = norm.apply(norm.init(jax.random.PRNGKey(0), flat, idx), flat, idx)
    hh = f64(flat)
    want = (hh - hh.mean(-1, keepdims=True)) / np.sqrt(hh.var(-1, keepdims=True) + 1e-6)
    _check_rows(y, want, live.reshape(-1), jnp.float32, f"seed={seed} linen LayerNorm")
    y = NnxLayerNorm(16, dead_rows="unspecified", rngs=nnx.Rngs(0))(flat, idx)
    _check_rows(y, want, live.reshape(-1), jnp.float32, f"seed={seed} nnx LayerNorm")
    lin = NnxSparseDense(16, 8, dead_rows="unspecified", rngs=nnx.Rngs(0))
    want = f64(x) @ f64(lin.kernel[...]) + f64(lin.bias[...])
    _check_rows(lin(x), want, live, jnp.float32, f"seed={seed} nnx SparseDense")
