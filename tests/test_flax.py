"""pit_jax.flax.SparseDense (linen and nnx): drop-ins for nn.Dense / nnx.Linear, and a
jitted optax training step; VarlenSelfAttention (linen and nnx) against Flax's attention
with the padding mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from pit_testing import PLATFORMS, fresh_rng, put

import pit_jax
from pit_jax import reference as ref
from pit_jax.flax import SparseDense
from pit_jax.flax import nnx as pit_nnx


def relu_input(rng, shape, dead_rows=0.3):
    x = np.maximum(rng.standard_normal(shape), 0).astype(np.float32)
    x[..., rng.random(shape[:-1]) < dead_rows, :] = 0.0
    return x


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", ["m", "k", "w"])
@pytest.mark.parametrize("use_bias", [True, False])
def test_linen_matches_dense(platform, axis, use_bias):
    rng, seed = fresh_rng()
    x = put(platform, relu_input(rng, (2, 40, 48)))
    tile = (32, 16) if axis == "w" else None
    layer = SparseDense(24, use_bias=use_bias, axis=axis, micro_tile=tile)
    dense = nn.Dense(24, use_bias=use_bias)
    key = jax.random.PRNGKey(seed % 1000)
    params = layer.init(key, x)
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(dense.init(key, x))
    y = jax.jit(layer.apply)(params, x)
    y_dense = dense.apply(params, x)  # the same parameters drive nn.Dense
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_dense), rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")


@pytest.mark.parametrize("axis", ["m", "k", "w"])
def test_default_micro_tiles_fit_small_layers(axis):
    """Default micro-tiles are clipped to the matrix they tile (x, or the kernel for "w")."""
    rng, seed = fresh_rng()
    x = relu_input(rng, (64, 12))  # more rows than the kernel (12 x 24) has
    layer = SparseDense(24, axis=axis)
    params = layer.init(jax.random.PRNGKey(0), x)
    np.testing.assert_allclose(np.asarray(layer.apply(params, x)), np.asarray(nn.Dense(24).apply(params, x)),
                               rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_linen_dtypes(platform):
    rng, _ = fresh_rng()
    x = put(platform, relu_input(rng, (16, 32)))
    layer = SparseDense(8, axis="k", dtype=jnp.bfloat16, param_dtype=jnp.float32, micro_tile=(8, 1))
    params = layer.init(jax.random.PRNGKey(0), x)
    assert params["params"]["kernel"].dtype == jnp.float32
    y = layer.apply(params, x)
    assert y.dtype == jnp.bfloat16
    ref = nn.Dense(8, dtype=jnp.bfloat16).apply(params, x)
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(ref, np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", ["m", "k"])
def test_nnx_matches_linear(platform, axis):
    rng, seed = fresh_rng()
    x = put(platform, relu_input(rng, (3, 20, 40)))
    layer = pit_nnx.SparseDense(40, 12, axis=axis, rngs=nnx.Rngs(seed % 1000))
    ref = nnx.Linear(40, 12, rngs=nnx.Rngs(seed % 1000))
    np.testing.assert_array_equal(np.asarray(layer.kernel[...]), np.asarray(ref.kernel[...]))
    y = nnx.jit(lambda m, a: m(a))(layer, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref(x)), rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")


class MLP(nn.Module):
    sparse: bool

    @nn.compact
    def __call__(self, x):
        # Same layer names in both twins, so one set of parameters drives both.
        dense = (lambda f, ax, n: SparseDense(f, axis=ax, name=n)) if self.sparse else (
            lambda f, ax, n: nn.Dense(f, name=n))
        h = nn.relu(dense(64, "m", "fc1")(x))
        h = nn.relu(dense(64, "k", "fc2")(h))
        return dense(4, "k", "fc3")(h)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_jitted_optax_training_step(platform):
    """Loss goes down, and every step's gradients equal the dense twin's."""
    rng, seed = fresh_rng()
    x = put(platform, relu_input(rng, (64, 16), dead_rows=0.25))
    y = put(platform, rng.standard_normal((64, 4)).astype(np.float32))
    sparse, dense = MLP(True), MLP(False)
    params = sparse.init(jax.random.PRNGKey(seed % 1000), x)
    tx = optax.adam(1e-2)

    def make_step(model):
        @jax.jit
        def step(p, s):
            loss, g = jax.value_and_grad(lambda q: jnp.mean((model.apply(q, x) - y) ** 2))(p)
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s, loss, g

        return step

    step, dense_step = make_step(sparse), make_step(dense)
    s = tx.init(params)
    losses = []
    for i in range(30):
        _, _, dense_loss, dense_g = dense_step(params, s)
        params, s, loss, g = step(params, s)
        losses.append(float(loss))
        if i in (0, 29):
            assert abs(float(loss) - float(dense_loss)) < 1e-4 * max(1.0, float(dense_loss))
            for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(dense_g)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5, err_msg=f"seed={seed}")
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda x: SparseDense(4, axis="q").init(jax.random.PRNGKey(0), x),
         r"SparseDense: axis must be one of \('m', 'k', 'w'\), got 'q'"),
        (lambda x: pit_nnx.SparseDense(16, 4, axis="q", rngs=nnx.Rngs(0))(x),
         r"SparseDense: axis must be one of \('m', 'k', 'w'\), got 'q'"),
        (lambda x: SparseDense(4, batch_dims=5).init(jax.random.PRNGKey(0), x),
         r"batch_dims must be in \[0, 1\] for inputs of shape \(4, 8, 16\)"),
        (lambda x: SparseDense(4, dead_rows="nan").init(jax.random.PRNGKey(0), x),
         r"dead_rows must be one of \('dense', 'zeros', 'unspecified'\), got 'nan'"),
        (lambda x: SparseDense(4, axis="k", dead_rows="zeros").init(jax.random.PRNGKey(0), x),
         r"dead_rows='zeros' needs the M axis"),
        (lambda x: SparseDense(0).init(jax.random.PRNGKey(0), x),
         r"SparseDense: features must be an int >= 1, got 0"),
        (lambda x: pit_nnx.SparseDense(16, 0, rngs=nnx.Rngs(0)),
         r"SparseDense: out_features must be an int >= 1, got 0"),
    ],
)
def test_bad_configuration_is_a_clear_error(make, match):
    """A layer's bad attribute fails at trace time with a ValueError naming it (an unknown
    axis was a KeyError from the defaults' table until 2026-11-30)."""
    with pytest.raises(ValueError, match=match):
        make(jnp.ones((4, 8, 16)))


# VarlenSelfAttention: Flax's attention parameters, the result of Flax's self-attention with
# the padding mask on the valid rows, zeros on the padding rows.
ATTENTION_IDS = ["f32-xla", "bf16-kernels", "bf16-kernels-hd128", "bf16-kernels-long"]
ATTENTION_CASES = [
    # (dtype, D, heads, qkv_features, out_features, seq): float32 runs the attention's XLA
    # path, bf16 with head_dim 64 or 128 its kernels (the CPU targets here, the CUDA ones on
    # a GPU); past 128 tokens the long kernels.
    (jnp.float32, 24, 4, 32, 16, 37),
    (jnp.bfloat16, 128, 2, 128, 96, 37),
    (jnp.bfloat16, 96, 2, 256, 96, 37),  # head_dim 128
    (jnp.bfloat16, 64, 2, 128, 64, 200),
]


def attention_cases(test):
    """The Flax attention tests' cases: platforms x ATTENTION_CASES x (causal, padding) of an
    encoder and of a decoder's batch of left-padded prompts."""
    test = pytest.mark.parametrize("causal,padding", [(False, "right"), (True, "left")],
                                   ids=["bidirectional-right", "causal-left"])(test)
    test = pytest.mark.parametrize("dtype,d,heads,feats,out,seq", ATTENTION_CASES, ids=ATTENTION_IDS)(test)
    return pytest.mark.parametrize("platform", PLATFORMS)(test)


def _attention_inputs(rng, d, dtype, padding="right", seq=37):
    x = rng.standard_normal((3, seq, d)).astype(np.float32)
    lengths = np.array([seq, 0, int(rng.integers(1, seq))], np.int32)
    valid = np.asarray(ref.valid_tokens(lengths, seq, padding == "left"))
    return jnp.asarray(x, dtype), jnp.asarray(lengths), jnp.asarray(valid)


def _flax_mask(valid, causal, make_attention_mask, make_causal_mask, combine_masks):
    """Flax's mask for the same attention: padding keys (and queries), and later keys."""
    mask = make_attention_mask(valid, valid)
    return combine_masks(mask, make_causal_mask(valid)) if causal else mask


def _check_attention(y, y_flax, valid, dtype, what):
    y, y_flax = np.asarray(y, np.float32), np.asarray(y_flax, np.float32)
    tol = 1e-4 if dtype == jnp.float32 else 3e-2
    scale = max(1.0, float(np.abs(y_flax[valid]).max()))
    np.testing.assert_allclose(y[valid], y_flax[valid], atol=tol * scale, rtol=tol, err_msg=what)
    assert not y[~valid].any(), f"{what}: the padding rows must be zeros"


def _check_attention_grads(ours, theirs, params, valid, dtype, what):
    """The parameters' gradients of a loss on the valid rows, through our layer (jitted)
    and through Flax's."""
    def loss(p, apply):
        return jnp.sum(jnp.where(valid[..., None], apply(p).astype(jnp.float32), 0.0) ** 2)

    grads = jax.jit(jax.grad(lambda p: loss(p, ours)))(params)
    want = jax.grad(lambda p: loss(p, theirs))(params)
    top = max(float(np.abs(np.asarray(g, np.float32)).max()) for g in jax.tree_util.tree_leaves(want))
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=0,
                                   atol=(1e-4 if dtype == jnp.float32 else 5e-2) * top,
                                   err_msg=f"{what} {jax.tree_util.keystr(path)}")


@attention_cases
def test_varlen_self_attention_linen_matches_flax(platform, dtype, d, heads, feats, out, seq, causal, padding):
    from pit_jax.flax import VarlenSelfAttention

    rng, seed = fresh_rng()
    x, lengths, valid = (put(platform, a) for a in _attention_inputs(rng, d, dtype, padding, seq))
    layer = VarlenSelfAttention(num_heads=heads, qkv_features=feats, out_features=out, dtype=dtype, causal=causal,
                                padding=padding)
    flax_layer = nn.MultiHeadDotProductAttention(num_heads=heads, qkv_features=feats, out_features=out, dtype=dtype)
    key = jax.random.PRNGKey(seed % 1000)
    params = layer.init(key, x, lengths)
    want_tree = flax_layer.init(key, x, x)
    assert jax.tree_util.tree_map(jnp.shape, params) == jax.tree_util.tree_map(jnp.shape, want_tree)
    mask = _flax_mask(valid, causal, nn.make_attention_mask, nn.make_causal_mask, nn.combine_masks)

    ours = lambda p: layer.apply(p, x, lengths)  # noqa: E731
    theirs = lambda p: flax_layer.apply(p, x, x, mask=mask)  # noqa: E731
    _check_attention(jax.jit(ours)(params), theirs(params), np.asarray(valid), dtype, f"seed={seed}")
    index = pit_jax.index(jnp.reshape(valid, (-1, 1)), "row")  # one row index a model's layers share
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda p: layer.apply(p, x, lengths, index))(params), np.float32),
                                  np.asarray(jax.jit(ours)(params), np.float32), err_msg=f"seed={seed}")
    _check_attention_grads(ours, theirs, params, valid, dtype, f"seed={seed}")


@attention_cases
def test_varlen_self_attention_nnx_matches_flax(platform, dtype, d, heads, feats, out, seq, causal, padding):
    rng, seed = fresh_rng()
    x, lengths, valid = (put(platform, a) for a in _attention_inputs(rng, d, dtype, padding, seq))
    layer = pit_nnx.VarlenSelfAttention(heads, d, feats, out, dtype=dtype, causal=causal, padding=padding,
                                        rngs=nnx.Rngs(seed % 1000))
    flax_layer = nnx.MultiHeadAttention(num_heads=heads, in_features=d, qkv_features=feats, out_features=out,
                                        dtype=dtype, decode=False, rngs=nnx.Rngs(0))
    state = nnx.state(layer, nnx.Param)
    assert jax.tree_util.tree_map(jnp.shape, state) == jax.tree_util.tree_map(jnp.shape,
                                                                            nnx.state(flax_layer, nnx.Param))
    nnx.update(flax_layer, state)  # the same parameters drive Flax's layer
    y = nnx.jit(lambda m, x, ln: m(x, ln))(layer, x, lengths)
    mask = _flax_mask(valid, causal, nnx.make_attention_mask, nnx.make_causal_mask, nnx.combine_masks)
    _check_attention(y, flax_layer(x, mask=mask), np.asarray(valid), dtype, f"seed={seed}")


# Grouped-query heads and sliding windows: Flax's layer has neither, so the reference is
# Flax's attention with each kv head's parameters repeated over its group, under the
# padding mask combined with the window's band.
GROUPED_IDS = ["f32-xla-gqa", "bf16-kernels-mqa-window", "bf16-kernels-hd128-window", "bf16-kernels-long-gqa-window"]
GROUPED_CASES = [
    # (dtype, D, heads, kv_heads, qkv_features, out_features, seq, local_window_size)
    (jnp.float32, 24, 4, 2, 32, 16, 37, None),
    (jnp.bfloat16, 128, 4, 1, 256, 96, 37, (6, 3)),
    (jnp.bfloat16, 96, 2, 2, 256, 96, 37, 5),  # head_dim 128, no grouping
    (jnp.bfloat16, 64, 4, 2, 256, 64, 200, (40, 7)),
]


def _repeat_kv(params, group):
    """Flax's parameters of the same attention: each kv head's key / value repeated over
    its group of query heads (query head n reads kv head n // group)."""
    p = jax.tree_util.tree_map(lambda a: a, params)
    for name in ("key", "value"):
        p["params"][name] = {"kernel": jnp.repeat(params["params"][name]["kernel"], group, axis=1),
                             "bias": jnp.repeat(params["params"][name]["bias"], group, axis=0)}
    return p


def _band(seq, window, causal):
    """The window's mask [1, 1, S, S] (positions differ by the same amount whatever the
    padding: the valid tokens are contiguous)."""
    if window is None:
        return None
    left, right = (window, window) if isinstance(window, int) else window
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    return jnp.asarray((j >= i - left) & (j <= i + (0 if causal else right)))[None, None]


def _nnx_layer(params, heads, d, feats, out, **kw):
    """The nnx layer holding the linen layer's `params` (the same state)."""
    layer = pit_nnx.VarlenSelfAttention(heads, d, feats, out, rngs=nnx.Rngs(0), **kw)
    for name in ("query", "key", "value", "out"):
        module = getattr(layer, name)
        module.kernel[...] = params["params"][name]["kernel"]
        module.bias[...] = params["params"][name]["bias"]
    return layer


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("causal,padding", [(False, "right"), (True, "left")], ids=["bidirectional-right",
                                                                                    "causal-left"])
@pytest.mark.parametrize("dtype,d,heads,kv_heads,feats,out,seq,window", GROUPED_CASES, ids=GROUPED_IDS)
def test_varlen_self_attention_grouped_heads_and_window(platform, dtype, d, heads, kv_heads, feats, out, seq,
                                                        window, causal, padding):
    from pit_jax.flax import VarlenSelfAttention

    rng, seed = fresh_rng()
    x, lengths, valid = (put(platform, a) for a in _attention_inputs(rng, d, dtype, padding, seq))
    group, hd = heads // kv_heads, feats // heads
    layer = VarlenSelfAttention(num_heads=heads, num_kv_heads=kv_heads, qkv_features=feats, out_features=out,
                                dtype=dtype, causal=causal, padding=padding, local_window_size=window)
    flax_layer = nn.MultiHeadDotProductAttention(num_heads=heads, qkv_features=feats, out_features=out, dtype=dtype)
    params = layer.init(jax.random.PRNGKey(seed % 1000), x, lengths)
    # the biases start at zero: random ones, so that their gradients and grouping show
    params = jax.tree_util.tree_map_with_path(
        lambda path, a: jnp.asarray(rng.standard_normal(a.shape) * 0.1, a.dtype) if "bias" in jax.tree_util.keystr(
            path) else a, params)
    assert params["params"]["key"]["kernel"].shape == (d, kv_heads, hd)
    assert params["params"]["value"]["bias"].shape == (kv_heads, hd)
    mask = _flax_mask(valid, causal, nn.make_attention_mask, nn.make_causal_mask, nn.combine_masks)
    mask = nn.combine_masks(mask, _band(seq, window, causal))

    ours = lambda p: layer.apply(p, x, lengths)  # noqa: E731
    theirs = lambda p: flax_layer.apply(_repeat_kv(p, group), x, x, mask=mask)  # noqa: E731
    _check_attention(jax.jit(ours)(params), theirs(params), np.asarray(valid), dtype, f"seed={seed}")
    # the gradient of a shared kv head is its group's sum (through _repeat_kv)
    _check_attention_grads(ours, theirs, params, valid, dtype, f"seed={seed}")
    # nnx: the same state and result
    layer_nnx = _nnx_layer(params, heads, d, feats, out, dtype=dtype, causal=causal, padding=padding,
                           num_kv_heads=kv_heads, local_window_size=window)
    y = nnx.jit(lambda m, x, ln: m(x, ln))(layer_nnx, x, lengths)
    _check_attention(y, theirs(params), np.asarray(valid), dtype, f"nnx seed={seed}")


# Packed rows: Flax's layer with the segments' block-diagonal mask (and its causal mask and
# the window's band: positions within a sequence differ as the row's do).
PACKED_IDS = ["f32-xla", "bf16-kernels-gqa", "bf16-kernels-long-window-max_seqlen"]
PACKED_CASES = [
    # (dtype, D, heads, kv_heads, qkv_features, out_features, seq, window, max_seqlen)
    (jnp.float32, 24, 4, 2, 32, 16, 37, None, None),
    (jnp.bfloat16, 128, 4, 2, 256, 96, 45, None, None),
    (jnp.bfloat16, 64, 2, 2, 128, 64, 300, (40, 7), 150),
]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("dtype,d,heads,kv_heads,feats,out,seq,window,max_seqlen", PACKED_CASES, ids=PACKED_IDS)
def test_varlen_self_attention_packed_rows(platform, dtype, d, heads, kv_heads, feats, out, seq, window,
                                           max_seqlen, causal):
    from pit_jax.flax import VarlenSelfAttention

    rng, seed = fresh_rng()
    # three rows: sequences of random lengths with a gap before the first and a tail;
    # one row of a single sequence; one with none (cu all equal)
    cuts = np.sort(rng.integers(1, seq, size=3))
    cu = np.array([[cuts[0] // 2, *cuts], [0, seq, seq, seq], [5, 5, 5, 5]], np.int32)
    x = jnp.asarray(rng.standard_normal((3, seq, d)).astype(np.float32), dtype)
    valid, segment, _ = ref.packed_tokens(jnp.asarray(cu), seq, max_seqlen or seq)
    x, cu_d, valid = (put(platform, a) for a in (x, jnp.asarray(cu), valid))
    group = heads // kv_heads
    layer = VarlenSelfAttention(num_heads=heads, num_kv_heads=kv_heads, qkv_features=feats, out_features=out,
                                dtype=dtype, causal=causal, local_window_size=window)
    flax_layer = nn.MultiHeadDotProductAttention(num_heads=heads, qkv_features=feats, out_features=out, dtype=dtype)
    params = layer.init(jax.random.PRNGKey(seed % 1000), x, cu_seqlens=cu_d, max_seqlen=max_seqlen)
    params = jax.tree_util.tree_map_with_path(
        lambda path, a: jnp.asarray(rng.standard_normal(a.shape) * 0.1, a.dtype) if "bias" in jax.tree_util.keystr(
            path) else a, params)
    same = np.asarray(segment)[:, :, None] == np.asarray(segment)[:, None, :]
    mask = nn.combine_masks(nn.make_attention_mask(valid, valid), jnp.asarray(same)[:, None],
                            nn.make_causal_mask(valid) if causal else None, _band(seq, window, causal))

    ours = lambda p: layer.apply(p, x, cu_seqlens=cu_d, max_seqlen=max_seqlen)  # noqa: E731
    theirs = lambda p: flax_layer.apply(_repeat_kv(p, group), x, x, mask=mask)  # noqa: E731
    _check_attention(jax.jit(ours)(params), theirs(params), np.asarray(valid), dtype, f"seed={seed}")
    _check_attention_grads(ours, theirs, params, valid, dtype, f"seed={seed}")
    layer_nnx = _nnx_layer(params, heads, d, feats, out, dtype=dtype, causal=causal, num_kv_heads=kv_heads,
                           local_window_size=window)
    y = nnx.jit(lambda m, x, cu: m(x, cu_seqlens=cu, max_seqlen=max_seqlen))(layer_nnx, x, cu_d)
    _check_attention(y, theirs(params), np.asarray(valid), dtype, f"nnx seed={seed}")


def test_varlen_self_attention_packed_rows_without_sequences():
    """cu_seqlens [B, 1] (no sequence in any row): every token is padding, zeros out."""
    from pit_jax.flax import VarlenSelfAttention

    x, cu = jnp.ones((2, 8, 24)), jnp.zeros((2, 1), jnp.int32)
    layer = VarlenSelfAttention(num_heads=4)
    params = layer.init(jax.random.PRNGKey(0), x, cu_seqlens=cu)
    y = jax.jit(lambda p: layer.apply(p, x, cu_seqlens=cu))(params)
    assert y.shape == (2, 8, 24) and not np.asarray(y).any()


def test_varlen_self_attention_bad_configuration():
    from pit_jax.flax import VarlenSelfAttention

    x, lengths = jnp.ones((2, 8, 24)), jnp.array([3, 8])
    with pytest.raises(ValueError, match="num_heads \\(5\\) must divide qkv_features \\(24\\)"):
        VarlenSelfAttention(num_heads=5).init(jax.random.PRNGKey(0), x, lengths)
    with pytest.raises(ValueError, match="num_heads \\(5\\) must divide qkv_features \\(24\\)"):
        pit_nnx.VarlenSelfAttention(5, 24, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="lengths must be integers \\[batch\\] = \\[2\\]"):
        VarlenSelfAttention(num_heads=4).init(jax.random.PRNGKey(0), x, jnp.array([3, 8, 1]))
    with pytest.raises(ValueError, match="inputs must be \\[batch, seq, features\\]"):
        VarlenSelfAttention(num_heads=4).init(jax.random.PRNGKey(0), x[0], lengths)
    with pytest.raises(ValueError, match="dead_rows must be 'zeros' or 'unspecified'"):
        VarlenSelfAttention(num_heads=4, dead_rows="dense").init(jax.random.PRNGKey(0), x, lengths)
    with pytest.raises(ValueError, match="padding must be 'right' or 'left', got 'both'"):
        VarlenSelfAttention(num_heads=4, padding="both").init(jax.random.PRNGKey(0), x, lengths)
    cu = jnp.array([[0, 3, 8], [1, 2, 2]])
    with pytest.raises(ValueError, match="give lengths .* or cu_seqlens .*, exactly one; got both"):
        VarlenSelfAttention(num_heads=4).init(jax.random.PRNGKey(0), x, lengths, cu_seqlens=cu)
    with pytest.raises(ValueError, match="exactly one; got neither"):
        VarlenSelfAttention(num_heads=4).init(jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match="cu_seqlens must be integers \\[batch, n \\+ 1\\] = \\[2, n \\+ 1\\]"):
        VarlenSelfAttention(num_heads=4).init(jax.random.PRNGKey(0), x, cu_seqlens=cu[0])
    with pytest.raises(ValueError, match="packed rows \\(cu_seqlens\\) take no padding='left'"):
        VarlenSelfAttention(num_heads=4, padding="left").init(jax.random.PRNGKey(0), x, cu_seqlens=cu)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive int dividing num_heads \\(4\\), got 3"):
        VarlenSelfAttention(num_heads=4, num_kv_heads=3).init(jax.random.PRNGKey(0), x, lengths)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive int dividing num_heads \\(4\\), got 0"):
        pit_nnx.VarlenSelfAttention(4, 24, num_kv_heads=0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="local_window_size must be None, an int >= 0 or a pair"):
        VarlenSelfAttention(num_heads=4, local_window_size=(-1, 2)).init(jax.random.PRNGKey(0), x, lengths)
