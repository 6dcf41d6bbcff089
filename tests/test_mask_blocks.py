"""pit_jax.mask_blocks (pit_mask_blocks): a block mask applied to weight matrices and
cast, reading only the live blocks. Results against NumPy (ml_dtypes' round to nearest
even), bit for bit; NaN and inf in dead blocks must not leak (a dead block is not read)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import PLATFORMS, assert_call_raises, bits, fresh_rng, put, randn

import pit_jax
from pit_jax import reference
from pit_jax.primitives.mask_blocks import mask_blocks_p

pytestmark = pytest.mark.usefixtures("poison_outputs")

# (in, out): the pruned step's cast (float32 -> 16-bit), same-type masks, widening.
DTYPE_PAIRS = [
    (jnp.float32, jnp.bfloat16),
    (jnp.float32, jnp.float16),
    (jnp.float32, jnp.float32),
    (jnp.bfloat16, jnp.bfloat16),
    (jnp.float16, jnp.float32),
    (jnp.bfloat16, jnp.float16),
]
# (lead, K, N, tile): BERT's 32x64 blocks, edge blocks partial, strips (one element and
# one row wide: the element-wise path), blocks of 8 columns (the narrowest vector path),
# a block wider than the matrix, leading dims.
CASES = [
    ((), 96, 192, (32, 64)),
    ((2,), 100, 136, (32, 64)),
    ((), 64, 72, (32, 1)),
    ((3,), 33, 64, (1, 32)),
    ((), 45, 37, (5, 7)),
    ((), 40, 64, (16, 8)),
    ((), 20, 48, (32, 64)),
    ((), 1, 1, (1, 1)),
]


def expand(live, tile, shape):
    return np.repeat(np.repeat(live, tile[0], axis=-2), tile[1], axis=-1)[..., : shape[0], : shape[1]]


def want_of(x, live, tile, out_dtype):
    mask = expand(np.asarray(live), tile, x.shape[-2:])
    x32 = np.asarray(x).astype(np.float32)
    return np.where(mask, x32, 0).astype(jnp.dtype(out_dtype))


def case(rng, lead, k, n, tile, dtype, density):
    x = randn(rng, (*lead, k, n), dtype)
    tk, tn = math.ceil(k / tile[0]), math.ceil(n / tile[1])
    live = rng.random((*lead, tk, tn)) < density
    # NaN and inf where the blocks are dead: a kernel that reads them would pass them on
    dead = ~expand(live, tile, (k, n))
    poison = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32), size=x.shape)
    x = np.where(dead & (rng.random(x.shape) < 0.5), poison.astype(x.dtype), x)
    return x, live


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("density", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("lead,k,n,tile", CASES)
def test_mask_blocks_value(platform, lead, k, n, tile, in_dtype, out_dtype, density):
    rng, seed = fresh_rng()
    x, live = case(rng, lead, k, n, tile, in_dtype, density)
    got = jax.jit(lambda x, l: pit_jax.mask_blocks(x, l, tile, out_dtype))(*put(platform, x, live))
    assert got.shape == x.shape and got.dtype == jnp.dtype(out_dtype)
    np.testing.assert_array_equal(bits(got), bits(want_of(x, live, tile, out_dtype)), err_msg=f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_mask_blocks_bert_shapes(platform):
    """The pruned BERT step's four kernel shapes, 12 matrices a call (its dense route)."""
    rng, seed = fresh_rng()
    for k, n in [(768, 2304), (768, 768), (768, 3072), (3072, 768)]:
        mats = [randn(rng, (k, n), jnp.float32) for _ in range(12)]
        live = rng.random((12, k // 32, n // 64)) < 0.5
        fn = jax.jit(lambda l, *m: pit_jax.mask_blocks(list(m), l, (32, 64), jnp.bfloat16))
        got = fn(*put(platform, live, *mats))
        for i, m in enumerate(mats):
            np.testing.assert_array_equal(bits(got[i]), bits(want_of(m, live[i], (32, 64), jnp.bfloat16)),
                                          err_msg=f"seed={seed} {k}x{n} matrix {i}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_mask_blocks_list_of_matrices(platform):
    """A list (leading dims flattened into the stacked mask) equals one call per matrix,
    with the mask as block_topk returns it for the list."""
    rng, seed = fresh_rng()
    mats = [randn(rng, (2, 64, 128), jnp.float32), randn(rng, (64, 128), jnp.float32)]
    top = pit_jax.block_topk(mats, (32, 64), 0.5)
    got = jax.jit(lambda l, *m: pit_jax.mask_blocks(list(m), l, (32, 64), jnp.bfloat16))(
        *put(platform, top.live, *mats))
    assert isinstance(got, list) and len(got) == 2
    np.testing.assert_array_equal(bits(got[0]), bits(want_of(mats[0], top.live[:2], (32, 64), jnp.bfloat16)))
    np.testing.assert_array_equal(bits(got[1]), bits(want_of(mats[1], top.live[2], (32, 64), jnp.bfloat16)))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_mask_blocks_grad_jvp_vmap(platform, out_dtype):
    """Linear in the matrices: the gradient is the cotangent masked and cast back, the
    tangent the masked cast; vmap over matrices and masks, and vmap(grad)."""
    rng, seed = fresh_rng()
    tile = (16, 32)
    x = put(platform, randn(rng, (3, 64, 96), jnp.float32))
    live = put(platform, rng.random((3, 4, 3)) < 0.5)
    cot = randn(rng, (3, 64, 96), out_dtype)
    _, vjp = jax.vjp(lambda x: pit_jax.mask_blocks(x, live, tile, out_dtype), x)
    (g,) = jax.jit(vjp)(put(platform, cot))
    assert g.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(g), want_of(cot, np.asarray(live), tile, jnp.float32),
                                  err_msg=f"seed={seed}")
    t = randn(rng, (3, 64, 96), jnp.float32)
    _, tan = jax.jit(lambda x, t: jax.jvp(lambda x: pit_jax.mask_blocks(x, live, tile, out_dtype), (x,), (t,)))(
        x, put(platform, t))
    np.testing.assert_array_equal(bits(tan), bits(want_of(t, np.asarray(live), tile, out_dtype)))
    # vmap: mapped matrices with a mapped mask, and with one mask for all
    got = jax.jit(jax.vmap(lambda x, l: pit_jax.mask_blocks(x, l, tile, out_dtype)))(x, live)
    np.testing.assert_array_equal(bits(got), bits(want_of(np.asarray(x), np.asarray(live), tile, out_dtype)))
    got = jax.jit(jax.vmap(lambda x: pit_jax.mask_blocks([x, x], live[:2], tile, out_dtype)))(x[:2])
    for j in range(2):
        np.testing.assert_array_equal(bits(got[j]), bits(want_of(np.asarray(x[:2]), np.asarray(live[j]), tile,
                                                                  out_dtype)))
    loss = lambda x, l: jnp.sum(pit_jax.mask_blocks(x, l, tile, out_dtype).astype(jnp.float32) ** 2)  # noqa: E731
    gs = jax.jit(jax.vmap(jax.grad(loss)))(x, live)
    x_out = want_of(np.asarray(x), np.asarray(live), tile, out_dtype).astype(np.float32)
    np.testing.assert_allclose(np.asarray(gs), 2 * x_out, rtol=0, atol=0)


def test_mask_blocks_in_a_training_step():
    """jit of an optax step on a masked, cast kernel: the same as the jnp masked cast."""
    import optax

    rng, seed = fresh_rng()
    w = jnp.asarray(randn(rng, (2, 64, 128), jnp.float32))
    x = jnp.asarray(randn(rng, (16, 64), jnp.bfloat16))
    tx = optax.adam(1e-2)

    def step(mask):
        def f(w, s):
            live = pit_jax.block_topk(w, (32, 64), 0.5).live
            loss, g = jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ mask(w, live)).astype(jnp.float32)))(w)
            u, s = tx.update(g, s, w)
            return optax.apply_updates(w, u), s, loss
        return jax.jit(f)

    ours = step(lambda w, l: pit_jax.mask_blocks(w, l, (32, 64), jnp.bfloat16))
    jnp_ = step(lambda w, l: reference.mask_blocks(l.reshape(-1, 2, 2), w, tile_h=32, tile_w=64,
                                                   dtype=jnp.bfloat16)[0])
    a, b = (w, tx.init(w)), (w, tx.init(w))
    for _ in range(3):
        *a, la = ours(*a)
        *b, lb = jnp_(*b)
        np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]), err_msg=f"seed={seed}")
        assert la == lb


def test_mask_blocks_reference_switch_and_empty():
    rng, _ = fresh_rng()
    x = randn(rng, (2, 40, 70), jnp.float32)
    live = rng.random((2, 2, 2)) < 0.5
    with pit_jax.use_reference(ops=("index",)):
        jaxpr = str(jax.make_jaxpr(lambda x: pit_jax.mask_blocks(x, live, (32, 64), jnp.bfloat16))(x))
        got = pit_jax.mask_blocks(x, live, (32, 64), jnp.bfloat16)
    assert mask_blocks_p.name not in jaxpr
    np.testing.assert_array_equal(bits(got), bits(want_of(x, live, (32, 64), jnp.bfloat16)))
    out = pit_jax.mask_blocks(jnp.zeros((0, 8, 8)), jnp.zeros((0, 2, 2), bool), (4, 4))
    assert out.shape == (0, 8, 8) and out.dtype == jnp.float32


@pytest.mark.parametrize(
    "args,err,match",
    [
        ((jnp.zeros((8, 8)), jnp.zeros((2, 2), jnp.int32), (4, 4)), ValueError, r"live must be bool \[2, 2\]"),
        ((jnp.zeros((8, 8)), jnp.zeros((2, 3), bool), (4, 4)), ValueError, r"live must be bool \[2, 2\]"),
        (([jnp.zeros((2, 8, 8)), jnp.zeros((8, 8))], jnp.zeros((2, 2, 2), bool), (4, 4)), ValueError,
         r"live must be bool \[3, 2, 2\]"),
        (([jnp.zeros((8, 8)), jnp.zeros((8, 9))], jnp.zeros((2, 2, 2), bool), (4, 4)), ValueError,
         r"matrices\[1\] must match"),
        ((jnp.zeros((8, 8), jnp.int32), jnp.zeros((2, 2), bool), (4, 4)), TypeError, "must be float32, bfloat16"),
        ((jnp.zeros((8,)), jnp.zeros((2,), bool), (4, 4)), ValueError, "rank >= 2"),
        ((jnp.zeros((8, 8)), jnp.zeros((2, 2), bool), (0, 4)), ValueError, "micro_tile must be positive"),
    ],
)
def test_mask_blocks_bad_input(args, err, match):
    with pytest.raises(err, match=match):
        pit_jax.mask_blocks(*args)
    with pytest.raises(TypeError, match="dtype must be float32, bfloat16 or float16"):
        pit_jax.mask_blocks(jnp.zeros((8, 8)), jnp.zeros((2, 2), bool), (4, 4), jnp.int8)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_mask_blocks_target_refuses_bad_operands(platform):
    """The raw target checks what the op validated: live's size, matrices of one shape."""
    x = jnp.zeros((8, 8), jnp.float32)
    assert_call_raises(platform, r"pit_mask_blocks: live must be bool \[1, 2, 2\]",
                       lambda: mask_blocks_p.bind(jnp.zeros((1, 2, 3), bool), x, tile=(4, 4), dtype=jnp.float32))
    assert_call_raises(platform, "pit_mask_blocks: matrix operand 1",
                       lambda: mask_blocks_p.bind(jnp.zeros((2, 2, 2), bool), x, jnp.zeros((8, 16)), tile=(4, 4),
                                                  dtype=jnp.float32))
