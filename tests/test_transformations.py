"""Transformations beyond jit / vmap / grad: rematerialization (`jax.checkpoint`, with a
policy too), second order (a Hessian-vector product: jvp of grad), forward-mode Jacobians
and `jax.linearize`, control flow (scan, cond, fori_loop, Flax's nn.scan), for
sparse_dense on its three axes, the live-row layer norm and the MoE FFN, each against the
same expression in plain jnp (CPU; the same rules run on GPU); and `jax.export` of
pit_jax code."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pit_jax
from pit_testing import assert_trees_close


def _close(a, b):
    assert_trees_close(a, b, rtol=2e-4, atol=2e-4)


def _cases(rng):
    """(name, f(w, x) with pit_jax, the same with jnp, w, x): scalar losses of a weight."""
    m, k, n = 64, 64, 64
    x = rng.standard_normal((m, k)).astype(np.float32) * (rng.random((m, 1)) < 0.5)
    xk = np.maximum(x, 0) * np.repeat(rng.random((m // 32, 1, k)) < 0.4, 32, axis=0).reshape(m, k)
    w = (rng.standard_normal((k, n)) / 8).astype(np.float32)
    live = rng.random((k // 32, n // 32)) < 0.5
    live[0, 0], live[1, 1] = True, False  # some blocks of each kind
    mask = np.kron(live, np.ones((32, 32), np.float32))
    loss = lambda y: jnp.sum(jnp.tanh(y) ** 2)  # noqa: E731  (curved, so second order is not trivial)
    out = [
        ("m", lambda w, x: loss(pit_jax.sparse_dense(x, w, axis="m")), lambda w, x: loss(x @ w), w, x),
        ("k", lambda w, x: loss(pit_jax.sparse_dense(x, w, axis="k")), lambda w, x: loss(x @ w), w, xk),
        # The W axis's index comes from w's zero blocks, a constant of the step: derivatives
        # are those of x @ (w * mask) (zero on the dead blocks).
        ("w", lambda w, x: loss(pit_jax.sparse_dense(x, w, axis="w", micro_tile=(32, 32))),
         lambda w, x: loss(x @ (w * mask)), w * mask, x),
    ]
    # Layer norm on live rows (a row index), differentiated in its scale.
    rows = np.abs(x).sum(1) > 0
    r = rng.standard_normal((m, k)).astype(np.float32)

    def ln_ref(s, x):
        h = x + r
        mu = h.mean(-1, keepdims=True)
        v = ((h - mu) ** 2).mean(-1, keepdims=True)
        return loss(jnp.where(rows[:, None], (h - mu) / jnp.sqrt(v + 1e-6) * s, 0.0))

    idx = lambda x: pit_jax.index(rows[:, None], "row")  # noqa: E731
    out.append(("layer_norm", lambda s, x: loss(pit_jax.layer_norm(x, s, jnp.zeros_like(s), idx(x), residual=r)),
                ln_ref, (1 + 0.1 * rng.standard_normal(k)).astype(np.float32), x))
    # MoE FFN (top-2), differentiated in w_in.
    t, d, f, e = 48, 16, 24, 4
    xm = rng.standard_normal((t, d)).astype(np.float32)
    gates, ids = jax.lax.top_k(jax.nn.softmax(rng.standard_normal((t, e)).astype(np.float32)), 2)
    w_out = (rng.standard_normal((e, f, d)) / 5).astype(np.float32)

    def moe_ref(w_in, x):
        h = jnp.maximum(jnp.einsum("td,edf->tef", x, w_in), 0)
        y = jnp.einsum("tef,efd->ted", h, w_out)  # every expert on every token
        return loss(jnp.einsum("tkd,tk->td", jnp.take_along_axis(y, ids[:, :, None], axis=1), gates))

    out.append(("moe", lambda w_in, x: loss(pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, e), w_in, w_out)),
                moe_ref, (rng.standard_normal((e, d, f)) / 4).astype(np.float32), xm))
    return out


CASES = ["m", "k", "w", "layer_norm", "moe"]


def _case(name):
    return next(c for c in _cases(np.random.default_rng()) if c[0] == name)


@pytest.mark.parametrize("name", CASES)
def test_remat(name):
    _, f, ref, w, x = _case(name)
    want = jax.grad(ref)(w, x)
    _close(jax.jit(jax.grad(jax.checkpoint(f)))(w, x), want)
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    _close(jax.jit(jax.grad(jax.checkpoint(f, policy=policy)))(w, x), want)


def _prims(jaxpr, names):
    text = str(jaxpr)
    return {n: text.count(n + "[") for n in names}


def test_checkpoint_policies():
    """pit_jax.checkpoint_policies: under jax.checkpoint the products (and indexes) are
    recomputed in the backward unless a policy saves them; JAX's dots_saveable does not
    know them, plus_pit(dots_saveable) does. Gradients are the same under every policy."""
    from pit_jax import checkpoint_policies as cp

    rng = np.random.default_rng()
    x = (rng.standard_normal((64, 32)) * (rng.random((64, 1)) < 0.5)).astype(np.float32)
    ws = tuple(rng.standard_normal(s).astype(np.float32) for s in ((32, 32), (32, 16)))

    def block(ws, x):
        h = jnp.tanh(pit_jax.sparse_dense(x, ws[0], axis="m"))
        return jnp.sum(pit_jax.sparse_dense(h, ws[1], axis="k", micro_tile=(32, 1)) ** 2)

    names = ("pit_stile_matmul", "pit_index")
    plain = _prims(jax.make_jaxpr(jax.grad(block))(ws, x), names)
    want = jax.grad(block)(ws, x)
    counts = {}
    for key, policy in [("remat", None), ("dots", jax.checkpoint_policies.dots_saveable),
                        ("products", cp.products_saveable), ("products_indexes", cp.products_and_indexes_saveable),
                        ("everything", cp.everything_pit_saveable),
                        ("plus_pit", cp.plus_pit(jax.checkpoint_policies.dots_saveable))]:
        f = jax.checkpoint(block, policy=policy)
        counts[key] = _prims(jax.make_jaxpr(jax.grad(f))(ws, x), names)
        _close(jax.jit(jax.grad(f))(ws, x), want)
    forward = _prims(jax.make_jaxpr(block)(ws, x), names)  # what a recompute repeats
    assert forward["pit_stile_matmul"] == 2
    recomputed = {n: plain[n] + forward[n] for n in names}
    assert counts["remat"] == recomputed and counts["dots"] == recomputed
    assert counts["products"] == {"pit_stile_matmul": plain["pit_stile_matmul"], "pit_index": recomputed["pit_index"]}
    assert counts["products_indexes"] == plain and counts["everything"] == plain and counts["plus_pit"] == plain


@pytest.mark.parametrize("name", CASES)
def test_hessian_vector_product(name):
    _, f, ref, w, x = _case(name)
    v = np.random.default_rng().standard_normal(np.shape(w)).astype(np.float32)
    hvp = lambda g: jax.jvp(lambda w: jax.grad(g)(w, x), (w,), (v,))[1]  # noqa: E731
    _close(jax.jit(lambda: hvp(f))(), hvp(ref))


@pytest.mark.parametrize("name", CASES)
def test_forward_mode(name):
    _, f, ref, w, x = _case(name)
    _close(jax.jit(jax.jacfwd(f))(w, x), jax.jacfwd(ref)(w, x))
    y, lin = jax.linearize(lambda w: f(w, x), w)
    y_ref, lin_ref = jax.linearize(lambda w: ref(w, x), w)
    v = np.random.default_rng().standard_normal(np.shape(w)).astype(np.float32)
    _close((y, lin(v)), (y_ref, lin_ref(v)))


@pytest.mark.parametrize("name", CASES)
def test_control_flow(name):
    """The ops inside lax.scan (a stack of layers whose weight is scanned over, forward and
    gradient), lax.cond (one branch) and fori_loop, each equal to the jnp expression."""
    _, f, ref, w, x = _case(name)
    ws = np.stack([w, 0.5 * w, -w])  # three "layers"

    def scanned(g):
        return lambda ws, x: jax.lax.scan(lambda c, w: (c + g(w, x), None), 0.0, ws)[0]

    _close(jax.jit(scanned(f))(ws, x), scanned(ref)(ws, x))
    _close(jax.jit(jax.grad(scanned(f)))(ws, x), jax.grad(scanned(ref))(ws, x))
    cond = lambda g: (lambda p, w, x: jax.lax.cond(p, lambda: g(w, x), lambda: 2 * g(w, x)))  # noqa: E731
    for p in (True, False):
        _close(jax.jit(cond(f))(p, w, x), cond(ref)(p, w, x))
    loop = lambda g: (lambda w, x: jax.lax.fori_loop(0, 3, lambda i, a: a + g(w * (i + 1), x), 0.0))  # noqa: E731
    _close(jax.jit(loop(f))(w, x), loop(ref)(w, x))


def test_flax_scan_over_layers():
    """nn.scan of a block with SparseDense layers (a layer stack with stacked parameters):
    forward and parameter gradients equal the same scan of nn.Dense blocks."""
    from flax import linen as nn

    from pit_jax.flax import SparseDense

    class Block(nn.Module):
        dense: bool

        @nn.compact
        def __call__(self, h, _):
            layer = nn.Dense(32, name="fc") if self.dense else SparseDense(32, axis="m", name="fc")
            return jnp.tanh(layer(h)), None

    def stack(dense):
        return nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)(dense)

    rng = np.random.default_rng()
    x = (rng.standard_normal((48, 32)) * (rng.random((48, 1)) < 0.5)).astype(np.float32)
    pit, ref = stack(False), stack(True)
    params = pit.init(jax.random.PRNGKey(0), x, None)
    _close(jax.jit(pit.apply)(params, x, None)[0], ref.apply(params, x, None)[0])
    loss = lambda m: (lambda p: jnp.sum(m.apply(p, x, None)[0] ** 2))  # noqa: E731
    _close(jax.jit(jax.grad(loss(pit)))(params), jax.grad(loss(ref))(params))


def test_export():
    """jax.export of jitted pit_jax code (an index, M-axis and MoE products, a gradient):
    refused without `pit_jax.export_checks()`, and with them the export computes what the
    function does."""
    from jax import export

    rng = np.random.default_rng()
    x = rng.standard_normal((64, 32)).astype(np.float32) * (rng.random((64, 1)) < 0.5)
    w = rng.standard_normal((32, 16)).astype(np.float32)
    ids = rng.integers(0, 4, size=(64, 1)).astype(np.int32)
    w_in = rng.standard_normal((4, 32, 8)).astype(np.float32)
    w_out = rng.standard_normal((4, 8, 32)).astype(np.float32)

    def f(x, w, ids, w_in, w_out):
        y = pit_jax.sparse_dense(x, w, axis="m")
        g = jax.grad(lambda w: jnp.sum(pit_jax.sparse_dense(x, w, axis="m") ** 2))(w)
        m = pit_jax.moe_ffn(x, jnp.ones(ids.shape, x.dtype), pit_jax.moe_index(ids, 4), w_in, w_out)
        return y, g, m

    args = (x, w, ids, w_in, w_out)
    with pytest.raises(ValueError, match="custom calls"):
        export.export(jax.jit(f))(*args)
    exp = export.export(jax.jit(f), disabled_checks=pit_jax.export_checks())(*args)
    _close(exp.call(*args), jax.jit(f)(*args))
