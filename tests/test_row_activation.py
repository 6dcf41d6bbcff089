"""pit_row_activation(_bwd): an activation and its derivative on the live rows (what the
M-axis product with an activation runs in a differentiated step), against float64."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import (PLATFORMS, activation64, assert_call_raises, check_close, f64, fresh_rng, listed_rows, put,
                         randn, requires_gpu)

import pit_jax
from pit_jax.primitives.row_activation import row_activation

pytestmark = pytest.mark.usefixtures("poison_outputs")

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
NAMES = ["relu", "gelu", "gelu_exact", "silu"]
# (M, N, tile_h): N a multiple of 8 (16-byte vectors) or not, M not a multiple of tile_h.
# (9, 1288, 2): 16-byte vectors, two segments of a 16-bit row on the GPU, the second partial.
SHAPES = [(1, 8, 1), (37, 96, 1), (50, 100, 4), (130, 3072, 1), (33, 64, 32), (9, 1288, 2)]


def grad64(v, name):
    """d act / dv in float64 (jax.nn's formulas; relu: 1 where v > 0)."""
    if name == "relu":
        return (v > 0).astype(np.float64)
    if name == "gelu":
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (v + 0.044715 * v ** 3))
        return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v)
    if name == "gelu_exact":
        from math import erf
        return 0.5 * (1 + np.vectorize(erf)(v / math.sqrt(2))) + v * np.exp(-0.5 * v * v) / math.sqrt(2 * math.pi)
    s = 1 / (1 + np.exp(-v))
    return s * (1 + v * (1 - s))


def case(rng, lead, m, n, tile_h, density, dtype):
    z = randn(rng, (*lead, m, n), dtype)
    fill = randn(rng, (n,), dtype)
    blocks = rng.random((*lead, math.ceil(m / tile_h))) < density
    live = np.repeat(blocks, tile_h, -1)[..., :m]
    return z, fill, live


def apply(z, fill, live, tile_h, name, capacity=None):
    idx = pit_jax.index(live[..., None], (tile_h, 1), capacity=capacity)
    tiles, count = pit_jax.ops.sread_swrite.flat_index(idx, tuple(z.shape[:-2]), "test", "z")
    return row_activation(z, fill, tiles, count, tile_h=tile_h, activation=name)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("density", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("m,n,tile_h", SHAPES)
def test_value_and_gradients(platform, dtype, name, density, m, n, tile_h):
    rng, seed = fresh_rng()
    z, fill, live = case(rng, (2,), m, n, tile_h, density, dtype)
    dy = randn(rng, z.shape, dtype)

    def f(z, fill, live, dy):
        y, vjp = jax.vjp(lambda z, f: apply(z, f, live, tile_h, name), z, fill)
        return (y, *vjp(dy))

    args = put(platform, z, fill, live, dy)
    jaxpr = str(jax.make_jaxpr(f)(*args))
    assert "pit_row_activation_bwd[" in jaxpr and "pit_row_activation_lin[" not in jaxpr
    y, dz, dfill = jax.jit(f)(*args)
    want_y = np.where(live[..., None], activation64(f64(z), name), f64(fill))
    check_close(y, want_y, dtype, f"seed={seed} y")
    g = f64(np.asarray(jnp.asarray(dy)))
    check_close(dz, np.where(live[..., None], g * grad64(f64(z), name), 0.0), dtype, f"seed={seed} dz")
    assert not f64(dz)[~live].any(), f"seed={seed}: dead rows get no gradient"
    check_close(dfill, np.where(live[..., None], 0.0, g).sum((0, 1)), dtype, f"seed={seed} dfill")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("capacity", [None, 7])
def test_backward_dead_rows_unwritten(platform, capacity):
    """row_activation_bwd(dead_zeros=False), what row_linear's backward asks for when only
    readers of the listed rows take dz: the listed rows bitwise the dead_zeros=True result,
    the others not written (with poisoned outputs they stay NaN), at full capacity (the
    kernel's dead-tail slots skip their rows) and below it (no memset)."""
    from pit_jax.primitives.row_activation import row_activation_bwd

    rng, seed = fresh_rng()
    z, _, live = case(rng, (), 50, 72, 1, 0.4, jnp.bfloat16)
    dy = randn(rng, z.shape, jnp.bfloat16)
    idx = pit_jax.index(put(platform, live[..., None]), "row", capacity=capacity)
    tiles, count = pit_jax.ops.sread_swrite.flat_index(idx, (), "test", "z")
    listed = listed_rows(idx, 50)
    f = jax.jit(lambda z, dy, dead_zeros: row_activation_bwd(z, tiles, count, dy, tile_h=1, activation="gelu_exact",
                                                              dead_zeros=dead_zeros), static_argnums=2)
    args = put(platform, z, dy)
    kept, zeros = (np.asarray(f(*args, d), np.float32) for d in (False, True))
    np.testing.assert_array_equal(kept[listed], zeros[listed], err_msg=f"seed={seed}")
    assert not zeros[~listed].any()
    assert np.isnan(kept[~listed]).all(), f"seed={seed}: the unlisted rows must be left unwritten (poisoned)"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("capacity", [3, 10])
def test_capacity_below_the_row_blocks(platform, capacity):
    """A list too short for every block: rows past the capacity are fill (the forward
    fills every row first) and get no gradient."""
    rng, seed = fresh_rng()
    z, fill, live = case(rng, (), 40, 24, 1, 0.5, jnp.float32)
    dy = randn(rng, z.shape, jnp.float32)
    idx = pit_jax.index(put(platform, live[:, None]), "row", capacity=capacity)
    listed = listed_rows(idx, 40)
    f = jax.jit(lambda z, fill: jax.vjp(lambda z, f: apply(z, f, live, 1, "gelu", capacity), z, fill))
    y, vjp = f(*put(platform, z, fill))
    dz, dfill = vjp(put(platform, dy))
    check_close(y, np.where(listed[:, None], activation64(f64(z), "gelu"), f64(fill)), jnp.float32, f"seed={seed}")
    check_close(dz, np.where(listed[:, None], f64(dy) * grad64(f64(z), "gelu"), 0.0), jnp.float32, f"seed={seed}")
    check_close(dfill, np.where(listed[:, None], 0.0, f64(dy)).sum(0), jnp.float32, f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_transforms(platform):
    """No fill (zeros), vmap of the value and of the gradient, jvp and a second-order
    derivative, against the jnp reference."""
    rng, seed = fresh_rng()
    z, _, live = case(rng, (3,), 20, 16, 1, 0.5, jnp.float32)
    z, live = put(platform, z, live)

    def f(z, live):
        return apply(z, None, live, 1, "silu")

    def ref(z, live):
        return jnp.where(live[..., None], jax.nn.silu(z), 0.0)

    loss = lambda fn: (lambda z, live: jnp.sum(jnp.sin(fn(z, live))))  # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.jit(f)(z, live)), np.asarray(ref(z, live)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(f))(z, live)), np.asarray(ref(z, live)), rtol=1e-5,
                               atol=1e-6)
    vg = jax.jit(jax.vmap(jax.grad(loss(f))))(z, live)
    np.testing.assert_allclose(np.asarray(vg), np.asarray(jax.vmap(jax.grad(loss(ref)))(z, live)), rtol=1e-4,
                               atol=1e-6, err_msg=f"seed={seed}")
    v = jnp.asarray(np.random.default_rng().standard_normal(z.shape), jnp.float32)
    t, t_ref = jax.jvp(lambda z: f(z, live), (z,), (v,))[1], jax.jvp(lambda z: ref(z, live), (z,), (v,))[1]
    np.testing.assert_allclose(np.asarray(t), np.asarray(t_ref), rtol=1e-4, atol=1e-6)
    hvp = lambda fn: jax.jvp(lambda z: jax.grad(loss(fn))(z, live), (z,), (v,))[1]  # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.jit(lambda: hvp(f))()), np.asarray(hvp(ref)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_gelu_exact_elementwise_over_the_float32_range(platform):
    """gelu_exact and its derivative element by element over [-14, 14] and +inf (the GPU's
    Phi is its own erfc fit, cuda/kernels/epilogue.cuh NormalCdf): within float32 rounding
    of the float64 values, relative where they are not tiny, so the negative tail is
    checked too (a check scaled by max |ref| would not see it)."""
    rng, seed = fresh_rng()
    v = np.concatenate([np.linspace(-14.0, 14.0, 28001), rng.standard_normal(4059) * 4.0, [0.0, -0.0, np.inf, 40.0]])
    z = v.astype(np.float32).reshape(-1, 64)
    live = np.ones(z.shape[0], bool)

    def f(z, live):
        y, vjp = jax.vjp(lambda z: apply(z, None, live, 1, "gelu_exact"), z)
        return y, vjp(jnp.ones_like(y))[0]

    y, dz = (f64(a) for a in jax.jit(f)(*put(platform, z, live)))
    z64 = f64(z)
    fin = np.isfinite(z64)
    zf = z64[fin]
    for name, got, want, floor in (("gelu_exact", y[fin], activation64(zf, "gelu_exact"), 1e-7),
                                   ("its derivative", dz[fin], grad64(zf, "gelu_exact"), 3e-7)):
        bad = np.flatnonzero(np.abs(got - want) > 5e-6 * np.abs(want) + floor)
        assert bad.size == 0, f"seed={seed}: {name} at {zf[bad[:4]]} = {got[bad[:4]]}, want {want[bad[:4]]}"
    assert np.all(y[~fin] == np.inf), f"seed={seed}: gelu_exact(inf) = {y[~fin]}"


def _raw(target, outs, *args, activation=3, tile_h=1, **attrs):
    return jax.ffi.ffi_call(target, outs)(*args, tile_h=np.int64(tile_h), activation=np.int64(activation), **attrs)


_F = lambda *s: jnp.ones(s, jnp.float32)  # noqa: E731
_I = lambda *s: jnp.zeros(s, jnp.int32)  # noqa: E731
_Y = jax.ShapeDtypeStruct((4, 8), jnp.float32)
RAW_BAD = {
    ("pit_row_activation", "activation must be 1-4"): lambda: _raw("pit_row_activation", _Y, _F(4, 8), _F(0), _I(4),
                                                                    _I(), activation=0),
    ("pit_row_activation", "fill must be \\[8\\]"): lambda: _raw("pit_row_activation", _Y, _F(4, 8), _F(7), _I(4),
                                                                  _I()),
    ("pit_row_activation", "the result must have z's shape and dtype"): lambda: _raw(
        "pit_row_activation", jax.ShapeDtypeStruct((4, 8), jnp.bfloat16), _F(4, 8), _F(0), _I(4), _I()),
    ("pit_row_activation", "tile_h must be in \\[1, M\\]"): lambda: _raw("pit_row_activation", _Y, _F(4, 8), _F(0),
                                                                          _I(4), _I(), tile_h=5),
    ("pit_row_activation_bwd", "dy must have z's shape and dtype"): lambda: _raw(
        "pit_row_activation_bwd", _Y, _F(4, 8), _I(4), _I(), _F(4, 7), dead_zeros=True),
}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case_", list(RAW_BAD), ids=lambda c: c[1][:30])
def test_raw_targets_refuse_bad_input(platform, case_):
    assert_call_raises(platform, case_[0] + ": .*" + case_[1], RAW_BAD[case_])


def test_bad_activation_is_a_clear_error():
    z = jnp.ones((4, 8))
    with pytest.raises(ValueError, match="activation must be one of"):
        row_activation(z, None, jnp.zeros((4,), jnp.int32), jnp.zeros((), jnp.int32), tile_h=1, activation="tanh")


@requires_gpu
@pytest.mark.parametrize("name", ["relu", "gelu"])
def test_more_slots_than_one_wave_of_blocks_gpu(name):
    """Many more list slots than one wave of the CUDA kernels' blocks holds: 2 x 12000 slots
    of two row segments each (a warp per slot and segment), 35 % live and scattered, so
    the blocks of the live slots and of the dead tail run in several waves."""
    rng, seed = fresh_rng()
    z, fill, live = case(rng, (2,), 12000, 1288, 1, 0.35, jnp.bfloat16)
    dy = randn(rng, z.shape, jnp.bfloat16)

    def f(z, fill, live, dy):
        y, vjp = jax.vjp(lambda z, f: apply(z, f, live, 1, name), z, fill)
        return (y, *vjp(dy))

    y, dz, _ = jax.jit(f)(*put("gpu", z, fill, live, dy))
    check_close(y, np.where(live[..., None], activation64(f64(z), name), f64(fill)), jnp.bfloat16, f"seed={seed} y")
    g = f64(np.asarray(jnp.asarray(dy)))
    check_close(dz, np.where(live[..., None], g * grad64(f64(z), name), 0.0), jnp.bfloat16, f"seed={seed} dz")
