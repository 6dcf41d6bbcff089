"""pit_jax.layer_norm: a residual add + layer norm on the live rows of a padded batch."""

from __future__ import annotations


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import (PLATFORMS, assert_call_raises, check_close, f64, fresh_rng, listed_rows, live_rows, put, randn,
                         requires_gpu)

import pit_jax

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
# (M, H, tile_h): H a multiple of 8 (16-byte vectors) or not, M not a multiple of tile_h.
# H: one to four 16-byte vectors per lane (the GPU kernel keeps such rows in registers:
# 96, 320, 768, 1024 for 16-bit types), more (the two-pass loop: 768 and 1024 float32),
# and not a multiple of 8 (scalar loads: 100).
SHAPES = [(1, 8, 1), (37, 96, 1), (50, 100, 4), (130, 768, 1), (33, 64, 32), (20, 320, 1), (9, 1024, 2)]

pytestmark = pytest.mark.usefixtures("poison_outputs")


def ln64(x, scale, offset, live_rows, residual=None, bias=None, eps=1e-6):
    """float64 reference: LN(x + residual + bias) on the live rows, zeros elsewhere."""
    h = f64(x)
    if residual is not None:
        h = h + f64(residual)
    if bias is not None:
        h = h + f64(bias)
    mean = h.mean(-1, keepdims=True)
    var = (h * h).mean(-1, keepdims=True) - mean * mean
    y = (h - mean) / np.sqrt(np.maximum(var, 0) + eps) * f64(scale) + f64(offset)
    return np.where(live_rows[..., None], y, 0.0)




def operands(rng, lead, m, h, dtype):
    x = randn(rng, (*lead, m, h), dtype)
    res = randn(rng, (*lead, m, h), dtype)
    scale = (1 + 0.3 * rng.standard_normal(h)).astype(np.float32)
    offset = (0.2 * rng.standard_normal(h)).astype(np.float32)
    bias = (0.5 * rng.standard_normal(h)).astype(np.float32)
    return x, res, scale, offset, bias


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("density", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("m,h,tile_h", SHAPES)
def test_matches_reference(platform, dtype, density, m, h, tile_h):
    rng, seed = fresh_rng()
    lead = (2,)
    x, res, scale, offset, bias = operands(rng, lead, m, h, dtype)
    live = live_rows(rng, lead, m, tile_h, density)

    def f(x, res, mask, scale, offset, bias):
        idx = pit_jax.index(mask[..., None], (tile_h, 1))  # a padding mask's index
        return (pit_jax.layer_norm(x, scale, offset, idx, residual=res, bias=bias),
                pit_jax.layer_norm(x, scale, offset, idx))

    y, y_plain = jax.jit(f)(*put(platform, x, res, live, scale, offset, bias))
    check_close(y, ln64(x, scale, offset, live, res, bias), dtype, f"seed={seed} residual+bias")
    check_close(y_plain, ln64(x, scale, offset, live), dtype, f"seed={seed} plain")
    assert not f64(y)[~live].any(), f"seed={seed}: dead rows must be zero"


@requires_gpu
@pytest.mark.parametrize("dead_rows", ["zeros", "unspecified"])
def test_more_slots_than_one_wave_of_blocks_gpu(dead_rows):
    """Many more list slots than one wave of the CUDA forward's blocks holds: 2 x 12000 rows
    of 768 (a warp per slot), 35 % live and scattered, the dead tail's rows zeroed or left
    unwritten."""
    rng, seed = fresh_rng()
    lead, m, h = (2,), 12000, 768
    x, res, scale, offset, bias = operands(rng, lead, m, h, jnp.bfloat16)
    live = live_rows(rng, lead, m, 1, 0.35)

    def f(x, res, mask, scale, offset, bias):
        idx = pit_jax.index(mask[..., None], "row")
        return pit_jax.layer_norm(x, scale, offset, idx, residual=res, bias=bias, dead_rows=dead_rows)

    y = np.asarray(jax.jit(f)(*put("gpu", x, res, live, scale, offset, bias)), np.float64)
    want = ln64(x, scale, offset, live, res, bias)
    if dead_rows == "unspecified":
        y, want = y[live], want[live]
    check_close(y, want, jnp.bfloat16, f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_index_of_x_rows_and_batch_dims(platform):
    """An index built from x itself (micro-tile (h, H)), over two batch dims; a shared
    (unbatched) index broadcasts."""
    rng, seed = fresh_rng()
    m, h = 45, 64
    x, res, scale, offset, _ = operands(rng, (2, 3), m, h, jnp.bfloat16)
    live = live_rows(rng, (2, 3), m, 2, 0.5)
    x = np.where(live[..., None], x, np.zeros_like(x))  # dead rows all zero: the index finds them
    idx = pit_jax.index(put(platform, x), (2, h))
    y = jax.jit(lambda a, r: pit_jax.layer_norm(a, scale, offset, idx, residual=r))(*put(platform, x, res))
    check_close(y, ln64(x, scale, offset, live, res), jnp.bfloat16, f"seed={seed}")
    shared = pit_jax.index(put(platform, live[0, 0][:, None]), "row")
    y = jax.jit(lambda a: pit_jax.layer_norm(a, scale, offset, shared))(put(platform, x))
    check_close(y, ln64(x, scale, offset, np.broadcast_to(live[0, 0], live.shape)), jnp.bfloat16, f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("capacity", [1, 3, 10])
def test_capacity_below_the_row_blocks(platform, capacity):
    """A list too short for every block (no dead tail): rows past the capacity are zeros."""
    rng, seed = fresh_rng()
    m, h = 40, 32
    x, res, scale, offset, _ = operands(rng, (), m, h, jnp.float32)
    live = live_rows(rng, (), m, 1, 0.5)
    idx = pit_jax.index(put(platform, live[:, None]), "row", capacity=capacity)
    y = jax.jit(lambda a, r: pit_jax.layer_norm(a, scale, offset, idx, residual=r))(*put(platform, x, res))
    listed = listed_rows(idx, m)
    assert (listed <= live).all()
    check_close(y, ln64(x, scale, offset, listed, res), jnp.float32, f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_matches_flax_layer_norm_and_index_none(platform):
    rng, seed = fresh_rng()
    m, h = 24, 48
    x, res, scale, offset, _ = operands(rng, (), m, h, jnp.float32)
    live = live_rows(rng, (), m, 1, 0.6)
    ln = nn.LayerNorm(epsilon=1e-12)
    params = {"params": {"scale": jnp.asarray(scale), "bias": jnp.asarray(offset)}}
    want = np.asarray(ln.apply(params, jnp.asarray(x) + jnp.asarray(res)))
    idx = pit_jax.index(put(platform, live[:, None]), "row")
    got = jax.jit(lambda a, r: pit_jax.layer_norm(a, scale, offset, idx, residual=r, epsilon=1e-12))(
        *put(platform, x, res))
    np.testing.assert_allclose(np.asarray(got)[live], want[live], rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")
    every = jax.jit(lambda a, r: pit_jax.layer_norm(a, scale, offset, residual=r, epsilon=1e-12))(
        *put(platform, x, res))
    np.testing.assert_allclose(np.asarray(every), want, rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")


def ln64_bwd(x, scale, live_rows, dy, residual=None, bias=None, eps=1e-6):
    """float64 cotangents of ln64 for the output cotangent dy: (dh, d scale, d offset,
    d bias), dh = d(x + residual + bias) on the live rows, 0 elsewhere; the vector sums
    over every row of every batch entry."""
    h = f64(x)
    if residual is not None:
        h = h + f64(residual)
    if bias is not None:
        h = h + f64(bias)
    mean = h.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(np.maximum((h * h).mean(-1, keepdims=True) - mean * mean, 0) + eps)
    xhat = (h - mean) * rstd
    g = np.where(live_rows[..., None], f64(dy), 0.0)
    gs = g * f64(scale)
    dh = rstd * (gs - gs.mean(-1, keepdims=True) - xhat * (gs * xhat).mean(-1, keepdims=True))
    rows = tuple(range(dh.ndim - 1))
    return dh, (g * xhat).sum(rows), g.sum(rows), dh.sum(rows)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("density", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("m,h,tile_h", SHAPES)
def test_backward_matches_reference(platform, dtype, density, m, h, tile_h):
    """The gradient runs the backward target (pit_row_layer_norm_bwd: the live rows only)
    and matches float64 formulas: x's and the residual's cotangent (zeros on dead rows),
    the bias's, scale's and offset's sums."""
    rng, seed = fresh_rng()
    lead = (2,)
    x, res, scale, offset, bias = operands(rng, lead, m, h, dtype)
    live = live_rows(rng, lead, m, tile_h, density)
    dy = randn(rng, x.shape, dtype)

    def f(x, res, bias, scale, offset, mask, dy):
        idx = pit_jax.index(mask[..., None], (tile_h, 1))
        _, vjp = jax.vjp(lambda *a: pit_jax.layer_norm(a[0], a[3], a[4], idx, residual=a[1], bias=a[2]),
                         x, res, bias, scale, offset)
        return vjp(dy)

    args = put(platform, x, res, bias, scale, offset, live, dy)
    jaxpr = str(jax.make_jaxpr(f)(*args))
    assert "pit_row_layer_norm_bwd[" in jaxpr and "pit_row_layer_norm_lin[" not in jaxpr
    grads = jax.jit(f)(*args)
    check_backward(grads, ln64_bwd(x, scale, live, f64(np.asarray(jnp.asarray(dy))), res, bias), live, dtype, seed)


def check_backward(grads, want, live, dtype, seed):
    """The vjp of layer_norm(x, scale, offset, residual=res, bias=bias), grads (dx, dres,
    dbias, dscale, doffset), against ln64_bwd's (dh, d scale, d offset, d bias)."""
    dx, dres, dbias, dscale, doffset = grads
    want_h, want_s, want_o, want_b = want
    check_close(dx, want_h, dtype, f"seed={seed} dx")
    np.testing.assert_array_equal(f64(dres), f64(dx), err_msg=f"seed={seed}: d residual is d x")
    assert not f64(dx)[~live].any(), f"seed={seed}: dead rows get no gradient"
    # The sums add up to M rounded terms: float32 accumulation of float32 terms.
    for got, w, name in ((dscale, want_s, "scale"), (doffset, want_o, "offset"), (dbias, want_b, "bias")):
        check_close(got, w, jnp.float32 if dtype == jnp.float32 else dtype, f"seed={seed} d{name}")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("density", [0.4, 1.0])
@pytest.mark.parametrize("m,h,tile_h", SHAPES)
def test_copies_add_their_cotangents_in_the_backward(platform, dtype, density, m, h, tile_h):
    """copies=2: y twice (the same values); each copy's cotangent reaches the one backward
    target (its dy2 operand), with no add of the two over every row before it, and the
    gradient is that of y with the summed cotangent."""
    rng, seed = fresh_rng()
    lead = (2,)
    x, res, scale, offset, bias = operands(rng, lead, m, h, dtype)
    live = live_rows(rng, lead, m, tile_h, density)
    dy, dy2 = randn(rng, x.shape, dtype), randn(rng, x.shape, dtype)

    def f(x, res, bias, scale, offset, mask, dy, dy2):
        idx = pit_jax.index(mask[..., None], (tile_h, 1))
        ys, vjp = jax.vjp(lambda *a: pit_jax.layer_norm(a[0], a[3], a[4], idx, residual=a[1], bias=a[2], copies=2),
                          x, res, bias, scale, offset)
        return ys, pit_jax.layer_norm(x, scale, offset, idx, residual=res, bias=bias), vjp((dy, dy2))

    args = put(platform, x, res, bias, scale, offset, live, dy, dy2)
    jaxpr = str(jax.make_jaxpr(f)(*args))
    assert jaxpr.count("pit_row_layer_norm_bwd[") == 1 and "add_any" not in jaxpr
    (y1, y2), y, grads = jax.jit(f)(*args)
    np.testing.assert_array_equal(f64(y1), f64(y), err_msg=f"seed={seed}: copy 1 is y")
    np.testing.assert_array_equal(f64(y2), f64(y), err_msg=f"seed={seed}: copy 2 is y")
    g = f64(np.asarray(jnp.asarray(dy))) + f64(np.asarray(jnp.asarray(dy2)))
    check_backward(grads, ln64_bwd(x, scale, live, g, res, bias), live, dtype, seed)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_copies_under_transforms(platform):
    """copies: one copy used (the other's cotangent a symbolic zero), three copies (the
    third cotangent added by XLA), jit of grad, vmap, vmap(grad) and jvp, against the
    one-copy op with the consumers' uses written out."""
    rng, seed = fresh_rng()
    b, m, h = 3, 20, 16
    x, res, scale, offset, bias = operands(rng, (b,), m, h, jnp.float32)
    live = live_rows(rng, (b,), m, 1, 0.5)
    x, res, scale, offset, bias, mask = put(platform, x, res, scale, offset, bias, live)
    idx = pit_jax.index(mask[..., None], "row")
    uses = (jnp.sin, lambda v: v * v, jnp.cos)

    def loss(n, used):
        def fn(a, r, s, o, c, i=idx):
            ys = pit_jax.layer_norm(a, s, o, i, residual=r, bias=c, copies=n) if n > 1 else None
            one = pit_jax.layer_norm(a, s, o, i, residual=r, bias=c)
            return sum(jnp.sum(uses[k]((ys[k] if ys else one))) for k in range(used))
        return fn

    args = (x, res, scale, offset, bias)
    for n, used in ((2, 1), (2, 2), (3, 3)):
        got = jax.jit(jax.grad(loss(n, used), argnums=range(5)))(*args)
        want = jax.grad(loss(1, used), argnums=range(5))(*args)
        for i, (u, v) in enumerate(zip(got, want)):
            np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-4, atol=1e-5,
                                       err_msg=f"seed={seed} copies={n} used={used} arg {i}")
    vg = jax.vmap(jax.grad(lambda a, r, i: loss(2, 2)(a, r, scale, offset, bias, i)))(x, res, idx)
    vg_ref = jax.vmap(jax.grad(lambda a, r, i: loss(1, 2)(a, r, scale, offset, bias, i)))(x, res, idx)
    np.testing.assert_allclose(np.asarray(vg), np.asarray(vg_ref), rtol=1e-4, atol=1e-5, err_msg=f"seed={seed} vmap")
    tangents = put(platform, *(randn(rng, a.shape, jnp.float32) for a in args))
    f2 = lambda *a: pit_jax.layer_norm(a[0], a[2], a[3], idx, residual=a[1], bias=a[4], copies=2)  # noqa: E731
    f1 = lambda *a: pit_jax.layer_norm(a[0], a[2], a[3], idx, residual=a[1], bias=a[4])  # noqa: E731
    (y1, y2), (t1, t2) = jax.jvp(f2, args, tangents)
    _, t = jax.jvp(f1, args, tangents)
    for u in (t1, t2):
        np.testing.assert_allclose(np.asarray(u), np.asarray(t), rtol=1e-5, atol=1e-6, err_msg=f"seed={seed} jvp")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("capacity", [7, 16])
def test_backward_capacity_below_the_row_blocks(platform, capacity):
    """A list too short for every block: rows past the capacity get no gradient."""
    rng, seed = fresh_rng()
    m, h = 40, 32
    x, res, scale, offset, _ = operands(rng, (), m, h, jnp.float32)
    live = live_rows(rng, (), m, 1, 0.5)
    dy = randn(rng, x.shape, jnp.float32)
    idx = pit_jax.index(put(platform, live[:, None]), "row", capacity=capacity)
    f = jax.jit(lambda a, s, o: jax.vjp(lambda a, s, o: pit_jax.layer_norm(a, s, o, idx, residual=res), a, s, o)[1](dy))
    dx, dscale, doffset = f(*put(platform, x, scale, offset))
    listed = listed_rows(idx, m)
    want_h, want_s, want_o, _ = ln64_bwd(x, scale, listed, dy, res)
    check_close(dx, want_h, jnp.float32, f"seed={seed} dx")
    check_close(dscale, want_s, jnp.float32, f"seed={seed} dscale")
    check_close(doffset, want_o, jnp.float32, f"seed={seed} doffset")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_backward_is_deterministic(platform):
    """The column sums are added in a fixed order: the same bits on every run."""
    rng, _ = fresh_rng()
    m, h = 3000, 768
    x, res, scale, offset, bias = operands(rng, (), m, h, jnp.bfloat16)
    live = live_rows(rng, (), m, 1, 0.3)
    idx = pit_jax.index(put(platform, live[:, None]), "row")
    loss = lambda a, r, s, o, b: jnp.sum(jnp.sin(pit_jax.layer_norm(a, s, o, idx, residual=r, bias=b)))  # noqa: E731
    g = jax.jit(jax.grad(loss, argnums=range(5)))
    args = put(platform, x, res, scale, offset, bias)
    first = [np.asarray(v) for v in g(*args)]
    for _ in range(3):
        for u, v in zip(first, g(*args)):
            np.testing.assert_array_equal(u, np.asarray(v))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_transforms(platform):
    rng, seed = fresh_rng()
    b, m, h = 3, 20, 16
    x, res, scale, offset, bias = operands(rng, (b,), m, h, jnp.float32)
    live = live_rows(rng, (b,), m, 1, 0.5)
    live[0, 0] = True
    x, res, scale, offset, bias, mask = put(platform, x, res, scale, offset, bias, live)
    idx = pit_jax.index(mask[..., None], "row")

    def f(x, r, s, o, c):
        return pit_jax.layer_norm(x, s, o, idx, residual=r, bias=c)

    def ref(x, r, s, o, c):
        return pit_jax.reference.layer_norm_rows(x, s, o, mask, residual=r, bias=c)

    args = (x, res, scale, offset, bias)
    np.testing.assert_allclose(np.asarray(jax.jit(f)(*args)), np.asarray(ref(*args)), rtol=1e-5, atol=1e-5)
    # jvp and vjp against the reference's autodiff with random tangents. (float32 finite
    # differences of a layer norm over 16 features missed 1e-2 about once in a few hundred
    # runs: rounding over the default step, not the rules.)
    tangents = put(platform, *(randn(rng, a.shape, jnp.float32) for a in args))
    out, t_out = jax.jvp(f, args, tangents)
    _, t_ref = jax.jvp(ref, args, tangents)
    np.testing.assert_allclose(np.asarray(t_out), np.asarray(t_ref), rtol=1e-4, atol=1e-5, err_msg=f"seed={seed} jvp")
    ct = put(platform, randn(rng, out.shape, jnp.float32))
    for i, (u, v) in enumerate(zip(jax.vjp(f, *args)[1](ct), jax.vjp(ref, *args)[1](ct))):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-4, atol=1e-5, err_msg=f"seed={seed} vjp {i}")
    # grad against the reference's grad (dead rows get no gradient)
    loss = lambda fn: (lambda *a: jnp.sum(jnp.sin(fn(*a))))
    g, g_ref = jax.grad(loss(f), argnums=range(5))(*args), jax.grad(loss(ref), argnums=range(5))(*args)
    for i, (u, v) in enumerate(zip(g, g_ref)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-4, atol=1e-5, err_msg=f"seed={seed} arg {i}")
    assert not np.asarray(g[0])[~np.asarray(live)].any()
    # vmap: data and index together, a shared index, and a mapped scale (the jnp path)
    v = jax.vmap(lambda a, r, i: pit_jax.layer_norm(a, scale, offset, i, residual=r, bias=bias))(x, res, idx)
    np.testing.assert_allclose(np.asarray(v), np.asarray(f(*args)), rtol=1e-6, atol=1e-6)
    one = pit_jax.index(mask[0][:, None], "row")
    v = jax.vmap(lambda a: pit_jax.layer_norm(a, scale, offset, one))(x)
    want = pit_jax.reference.layer_norm_rows(x, scale, offset, jnp.broadcast_to(mask[0], mask.shape))
    np.testing.assert_allclose(np.asarray(v), np.asarray(want), rtol=1e-5, atol=1e-5)
    scales = jnp.stack([scale, 2 * scale, 3 * scale])
    v = jax.jit(jax.vmap(lambda a, s, i: pit_jax.layer_norm(a, s, offset, i)))(x, scales, idx)
    want = jax.vmap(lambda a, s, mk: pit_jax.reference.layer_norm_rows(a, s, offset, mk))(x, scales, mask)
    np.testing.assert_allclose(np.asarray(v), np.asarray(want), rtol=1e-5, atol=1e-5)
    # vmap(grad)
    vg = jax.vmap(jax.grad(lambda a, i: jnp.sum(pit_jax.layer_norm(a, scale, offset, i) ** 2)))(x, idx)
    vg_ref = jax.vmap(jax.grad(lambda a, mk: jnp.sum(pit_jax.reference.layer_norm_rows(a, scale, offset, mk) ** 2)))(
        x, mask)
    np.testing.assert_allclose(np.asarray(vg), np.asarray(vg_ref), rtol=1e-4, atol=1e-5, err_msg=f"seed={seed}")


def test_errors():
    x = jnp.ones((6, 8), jnp.bfloat16)
    s = jnp.ones((8,))
    idx = pit_jax.index(jnp.ones((6, 1), bool), "row")
    with pytest.raises(ValueError, match=r"layer_norm: scale must be \[H\] = \[8\]"):
        pit_jax.layer_norm(x, jnp.ones((7,)), s, idx)
    with pytest.raises(ValueError, match=r"layer_norm: bias must be \[H\] = \[8\]"):
        pit_jax.layer_norm(x, s, s, idx, bias=jnp.ones((2, 8)))
    with pytest.raises(ValueError, match=r"layer_norm: residual must have x's shape \(6, 8\), got \(6, 4\)"):
        pit_jax.layer_norm(x, s, s, idx, residual=jnp.ones((6, 4)))
    with pytest.raises(ValueError, match=r"layer_norm: the index must list row blocks of x's 6 rows"):
        pit_jax.layer_norm(x, s, s, pit_jax.index(jnp.ones((5, 1), bool), "row"))
    with pytest.raises(ValueError, match=r"layer_norm: the index must list row blocks"):
        pit_jax.layer_norm(x, s, s, pit_jax.index(jnp.ones((6, 8)), (2, 4)))
    with pytest.raises(ValueError, match=r"layer_norm: the index has batch dims \(3,\), x has \(\)"):
        pit_jax.layer_norm(x, s, s, pit_jax.index(jnp.ones((3, 6, 1), bool), "row"))
    with pytest.raises(TypeError, match=r"layer_norm: x must be float32, bfloat16 or float16, got int32"):
        pit_jax.layer_norm(jnp.ones((6, 8), jnp.int32), s, s, idx)
    with pytest.raises(TypeError, match=r"layer_norm: index must be a pit_jax.PitIndex"):
        pit_jax.layer_norm(x, s, s, jnp.ones((6,), bool))
    with pytest.raises(ValueError, match=r"layer_norm: epsilon must be >= 0"):
        pit_jax.layer_norm(x, s, s, idx, epsilon=-1.0)
    with pytest.raises(ValueError, match=r"layer_norm: x must be \[\.\.\., M, H\]"):
        pit_jax.layer_norm(jnp.ones((8,)), s, s)
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"layer_norm: copies must be an int >= 1, got " + repr(bad)):
            pit_jax.layer_norm(x, s, s, idx, copies=bad)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_flax_layers_are_drop_ins(platform):
    """pit_jax.flax.LayerNorm (linen) and pit_jax.flax.nnx.LayerNorm: the parameters of
    nn.LayerNorm / nnx.LayerNorm, their values on live rows, and their dtype rule."""
    from flax import nnx

    from pit_jax.flax import LayerNorm
    from pit_jax.flax.nnx import LayerNorm as NnxLayerNorm

    rng, seed = fresh_rng()
    m, h = 30, 40
    x, res, _, _, _ = operands(rng, (), m, h, jnp.bfloat16)
    live = live_rows(rng, (), m, 1, 0.5)
    x, res, mask = put(platform, x, res, live)
    idx = pit_jax.index(mask[:, None], "row")
    ref_mod = nn.LayerNorm(epsilon=1e-5)
    params = ref_mod.init(jax.random.PRNGKey(0), x)
    params = jax.tree_util.tree_map(lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(1), p.shape), params)
    pit_mod = LayerNorm(epsilon=1e-5)
    assert jax.tree_util.tree_structure(pit_mod.init(jax.random.PRNGKey(0), x, idx)) == jax.tree_util.tree_structure(
        params)
    want = np.asarray(ref_mod.apply(params, x + res), np.float32)
    got = jax.jit(lambda p, a, r: pit_mod.apply(p, a, idx, residual=r))(params, x, res)
    assert got.dtype == want.dtype == np.float32  # bf16 input, float32 params: promoted, as nn.LayerNorm
    np.testing.assert_allclose(np.asarray(got)[live], want[live], rtol=2e-2, atol=2e-2, err_msg=f"seed={seed}")
    assert not np.asarray(got)[~live].any()
    every = LayerNorm(epsilon=1e-5, dtype=jnp.bfloat16).apply(params, x[None], residual=res[None])[0]
    assert every.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(every, np.float32), want, rtol=3e-2, atol=3e-2, err_msg=f"seed={seed}")

    ref_nnx = nnx.LayerNorm(h, epsilon=1e-5, rngs=nnx.Rngs(0))
    pit_nnx = NnxLayerNorm(h, epsilon=1e-5, rngs=nnx.Rngs(0))
    paths = lambda mod: {k for k, _ in nnx.to_flat_state(nnx.state(mod))}
    assert paths(ref_nnx) == paths(pit_nnx)
    pit_nnx.scale[...] = ref_nnx.scale[...] * 1.5
    ref_nnx.scale[...] = ref_nnx.scale[...] * 1.5
    got = pit_nnx(x, idx, residual=res)
    want = np.asarray(ref_nnx(x + res), np.float32)
    np.testing.assert_allclose(np.asarray(got)[live], want[live], rtol=2e-2, atol=2e-2, err_msg=f"seed={seed}")
    # copies=2: the same result twice, with or without an index
    for two, one in ((pit_nnx(x, idx, residual=res, copies=2), got),
                     (pit_mod.apply(params, x[None], residual=res[None], copies=2),
                      pit_mod.apply(params, x[None], residual=res[None]))):
        assert isinstance(two, tuple) and len(two) == 2
        for c in two:
            np.testing.assert_array_equal(np.asarray(c), np.asarray(one))


def _raw(shape, dtype, *args, tile_h=1, epsilon=1e-6):
    call = jax.ffi.ffi_call("pit_row_layer_norm", jax.ShapeDtypeStruct(shape, dtype))
    return call(*args, tile_h=np.int64(tile_h), epsilon=np.float32(epsilon), skip_dead=False)


_F = lambda *s: jnp.ones(s, jnp.float32)  # noqa: E731
_I = lambda *s: jnp.zeros(s, jnp.int32)  # noqa: E731
RAW_BAD = {
    "scale must be \\[8\\] \\(x's last dim\\)": lambda: _raw((4, 8), jnp.float32, _F(4, 8), _F(0), _F(0), _F(7),
                                                            _F(8), _I(4), _I()),
    "bias must be \\[8\\] \\(x's last dim\\) or \\[0\\]": lambda: _raw((4, 8), jnp.float32, _F(4, 8), _F(0), _F(3),
                                                                      _F(8), _F(8), _I(4), _I()),
    "offset must be float32": lambda: _raw((4, 8), jnp.float32, _F(4, 8), _F(0), _F(0), _F(8),
                                            jnp.ones((8,), jnp.bfloat16), _I(4), _I()),
    "residual must have x's shape": lambda: _raw((4, 8), jnp.float32, _F(4, 8), _F(4, 4), _F(0), _F(8), _F(8),
                                                 _I(4), _I()),
    "tile_h must be in \\[1, M\\]": lambda: _raw((4, 8), jnp.float32, _F(4, 8), _F(0), _F(0), _F(8), _F(8), _I(4),
                                                _I(), tile_h=5),
    "epsilon must be finite and >= 0": lambda: _raw((4, 8), jnp.float32, _F(4, 8), _F(0), _F(0), _F(8), _F(8),
                                                    _I(4), _I(), epsilon=-1.0),
    "y must have x's shape and dtype": lambda: _raw((4, 8), jnp.bfloat16, _F(4, 8), _F(0), _F(0), _F(8), _F(8),
                                                    _I(4), _I()),
    "tiles must be \\[\\.\\.\\., capacity\\] and count": lambda: _raw((2, 4, 8), jnp.float32, _F(2, 4, 8), _F(0), _F(0),
                                                                   _F(8), _F(8), _I(3, 4), _I(3)),
}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", list(RAW_BAD))
def test_raw_target_refuses_bad_input(platform, case):
    """The handlers validate on their own (CPU and CUDA): an error naming the target."""
    assert_call_raises(platform, "pit_row_layer_norm: .*" + case, RAW_BAD[case])


def _raw_bwd(x, dy, *, dy2=None, dvec=(3, 8), work=(2, 3, 8), scale=8, dtype=jnp.float32):
    outs = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(dvec, dtype),
            jax.ShapeDtypeStruct(work, jnp.float32))
    call = jax.ffi.ffi_call("pit_row_layer_norm_bwd", outs)
    dy2 = _F(0) if dy2 is None else dy2
    return call(x, _F(0), _F(0), _F(scale), _I(4), _I(), dy, dy2, tile_h=np.int64(1), epsilon=np.float32(1e-6))


RAW_BAD_BWD = {
    "dy must have x's shape and dtype": lambda: _raw_bwd(_F(4, 8), jnp.ones((4, 8), jnp.bfloat16)),
    "dy2 must have x's shape and dtype \\(or be \\[0\\] for none\\)": lambda: _raw_bwd(_F(4, 8), _F(4, 8),
                                                                                  dy2=_F(4, 4)),
    "dvec must be float32 \\[\\.\\.\\., 3, H\\]": lambda: _raw_bwd(_F(4, 8), _F(4, 8), dvec=(2, 8)),
    "dvec must be float32": lambda: _raw_bwd(_F(4, 8), _F(4, 8), dtype=jnp.bfloat16),
    "work must be float32 \\[\\.\\.\\., warps, 3, H\\]": lambda: _raw_bwd(_F(4, 8), _F(4, 8), work=(3, 8)),
    "scale must be \\[8\\]": lambda: _raw_bwd(_F(4, 8), _F(4, 8), scale=7),
}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", list(RAW_BAD_BWD))
def test_raw_backward_target_refuses_bad_input(platform, case):
    assert_call_raises(platform, "pit_row_layer_norm_bwd: .*" + case, RAW_BAD_BWD[case])


@pytest.mark.parametrize("platform", PLATFORMS)
def test_empty_shapes(platform):
    """No rows, no batch entries, no features: an empty result, no error."""
    for shape in ((0, 8), (2, 0, 8), (4, 0)):
        h = shape[-1]
        x = put(platform, jnp.ones(shape, jnp.bfloat16))
        y = jax.jit(lambda a: pit_jax.layer_norm(a, jnp.ones(h), jnp.zeros(h)))(x)
        assert y.shape == shape and y.dtype == jnp.bfloat16
    idx = pit_jax.index(put(platform, jnp.zeros((5, 1), bool)), "row")  # no live row
    y = jax.jit(lambda a: pit_jax.layer_norm(a, jnp.ones(8), jnp.zeros(8), idx))(put(platform, jnp.ones((5, 8))))
    assert not np.asarray(y).any()
    # gradients of empty and all-dead cases: zeros, no error
    grad = jax.jit(jax.grad(lambda a, s: jnp.sum(pit_jax.layer_norm(a, s, jnp.zeros_like(s), idx) ** 2), (0, 1)))
    dx, ds = grad(put(platform, jnp.ones((5, 8))), jnp.ones(8))
    assert not np.asarray(dx).any() and not np.asarray(ds).any()
    for shape in ((0, 8), (2, 0, 8)):
        dx, ds = jax.jit(jax.grad(lambda a, s: jnp.sum(pit_jax.layer_norm(a, s, jnp.zeros(8))), (0, 1)))(
            put(platform, jnp.ones(shape)), jnp.ones(8))
        assert dx.shape == shape and not np.asarray(ds).any()
