"""pit_jax.cast_matrices: a parameter tree's weight matrices cast by pit_mask_blocks, one
launch per group of same-shaped matrices. Bit for bit what `astype` gives (NaN and inf
kept), the other leaves untouched, gradients as `astype`'s, and a Flax model applied to
the cast tree exactly as to the float32 one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from pit_testing import PLATFORMS, bits, fresh_rng, put, randn

import pit_jax

pytestmark = pytest.mark.usefixtures("poison_outputs")


def f32(a):
    return np.asarray(a).astype(np.float32)


def assert_same(got, want, msg=""):
    """Equal bits, except that a NaN may be any NaN (the CUDA conversion gives its own)."""
    got, want = np.asarray(got), np.asarray(want)
    same = (got.dtype, got.shape) == (want.dtype, want.shape)
    assert same, f"{msg}: {got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}"
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got, want, err_msg=msg)
        return
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan, err_msg=f"{msg}: NaN positions")
    np.testing.assert_array_equal(bits(got)[~nan], bits(want)[~nan], err_msg=msg)


def param_tree(rng):
    """Flax-shaped params: kernels of three shapes (two of one shape, one stacked over
    experts, one not a multiple of 8 wide), biases, an embedding table, a kernel already
    in bf16 and an integer leaf."""
    k = lambda *s: randn(rng, s, jnp.float32)  # noqa: E731
    tree = {
        "emb": {"embedding": k(50, 16)},
        "layer_0": {"qkv": {"kernel": k(16, 48), "bias": k(48)}, "out": {"kernel": k(48, 16), "bias": k(16)}},
        "layer_1": {"qkv": {"kernel": k(16, 48), "bias": k(48)}, "out": {"kernel": k(48, 16), "bias": k(16)}},
        "experts": {"kernel": k(4, 16, 40)},
        "odd": {"kernel": k(7, 13)},
        "head": {"kernel": randn(rng, (16, 2), jnp.bfloat16)},
        "step": np.int32(3),
    }
    # NaN and inf survive the cast, as astype keeps them
    tree["odd"]["kernel"][0, :3] = [np.nan, np.inf, -np.inf]
    return tree


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
def test_cast_matrices_value(platform, dtype):
    rng, seed = fresh_rng()
    tree = param_tree(rng)
    args = jax.tree.map(lambda a: put(platform, a), tree)
    fn = jax.jit(lambda t: pit_jax.cast_matrices(t, dtype))
    got = fn(args)
    paths = {jax.tree_util.keystr(p): (p, a) for p, a in jax.tree_util.tree_flatten_with_path(tree)[0]}
    for key, g in jax.tree_util.tree_flatten_with_path(got)[0]:
        want = paths[jax.tree_util.keystr(key)][1]
        cast = key[-1].key == "kernel"  # every kernel not in dtype, the bf16 head's too
        want = np.asarray(want).astype(jnp.dtype(dtype)) if cast else np.asarray(want)
        assert_same(g, want, f"seed={seed} {jax.tree_util.keystr(key)}")
    # one launch per group of same-shaped kernels: (16, 48), (48, 16), (16, 40), (7, 13),
    # and the bf16 head's when it is cast
    groups = 4 + (jnp.dtype(dtype) != jnp.bfloat16)
    assert str(jax.make_jaxpr(fn)(args)).count("pit_mask_blocks[") == groups


@pytest.mark.parametrize("platform", PLATFORMS)
def test_cast_matrices_include_and_no_op(platform):
    rng, _ = fresh_rng()
    tree = param_tree(rng)
    args = jax.tree.map(lambda a: put(platform, a), tree)
    # every matrix, the embedding table too
    got = jax.jit(lambda t: pit_jax.cast_matrices(t, jnp.bfloat16, include=lambda p, a: True))(args)
    assert got["emb"]["embedding"].dtype == jnp.bfloat16 and got["layer_0"]["qkv"]["bias"].dtype == jnp.float32
    np.testing.assert_array_equal(bits(got["emb"]["embedding"]), bits(tree["emb"]["embedding"].astype(jnp.bfloat16)))
    # nothing to cast (every kernel float32 already): no launch
    f32 = {k: v for k, v in args.items() if k != "head"}
    assert "pit_mask_blocks" not in str(jax.make_jaxpr(lambda t: pit_jax.cast_matrices(t, jnp.float32))(f32))
    with pytest.raises(TypeError, match=r"cast_matrices: dtype must be float32, bfloat16 or float16, got int8"):
        pit_jax.cast_matrices(args, jnp.int8)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_cast_matrices_grad_and_vmap(platform):
    """The gradient is the cotangent cast back (as astype's); vmap over a batch of trees."""
    rng, seed = fresh_rng()
    tree = {"a": {"kernel": randn(rng, (3, 32, 24), jnp.float32)}, "b": {"kernel": randn(rng, (32, 24), jnp.float32)}}
    x = randn(rng, (5, 32), jnp.bfloat16)
    args = jax.tree.map(lambda a: put(platform, a), tree)

    def loss(cast):
        def f(t):
            t = cast(t)
            y = jnp.tanh(x @ t["b"]["kernel"]) + jnp.einsum("mk,ekn->mn", x, t["a"]["kernel"])
            return jnp.sum(y.astype(jnp.float32) ** 2)
        return f

    ours = jax.jit(jax.grad(loss(lambda t: pit_jax.cast_matrices(t, jnp.bfloat16))))(args)
    want = jax.jit(jax.grad(loss(lambda t: jax.tree.map(lambda a: a.astype(jnp.bfloat16), t))))(args)
    for g, w in zip(jax.tree.leaves(ours), jax.tree.leaves(want)):
        assert g.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"seed={seed}")
    batch = jax.tree.map(lambda a: jnp.stack([a, -a]), args)
    got = jax.jit(jax.vmap(lambda t: pit_jax.cast_matrices(t, jnp.bfloat16)))(batch)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(batch)):
        np.testing.assert_array_equal(bits(g), bits(np.asarray(w).astype(jnp.bfloat16)))


class _Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        for i, width in enumerate((64, 64, 32)):
            x = nn.Dense(width, dtype=jnp.bfloat16, name=f"dense_{i}")(x)
            x = nn.relu(x) if i < 2 else x
        return x


@pytest.mark.parametrize("platform", PLATFORMS)
def test_cast_matrices_flax_mixed_precision(platform):
    """A Flax model with float32 parameters and bf16 layers gives the same results applied
    to the cast tree (its own casts become no-ops), and the same parameter gradients."""
    rng, seed = fresh_rng()
    x = put(platform, randn(rng, (8, 32), jnp.float32))
    model = _Mlp()
    params = jax.jit(model.init)(jax.random.PRNGKey(seed % 2**31), x)
    # On a GPU XLA may fuse a dot's operand cast into the dot's own kernel (another
    # summation order): there the same within bf16's rounding.
    tol = 0 if platform == "cpu" else 1e-2
    plain = jax.jit(model.apply)(params, x)
    cast = jax.jit(lambda p, x: model.apply(pit_jax.cast_matrices(p, jnp.bfloat16), x))(params, x)
    np.testing.assert_allclose(f32(cast), f32(plain), rtol=tol, atol=tol * np.abs(f32(plain)).max(),
                               err_msg=f"seed={seed}")
    loss = lambda cast_fn: lambda p: jnp.sum(model.apply(cast_fn(p), x).astype(jnp.float32) ** 2)  # noqa: E731
    g_plain = jax.jit(jax.grad(loss(lambda p: p)))(params)
    g_cast = jax.jit(jax.grad(loss(lambda p: pit_jax.cast_matrices(p, jnp.bfloat16))))(params)
    for g, w in zip(jax.tree.leaves(g_cast), jax.tree.leaves(g_plain)):
        np.testing.assert_allclose(f32(g), f32(w), rtol=tol, atol=tol * np.abs(f32(w)).max(), err_msg=f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_cast_matrices_nnx_state(platform):
    """An nnx model's State (paths ending in the Variable's .value): its Linear kernels
    are cast by default, the biases kept; the merged model gives what its own casts give."""
    from flax import nnx

    class Mlp(nnx.Module):
        def __init__(self, rngs):
            self.a = nnx.Linear(32, 64, dtype=jnp.bfloat16, rngs=rngs)
            self.b = nnx.Linear(64, 64, dtype=jnp.bfloat16, rngs=rngs)
            self.c = nnx.Linear(64, 64, dtype=jnp.bfloat16, rngs=rngs)

        def __call__(self, x):
            return self.c(nnx.relu(self.b(nnx.relu(self.a(x)))))

    rng, seed = fresh_rng()
    with jax.default_device(jax.devices(platform)[0]):
        graph, state = nnx.split(Mlp(nnx.Rngs(seed % 2**31)))
    x = put(platform, randn(rng, (8, 32), jnp.float32))
    fn = jax.jit(lambda s: pit_jax.cast_matrices(s, jnp.bfloat16))
    cast = fn(state)
    assert cast["a"]["kernel"][...].dtype == jnp.bfloat16 and cast["a"]["bias"][...].dtype == jnp.float32
    assert str(jax.make_jaxpr(fn)(state)).count("pit_mask_blocks[") == 2  # (32, 64) and the two (64, 64)
    run = jax.jit(lambda s, x: nnx.merge(graph, s)(x))
    tol = 0 if platform == "cpu" else 1e-2  # as in test_cast_matrices_flax_mixed_precision
    want = f32(run(state, x))
    np.testing.assert_allclose(f32(run(cast, x)), want, rtol=tol, atol=tol * np.abs(want).max(),
                               err_msg=f"seed={seed}")
