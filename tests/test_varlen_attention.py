"""pit_jax.varlen_attention: attention over padded sequences (right or left padding,
bidirectional or causal) on their valid tokens, its gradients and transformations, against
float64 (the kernels and the CPU targets), and its XLA path where the kernels do not apply."""

from __future__ import annotations

import functools
import math

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from pit_testing import PLATFORMS, assert_call_raises, attention64, check_close, f64, fresh_rng, put, randn

import pit_jax
from pit_jax import reference as ref
from pit_jax.primitives.varlen_attention import varlen_attention_bwd_p, varlen_attention_p

pytestmark = pytest.mark.usefixtures("poison_outputs")

DTYPES = [jnp.bfloat16, jnp.float16]
HEAD_DIMS = [64, 80, 96, 128]  # what the kernels take
# (batch, seq, heads): seq a multiple of 16 or not, one to eight warps' rows, BERT b32's head.
SHAPES = [(3, 128, 2), (4, 37, 3), (2, 16, 1), (5, 100, 2), (2, 1, 1)]


def lengths_for(rng, b, s, kind):
    if kind == "random":
        ln = rng.integers(0, s + 1, size=b)
        ln[0] = s  # one full sequence
        if b > 1:
            ln[1] = 0  # one empty sequence
        return ln.astype(np.int32)
    return np.full((b,), {"empty": 0, "full": s}[kind], np.int32)


def reference64(q, k, v, lengths, dout, scale, causal=False, padding="right", window=None):
    """(out, lse, dq, dk, dv) in float64, per sequence and head, over the valid tokens
    (a sequence's first lengths[b], or its last with left padding; causal: keys j <= i; a
    window (left, right): keys i - left <= j <= i + right; the backward's delta from the
    output stored in q's dtype)."""
    out_dtype = np.asarray(q).dtype
    q, k, v, dout = (f64(a) for a in (q, k, v, dout))
    b_, s_, h_, _ = q.shape
    out, dq, dk, dv = (np.zeros_like(q) for _ in range(4))
    lse = np.zeros((b_, h_, s_))
    for b in range(b_):
        n = int(np.clip(lengths[b], 0, s_))
        if n == 0:
            continue
        t = slice(s_ - n, s_) if padding == "left" else slice(0, n)
        for h in range(h_):
            out[b, t, h], lse[b, h, t], dq[b, t, h], dk[b, t, h], dv[b, t, h] = attention64(
                q[b, t, h], k[b, t, h], v[b, t, h], dout[b, t, h], scale, causal, window, out_dtype)
    return out, lse, dq, dk, dv


def check_lse(got, want, what):
    """lse against float64: scores are sums of head_dim products of unit-size terms, so the
    float32 error is relative to max(1, |lse|), not to a small lse (one key of a short
    sequence) that cancellation left near 0."""
    got = f64(got)
    assert not np.isnan(got).any(), f"{what}: NaN (an element was not written)"
    err, scale = float(np.abs(got - want).max()), max(1.0, float(np.abs(want).max()))
    assert err <= 1e-5 * scale, f"{what}: max error {err:.3g} > 1e-05 * {scale:.3g}"


def check_all_results(platform, q, k, v, dout, lengths, dtype, causal, padding, seed, window=None):
    """The kernels' value, lse and gradients (one jitted vjp) against float64; every
    result's padding rows zeros. window: a local window (left, right)."""
    s, d = q.shape[1], q.shape[3]
    scale = 1 / math.sqrt(d)
    kw = dict(causal=causal, padding=padding, local_window_size=window)

    def f(q, k, v, lengths, dout):
        out, vjp = jax.vjp(lambda q, k, v: pit_jax.varlen_attention(q, k, v, lengths, **kw), q, k, v)
        return (out, *vjp(dout))

    args = put(platform, q, k, v, lengths, dout)
    jaxpr = str(jax.make_jaxpr(f)(*args))
    assert "pit_varlen_attention[" in jaxpr and "pit_varlen_attention_bwd[" in jaxpr
    got = jax.jit(f)(*args)
    want = reference64(q, k, v, lengths, dout, scale, causal, padding, window)
    valid = np.asarray(ref.valid_tokens(lengths, s, padding == "left"))
    what = f"seed={seed} lengths={lengths.tolist()} window={window}"
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, (want[0], *want[2:])):
        check_close(g, w, dtype, f"{what} {name}")
        assert not f64(g)[~valid].any(), f"{what}: {name}'s padding rows must be zeros"
    params = dict(scale=scale, causal=causal, left_padded=padding == "left")
    if window is not None:
        params.update(window_left=window[0], window_right=window[1])
    _, lse = jax.jit(lambda *a: varlen_attention_p.bind(*a, **params))(*args[:4])
    check_lse(lse, want[1], f"{what} lse")
    assert not np.asarray(lse).transpose(0, 2, 1)[~valid].any(), f"{what}: lse's padding rows must be 0"


def inputs(rng, b, s, h, dtype, d=64):
    return [randn(rng, (b, s, h, d), dtype) for _ in range(4)]  # q, k, v, dout


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("kind", ["random", "empty", "full"])
@pytest.mark.parametrize("b,s,h", SHAPES)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_value_and_gradients(platform, dtype, kind, b, s, h, d):
    rng, seed = fresh_rng()
    q, k, v, dout = inputs(rng, b, s, h, dtype, d)
    lengths = lengths_for(rng, b, s, kind)
    scale = 1 / math.sqrt(d)

    def f(q, k, v, lengths, dout):
        out, vjp = jax.vjp(lambda q, k, v: pit_jax.varlen_attention(q, k, v, lengths), q, k, v)
        return (out, *vjp(dout))

    args = put(platform, q, k, v, lengths, dout)
    jaxpr = str(jax.make_jaxpr(f)(*args))
    assert "pit_varlen_attention[" in jaxpr and "pit_varlen_attention_bwd[" in jaxpr
    got = jax.jit(f)(*args)
    want = reference64(q, k, v, lengths, dout, scale)
    valid = np.arange(s)[None, :] < lengths[:, None]
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, (want[0], *want[2:])):
        check_close(g, w, dtype, f"seed={seed} {name} lengths={lengths.tolist()}")
        assert not f64(g)[~valid].any(), f"seed={seed}: {name}'s padding rows must be zeros"


# (causal, padding) besides the default (False, "right"): a decoder's modes.
MODES = [(True, "right"), (False, "left"), (True, "left")]
MODE_IDS = ["causal-right", "bidirectional-left", "causal-left"]
# an encoder's mode and a decoder's (left-padded prompts), for tests of other features
ENCODER_AND_DECODER = pytest.mark.parametrize("causal,padding", [(False, "right"), (True, "left")],
                                              ids=["bidirectional-right", "causal-left"])


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("causal,padding", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("b,s,h", [(3, 128, 2), (4, 37, 3), (2, 1, 1), (6, 128, 1)])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_causal_and_left_padding(platform, dtype, causal, padding, b, s, h, d):
    """Value, lse and gradients; padding rows zeros. Causal skips the tiles past a warp's
    last query (forward, dQ) and before its first key (dK, dV): every length mod 16 and
    the full sequence come up in (6, 128)."""
    rng, seed = fresh_rng()
    q, k, v, dout = inputs(rng, b, s, h, dtype, d)
    lengths = lengths_for(rng, b, s, "random")
    if b == 6:
        lengths = np.array([128, 127, 113, 64, 17, 16], np.int32)
    check_all_results(platform, q, k, v, dout, lengths, dtype, causal, padding, seed)


# Longer than one CTA's 128 tokens: blocks of 128 walking 64-token chunks. Lengths on and
# around the block and chunk boundaries, empty and full, left to the draw past the fixed.
LONG_LENGTHS = {(5, 300, 2): [300, 0, 129, 128, 257], (3, 129, 1): [129, 128, 1], (2, 520, 1): [520, 447]}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("causal,padding", [(False, "right"), *MODES], ids=["bidirectional-right", *MODE_IDS])
@pytest.mark.parametrize("b,s,h", list(LONG_LENGTHS))
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_long_sequences(platform, dtype, causal, padding, b, s, h, d):
    """Sequences past 128 tokens (the long kernels: an online-softmax forward, the
    backward's dK / dV and dQ blocks): value, lse and gradients against float64, padding
    rows zeros."""
    rng, seed = fresh_rng()
    q, k, v, dout = inputs(rng, b, s, h, dtype, d)
    lengths = np.array(LONG_LENGTHS[(b, s, h)], np.int32)
    if b > 2:
        lengths[-1] = rng.integers(1, s + 1)  # one drawn
    check_all_results(platform, q, k, v, dout, lengths, dtype, causal, padding, seed)


@pytest.mark.parametrize("platform", PLATFORMS)
@ENCODER_AND_DECODER
def test_long_sequence_of_many_blocks(platform, causal, padding):
    """4096 tokens: 32 blocks a sequence, each walking up to 64 chunks (the grid's blocks
    numbered from its last), one sequence full and one ending mid-chunk."""
    rng, seed = fresh_rng()
    q, k, v, dout = inputs(rng, 2, 4096, 1, jnp.bfloat16)
    lengths = np.array([4096, int(rng.integers(2049, 4096))], np.int32)
    check_all_results(platform, q, k, v, dout, lengths, jnp.bfloat16, causal, padding, seed)


# (seq, (left, right)): windows narrower and wider than a 16-key tile, a 64-key chunk and
# a 128-token block, one side only, the token alone, around the short / long boundary.
WINDOWS = [(37, (5, 3)), (37, (0, 0)), (128, (20, 40)), (130, (16, 0)), (300, (64, 0)), (300, (100, 37)),
           (520, (130, 1)), (300, (0, 200))]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("s,window", WINDOWS, ids=[f"{s}-{w[0]}-{w[1]}" for s, w in WINDOWS])
@ENCODER_AND_DECODER
@pytest.mark.parametrize("d", [64, 128])
def test_local_window(platform, s, window, causal, padding, d):
    """Sliding-window attention (local_window_size, as jax.nn.dot_product_attention's):
    query i over keys i - left .. i + right of its sequence's valid tokens (causal: right
    0); value, lse and gradients against float64, the short and the long kernels."""
    rng, seed = fresh_rng()
    dtype = jnp.float16 if d == 128 else jnp.bfloat16
    q, k, v, dout = inputs(rng, 3, s, 2, dtype, d)
    lengths = np.array([s, rng.integers(1, s + 1), rng.integers(0, s + 1)], np.int32)
    check_all_results(platform, q, k, v, dout, lengths, dtype, causal, padding, seed, window)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("causal,window", [(True, (300, 0)), (False, (256, 256))], ids=["causal", "bidirectional"])
def test_local_window_long_and_grouped(platform, causal, window):
    """A window over 4096-token sequences (most key chunks skipped), and one with grouped
    kv heads, against float64 (the grouped gradients summed over each group)."""
    rng, seed = fresh_rng()
    q, k, v, dout = inputs(rng, 2, 4096, 1, jnp.bfloat16)
    lengths = np.array([4096, int(rng.integers(2049, 4096))], np.int32)
    check_all_results(platform, q, k, v, dout, lengths, jnp.bfloat16, causal, "right", seed, window)
    b, s, h, d = 2, 300, 4, 64
    q, dout = (randn(rng, (b, s, h, d), jnp.bfloat16) for _ in range(2))
    k, v = (randn(rng, (b, s, 2, d), jnp.bfloat16) for _ in range(2))
    lengths = np.array([300, 171], np.int32)
    kw = dict(causal=causal, padding="left", local_window_size=window[0] // 4)

    def f(q, k, v, lengths, dout):
        out, vjp = jax.vjp(lambda q, k, v: pit_jax.varlen_attention(q, k, v, lengths, **kw), q, k, v)
        return (out, *vjp(dout))

    got = jax.jit(f)(*put(platform, q, k, v, lengths, dout))
    rep = lambda a: np.repeat(f64(a), 2, axis=2)  # noqa: E731
    w = window[0] // 4
    want = reference64(q, rep(k), rep(v), lengths, dout, 1 / math.sqrt(d), causal, "left", (w, w))
    fold = lambda a: a.reshape(b, s, 2, 2, d).sum(3)  # noqa: E731
    for name, g, w_ in zip(("out", "dq", "dk", "dv"), got, (want[0], want[2], fold(want[3]), fold(want[4]))):
        check_close(g, w_, jnp.bfloat16, f"seed={seed} grouped {name}")


def _operand_heads(jaxpr, name):
    """The heads of k (operand 1) of every `name` equation in a closed jaxpr, nested ones too."""
    found = []

    def walk(jx):
        for eqn in jx.eqns:
            if eqn.primitive.name == name:
                found.append(eqn.invars[1].aval.shape[2])
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr.jaxpr)
    return found


def check_vmap_matches_slices(platform, attend, q, k, v, lengths, dout, lengths_mapped, seed):
    """vmap of `attend` and of its gradients over the leading axis of q, k, v, dout (and of
    lengths if `lengths_mapped`): bitwise the per-slice calls."""
    in_ln = 0 if lengths_mapped else None

    def loss(q, k, v, ln, do):
        return jnp.sum(attend(q, k, v, ln).astype(jnp.float32) * do.astype(jnp.float32))

    args = put(platform, q, k, v, lengths, dout)
    out = jax.jit(jax.vmap(attend, in_axes=(0, 0, 0, in_ln)))(*args[:4])
    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, 0, 0, in_ln, 0)))(*args)
    for i in range(q.shape[0]):
        ln = lengths[i] if lengths_mapped else lengths
        sl = put(platform, q[i], k[i], v[i], ln, dout[i])
        np.testing.assert_array_equal(np.asarray(out[i], np.float32),
                                      np.asarray(jax.jit(attend)(*sl[:4]), np.float32),
                                      err_msg=f"seed={seed} slice {i}")
        want = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*sl)
        for g, w in zip(grads, want):
            assert g.shape[1:] == w.shape
            np.testing.assert_array_equal(np.asarray(g[i], np.float32), np.asarray(w, np.float32),
                                          err_msg=f"seed={seed} slice {i}")


@pytest.mark.parametrize("platform", PLATFORMS)
@ENCODER_AND_DECODER
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("s,d,dtype", [(37, 64, jnp.bfloat16), (130, 80, jnp.float16), (300, 128, jnp.bfloat16)],
                         ids=["short", "long-f16", "long"])
def test_grouped_query_attention(platform, causal, padding, kv_heads, s, d, dtype):
    """k, v with fewer heads than q (dividing them): query head n reads kv head n // group,
    as jax.nn.dot_product_attention groups, the kernels reading the shared heads in place
    (no repeated copy reaches them); the values and the gradients of q and the shared k, v
    heads (summed over their groups by the kernels) against float64, through the op and
    the raw targets."""
    rng, seed = fresh_rng()
    b, h = 3, 4
    q, dout = (randn(rng, (b, s, h, d), dtype) for _ in range(2))
    k, v = (randn(rng, (b, s, kv_heads, d), dtype) for _ in range(2))
    lengths = lengths_for(rng, b, s, "random")
    kw = dict(causal=causal, padding=padding)

    def f(q, k, v, lengths, dout):
        out, vjp = jax.vjp(lambda q, k, v: pit_jax.varlen_attention(q, k, v, lengths, **kw), q, k, v)
        return (out, *vjp(dout))

    args = put(platform, q, k, v, lengths, dout)
    jaxpr = jax.make_jaxpr(f)(*args)
    assert _operand_heads(jaxpr, "pit_varlen_attention") == [kv_heads], jaxpr
    assert _operand_heads(jaxpr, "pit_varlen_attention_bwd") == [kv_heads], jaxpr
    out, dq, dk, dv = jax.jit(f)(*args)
    group = h // kv_heads
    rep = lambda a: np.repeat(f64(a), group, axis=2)  # noqa: E731
    scale = 1 / math.sqrt(d)
    want = reference64(q, rep(k), rep(v), lengths, dout, scale, **kw)
    fold = lambda a: a.reshape(b, s, kv_heads, group, d).sum(3)  # noqa: E731
    valid = np.asarray(ref.valid_tokens(lengths, s, padding == "left"))
    what = f"seed={seed} kv_heads={kv_heads} lengths={lengths.tolist()}"
    for name, g, w in (("out", out, want[0]), ("dq", dq, want[2]), ("dk", dk, fold(want[3])),
                       ("dv", dv, fold(want[4]))):
        check_close(g, w, dtype, f"{what} {name}")
        assert not f64(g)[~valid].any(), f"{what}: {name}'s padding rows must be zeros"

    params = dict(scale=scale, causal=causal, left_padded=padding == "left")

    def raw(q, k, v, lengths, dout):
        o, lse = varlen_attention_p.bind(q, k, v, lengths, **params)
        return varlen_attention_bwd_p.bind(q, k, v, o, lse, dout, lengths, **params)

    got = jax.jit(raw)(*args)
    assert [tuple(g.shape) for g in got] == [q.shape, k.shape, v.shape]
    for name, g, w in zip(("dq", "dk", "dv"), got, (want[2], fold(want[3]), fold(want[4]))):
        check_close(g, w, dtype, f"{what} the backward target's {name}")
        assert not f64(g)[~valid].any(), f"{what}: the target's {name}'s padding rows must be zeros"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_grouped_query_transformations(platform):
    """Grouped k, v under vmap (bitwise the per-slice calls, values and gradients), forward
    mode (the tangents of the shared heads) and a Hessian-vector product, against the jnp
    reference."""
    rng, seed = fresh_rng()
    q, dout = (randn(rng, (2, 3, 40, 4, 64), jnp.bfloat16) for _ in range(2))
    k, v, dk, dv = (randn(rng, (2, 3, 40, 2, 64), jnp.bfloat16) for _ in range(4))
    lengths = np.array([40, 0, 17], np.int32)
    attend = functools.partial(pit_jax.varlen_attention, causal=True)
    check_vmap_matches_slices(platform, attend, q, k, v, lengths, dout, False, seed)

    q0, k0, v0, dq0, dk0, dv0 = (put(platform, a[0]) for a in (q, k, v, dout, dk, dv))
    ln = put(platform, lengths)
    f = lambda q, k, v: attend(q, k, v, ln)  # noqa: E731
    out_, tan = jax.jit(lambda *a: jax.jvp(f, a[:3], a[3:]))(q0, k0, v0, dq0, dk0, dv0)
    r = _f32_reference(jnp.asarray(lengths), causal=True)
    want_out, want_tan = jax.jvp(r, _f32(q[0], k[0], v[0]), _f32(dout[0], dk[0], dv[0]))
    check_close(out_, f64(want_out), jnp.bfloat16, f"seed={seed} out")
    check_close(tan, f64(want_tan), jnp.bfloat16, f"seed={seed} tangent")

    sq = lambda q, k, v: jnp.sum(attend(q, k, v, ln).astype(jnp.float32) ** 2)  # noqa: E731
    hvp = jax.jit(lambda *a: jax.jvp(lambda k: jax.grad(sq, argnums=1)(a[0], k, a[2]), (a[1],), (a[3],))[1])(
        q0, k0, v0, dk0)
    rs = lambda k: jax.grad(lambda k: jnp.sum(r(*_f32(q[0]), k, *_f32(v[0])) ** 2))(k)  # noqa: E731
    want = jax.jvp(rs, _f32(k[0]), _f32(dk[0]))[1]
    check_close(hvp, f64(want), jnp.bfloat16, f"seed={seed} jvp of grad (k)")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("shape", [(0, 8, 2, 64), (2, 0, 2, 64), (2, 8, 0, 64), (2, 200, 0, 64)])
def test_zero_sized_dims(platform, shape):
    """No batch, no tokens or no heads: empty results and gradients of q's and k's shapes."""
    q = jnp.ones(shape, jnp.bfloat16)
    ln = jnp.full((shape[0],), 3, jnp.int32)

    def f(q, k, v, ln):
        out, vjp = jax.vjp(lambda q, k, v: pit_jax.varlen_attention(q, k, v, ln, causal=True), q, k, v)
        return (out, *vjp(out))

    args = put(platform, q, q, q, ln)
    assert "pit_varlen_attention_bwd[" in str(jax.make_jaxpr(f)(*args))
    for r in jax.jit(f)(*args):
        assert r.shape == shape


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_log_sum_exp(platform, dtype):
    """The forward's second result, which the backward reads: each valid query's
    log-sum-exp of its scaled scores (float32), 0 on padding rows."""
    rng, seed = fresh_rng()
    q, k, v, dout = inputs(rng, 4, 77, 3, dtype)
    lengths = lengths_for(rng, 4, 77, "random")
    out, lse = jax.jit(lambda *a: varlen_attention_p.bind(*a, scale=0.3))(*put(platform, q, k, v, lengths))
    want = reference64(q, k, v, lengths, dout, 0.3)
    check_close(out, want[0], dtype, f"seed={seed} out")
    check_lse(lse, want[1], f"seed={seed} lse")
    valid = np.arange(77)[None, :] < lengths[:, None]
    assert not np.asarray(lse).transpose(0, 2, 1)[~valid].any(), f"seed={seed}: lse's padding rows must be 0"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_gradient_through_log_sum_exp(platform):
    """The forward primitive's lse is differentiable too (a caller of the primitive that
    reads it): out's cotangent goes through the backward kernel, lse's through the jnp
    expression, and the two add."""
    rng, seed = fresh_rng()
    q, k, v, c = inputs(rng, 3, 30, 2, jnp.bfloat16)
    lengths = np.array([30, 0, 9], np.int32)
    w = rng.standard_normal((3, 2, 30)).astype(np.float32)

    def loss(q, k, v, ln, c, w, prim=True):
        out, lse = (varlen_attention_p.bind(q, k, v, ln, scale=0.2) if prim
                    else ref.varlen_attention(q, k, v, ln, scale=0.2))
        return jnp.sum(out.astype(jnp.float32) * c.astype(jnp.float32)) + jnp.sum(lse * w)

    args = put(platform, q, k, v, lengths, c, w)
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)
    f32 = _f32(q, k, v)
    want = jax.grad(lambda *a: loss(*a, jnp.asarray(lengths), *_f32(c), jnp.asarray(w), prim=False),
                    argnums=(0, 1, 2))(*f32)
    for name, g, r in zip("qkv", got, want):
        check_close(g, f64(r), jnp.bfloat16, f"seed={seed} d{name}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_lengths_out_of_range_are_clamped(platform):
    rng, seed = fresh_rng()
    q, k, v, dout = inputs(rng, 3, 20, 2, jnp.bfloat16)
    got = jax.jit(pit_jax.varlen_attention)(*put(platform, q, k, v, np.array([-5, 20, 99], np.int32)))
    want = jax.jit(pit_jax.varlen_attention)(*put(platform, q, k, v, np.array([0, 20, 20], np.int32)))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32), err_msg=f"seed={seed}")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("lengths_mapped,causal,padding", [(True, False, "right"), (False, False, "right"),
                                                            (True, True, "left")])
def test_vmap_and_vmap_of_grad(platform, lengths_mapped, causal, padding):
    """vmap folds the mapped axis into the batch: bitwise the per-slice calls."""
    rng, seed = fresh_rng()
    q, k, v, dout = (randn(rng, (3, 4, 24, 2, 64), jnp.bfloat16) for _ in range(4))
    lengths = rng.integers(0, 25, size=(3, 4) if lengths_mapped else (4,)).astype(np.int32)
    attend = functools.partial(pit_jax.varlen_attention, causal=causal, padding=padding)
    check_vmap_matches_slices(platform, attend, q, k, v, lengths, dout, lengths_mapped, seed)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype,s,d", [(jnp.float32, 40, 64), (jnp.bfloat16, 40, 32), (jnp.float16, 200, 48)])
@ENCODER_AND_DECODER
def test_shapes_the_kernels_do_not_take_run_in_xla(platform, dtype, s, d, causal, padding):
    """float32, other head dims: the masked softmax in XLA, same contract."""
    rng, seed = fresh_rng()
    q, k, v, dout = inputs(rng, 3, s, 2, dtype, d)
    lengths = lengths_for(rng, 3, s, "random")
    kw = dict(causal=causal, padding=padding)
    f = lambda q, k, v, ln, do: jax.vjp(lambda *a: pit_jax.varlen_attention(*a, ln, **kw), q, k, v)  # noqa: E731
    args = put(platform, q, k, v, lengths, dout)
    assert "pit_varlen_attention" not in str(jax.make_jaxpr(lambda *a: pit_jax.varlen_attention(*a))(*args[:4]))
    out, vjp = jax.jit(f)(*args)
    want = reference64(q, k, v, lengths, dout, 1 / math.sqrt(d), **kw)
    check_close(out, want[0], dtype, f"seed={seed} out")
    for name, g, w in zip(("dq", "dk", "dv"), vjp(args[4]), want[2:]):
        check_close(g, w, dtype, f"seed={seed} {name}")


def test_sequences_past_the_kernels_limit_run_in_xla():
    """Past MAX_SEQ (65536 tokens) the op traces the XLA path (abstract shapes: nothing
    allocated); at it, the kernels."""
    from pit_jax.primitives.varlen_attention import MAX_SEQ

    for s, kernels in ((MAX_SEQ, True), (MAX_SEQ + 1, False)):
        q = jax.ShapeDtypeStruct((1, s, 1, 64), jnp.bfloat16)
        ln = jax.ShapeDtypeStruct((1,), jnp.int32)
        assert ("pit_varlen_attention[" in str(jax.make_jaxpr(pit_jax.varlen_attention)(q, q, q, ln))) == kernels


def test_reference_switch():
    q = jnp.ones((2, 8, 1, 64), jnp.bfloat16)
    ln = jnp.array([3, 8], jnp.int32)
    assert "pit_varlen_attention" in str(jax.make_jaxpr(pit_jax.varlen_attention)(q, q, q, ln))
    with pit_jax.use_reference(ops=("varlen_attention",)):  # a new function: traced anew
        jaxpr = str(jax.make_jaxpr(lambda *a: pit_jax.varlen_attention(*a))(q, q, q, ln))
    assert "pit_varlen_attention" not in jaxpr


@pytest.mark.parametrize("platform", PLATFORMS)
def test_jitted_training_step(platform):
    """A jitted optax step through attention (q, k, v from one projection), loss going down."""
    rng, seed = fresh_rng()
    b, s, h, d = 4, 32, 2, 64
    x = put(platform, randn(rng, (b, s, h * d), jnp.bfloat16))
    target = put(platform, randn(rng, (b, s, h * d), jnp.bfloat16))
    lengths = put(platform, np.array([32, 17, 1, 9], np.int32))
    valid = (jnp.arange(s)[None, :] < lengths[:, None])[..., None]
    params = {"w": put(platform, (0.05 * rng.standard_normal((h * d, 3 * h * d))).astype(np.float32))}
    tx = optax.adam(1e-2)

    def loss(p):
        qkv = (x @ p["w"].astype(jnp.bfloat16)).reshape(b, s, 3, h, d)
        out = pit_jax.varlen_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], lengths).reshape(b, s, h * d)
        return jnp.sum(jnp.where(valid, (out.astype(jnp.float32) - target) ** 2, 0.0)) / jnp.sum(valid)

    @jax.jit
    def step(p, st):
        val, g = jax.value_and_grad(loss)(p)
        u, st = tx.update(g, st, p)
        return optax.apply_updates(p, u), st, val

    assert "pit_varlen_attention_bwd" in str(jax.make_jaxpr(jax.grad(loss))(params))
    st = tx.init(params)
    losses = []
    for _ in range(15):
        params, st, val = step(params, st)
        losses.append(float(val))
    assert np.isfinite(losses).all() and losses[-1] < 0.9 * losses[0], f"seed={seed}: {losses}"


def test_remat():
    """jax.checkpoint recomputes the forward in the backward: the same gradient."""
    rng, seed = fresh_rng()
    q, k, v, _ = (jnp.asarray(a) for a in inputs(rng, 2, 24, 2, jnp.bfloat16))
    ln = jnp.array([24, 7], jnp.int32)
    loss = lambda q: jnp.sum(pit_jax.varlen_attention(q, k, v, ln).astype(jnp.float32) ** 2)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(jax.checkpoint(loss)))(q), np.float32),
                                  np.asarray(jax.jit(jax.grad(loss))(q), np.float32), err_msg=f"seed={seed}")


def test_checkpoint_policies_save_attention():
    """Under jax.checkpoint the attention's forward is recomputed in the backward unless a
    policy saves it: pit_jax.checkpoint_policies count it among the products."""
    from pit_jax import checkpoint_policies as cp

    rng, seed = fresh_rng()
    q, k, v, _ = (jnp.asarray(a) for a in inputs(rng, 2, 24, 2, jnp.bfloat16))
    ln = jnp.array([24, 7], jnp.int32)
    loss = lambda q: jnp.sum(jnp.tanh(pit_jax.varlen_attention(q, k, v, ln).astype(jnp.float32)))  # noqa: E731
    want = np.asarray(jax.jit(jax.grad(loss))(q), np.float32)
    for policy, calls in [(None, 2), (jax.checkpoint_policies.dots_saveable, 2), (cp.products_saveable, 1),
                          (cp.plus_pit(jax.checkpoint_policies.nothing_saveable), 1)]:
        f = jax.grad(jax.checkpoint(loss, policy=policy))
        assert str(jax.make_jaxpr(f)(q)).count("pit_varlen_attention[") == calls, f"policy {policy}"
        np.testing.assert_array_equal(np.asarray(jax.jit(f)(q), np.float32), want, err_msg=f"seed={seed} {policy}")


def _f32_reference(lengths, scale=1 / 8, **mode):
    """The jnp reference on float32 copies of q, k, v (the forward-mode oracle)."""
    def f(q, k, v):
        return ref.varlen_attention(*(a.astype(jnp.float32) for a in (q, k, v)), lengths, scale=scale, **mode)[0]
    return f


def _f32(*arrays):
    return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("b,s,h", [(3, 37, 2), (2, 128, 1)])
@ENCODER_AND_DECODER
def test_forward_mode(platform, dtype, b, s, h, causal, padding):
    """jax.jvp: the kernels' forward and the tangent of the jnp expression; padding rows'
    tangents are zero. jacfwd equals jacrev."""
    rng, seed = fresh_rng()
    q, k, v, dq = inputs(rng, b, s, h, dtype)
    dk, dv = (randn(rng, q.shape, dtype) for _ in range(2))
    lengths = lengths_for(rng, b, s, "random")
    f = lambda q, k, v, ln: pit_jax.varlen_attention(q, k, v, ln, causal=causal, padding=padding)  # noqa: E731
    args = put(platform, q, k, v, lengths, dq, dk, dv)
    jaxpr = str(jax.make_jaxpr(lambda *a: jax.jvp(lambda q, k, v: f(q, k, v, a[3]), a[:3], a[4:]))(*args))
    assert "pit_varlen_attention[" in jaxpr and "pit_varlen_attention_tangent[" in jaxpr
    out, tan = jax.jit(lambda *a: jax.jvp(lambda q, k, v: f(q, k, v, a[3]), a[:3], a[4:]))(*args)
    r = _f32_reference(jnp.asarray(lengths), causal=causal, left_padded=padding == "left")
    want_out, want_tan = jax.jvp(r, _f32(q, k, v), _f32(dq, dk, dv))
    check_close(out, f64(want_out), dtype, f"seed={seed} out")
    check_close(tan, f64(want_tan), dtype, f"seed={seed} tangent")
    valid = np.asarray(ref.valid_tokens(lengths, s, padding == "left"))
    assert not f64(tan)[~valid].any(), f"seed={seed}: the padding rows' tangents must be zeros"

    qs, ks, vs = (a[:1, :9, :1] for a in args[:3])
    ln = put(platform, np.array([6], np.int32))
    g = lambda q: f(q, ks, vs, ln).astype(jnp.float32)  # noqa: E731
    jf, jr = jax.jit(jax.jacfwd(g))(qs), jax.jit(jax.jacrev(g))(qs)
    check_close(jf, f64(jr), dtype, f"seed={seed} jacfwd against jacrev")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_second_order(platform):
    """Hessian-vector products both ways (jvp of grad, grad of jvp) against the jnp
    reference's, and vmap of jvp slice by slice."""
    rng, seed = fresh_rng()
    q, k, v, t = inputs(rng, 3, 40, 2, jnp.bfloat16)
    lengths = np.array([40, 0, 13], np.int32)
    args = put(platform, q, k, v, lengths, t)
    r = _f32_reference(jnp.asarray(lengths))
    kf, vf, tf = _f32(k, v, t)

    def loss(q, k, v, ln):
        return jnp.sum(pit_jax.varlen_attention(q, k, v, ln).astype(jnp.float32) ** 2)

    hvp = jax.jit(lambda q, k, v, ln, t: jax.jvp(lambda q: jax.grad(loss)(q, k, v, ln), (q,), (t,))[1])(*args)
    want = jax.jvp(jax.grad(lambda q: jnp.sum(r(q, kf, vf) ** 2)), _f32(q), (tf,))[1]
    check_close(hvp, f64(want), jnp.bfloat16, f"seed={seed} jvp of grad")

    def tangent_norm(q, k, v, ln, t):
        return jnp.sum(jax.jvp(lambda q: pit_jax.varlen_attention(q, k, v, ln), (q,), (t,))[1].astype(jnp.float32) ** 2)

    rof = jax.jit(jax.grad(tangent_norm))(*args)
    want = jax.grad(lambda q: jnp.sum(jax.jvp(lambda q: r(q, kf, vf), (q,), (tf,))[1] ** 2))(*_f32(q))
    check_close(rof, f64(want), jnp.bfloat16, f"seed={seed} grad of jvp")

    qb, tb = (put(platform, np.stack([a, a[::-1]])) for a in (q, t))
    jv = lambda q, t: jax.jvp(lambda q: pit_jax.varlen_attention(q, args[1], args[2], args[3]), (q,), (t,))[1]  # noqa: E731
    mapped = jax.jit(jax.vmap(jv))(qb, tb)
    for i in range(2):
        # The tangent is XLA's einsums: on a GPU the batched and the single call may take
        # different GEMM algorithms (one bf16 ulp apart, H200), so not bitwise.
        check_close(mapped[i], f64(jax.jit(jv)(qb[i], tb[i])), jnp.bfloat16, f"seed={seed} slice {i}")


def test_bad_input_is_a_clear_error():
    q = jnp.ones((2, 8, 1, 64), jnp.bfloat16)
    ln = jnp.array([3, 8], jnp.int32)
    with pytest.raises(ValueError, match="q must be \\[batch, seq, heads, head_dim\\]"):
        pit_jax.varlen_attention(q[0], q[0], q[0], ln)
    with pytest.raises(ValueError, match="k and v must have q's shape .* got k \\(2, 4, 1, 64\\)"):
        pit_jax.varlen_attention(q, q[:, :4], q, ln)
    with pytest.raises(ValueError, match="k and v must have q's shape .* and q's dtype bfloat16; got v .* float16"):
        pit_jax.varlen_attention(q, q, q.astype(jnp.float16), ln)
    q4 = jnp.ones((2, 8, 4, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="kv_heads dividing its 4 heads .* got k \\(2, 8, 3, 64\\)"):
        pit_jax.varlen_attention(q4, q4[:, :, :3], q4[:, :, :3], ln)
    with pytest.raises(ValueError, match="one shape for both.* got v \\(2, 8, 1, 64\\)"):
        pit_jax.varlen_attention(q4, q4[:, :, :2], q4[:, :, :1], ln)
    with pytest.raises(ValueError, match="lengths must be integers \\[batch\\] = \\[2\\]"):
        pit_jax.varlen_attention(q, q, q, jnp.array([3, 8, 1], jnp.int32))
    with pytest.raises(ValueError, match="lengths must be integers"):
        pit_jax.varlen_attention(q, q, q, jnp.array([3.0, 8.0]))
    with pytest.raises(TypeError, match="q must be a float array"):
        pit_jax.varlen_attention(*(jnp.ones((2, 8, 1, 64), jnp.int32),) * 3, ln)
    with pytest.raises(ValueError, match="padding must be one of \\('right', 'left'\\), got 'middle'"):
        pit_jax.varlen_attention(q, q, q, ln, padding="middle")
    with pytest.raises(TypeError, match="causal must be a Python bool, got Array"):
        pit_jax.varlen_attention(q, q, q, ln, causal=jnp.array(True))
    for bad in (-1, (1,), (1, -2), (1.5, 2), "3", True, (2, None)):
        with pytest.raises(ValueError, match="local_window_size must be None, an int >= 0 or a pair"):
            pit_jax.varlen_attention(q, q, q, ln, local_window_size=bad)
    with pytest.raises(TypeError, match="varlen_attention: scale must be None or a static number .* got 'a'"):
        pit_jax.varlen_attention(q, q, q, ln, scale="a")
    with pytest.raises(TypeError, match="varlen_attention: scale must be None or a static number"):
        jax.jit(lambda s: pit_jax.varlen_attention(q, q, q, ln, scale=s))(0.5)
    with pytest.raises(TypeError, match="packed_attention: scale must be None or a static number"):
        pit_jax.packed_attention(q[:1], q[:1], q[:1], jnp.array([[0, 3, 8]], jnp.int32), scale=[1.0])
    with pytest.raises(ValueError, match="the kernels take bfloat16 or float16"):
        varlen_attention_p.bind(q.astype(jnp.float32), q.astype(jnp.float32), q.astype(jnp.float32), ln, scale=1.0)


_B = lambda *s: jnp.ones(s, jnp.bfloat16)  # noqa: E731
_L = jnp.zeros((2,), jnp.int32)
_NO_ORDER = jnp.zeros((0,), jnp.int32)  # the launch order operand, empty: grid order


def _raw_fwd(q, k, v, lengths, out_shape=(2, 8, 1, 64), lse_shape=(2, 1, 8), window=(-1, -1), order=_NO_ORDER):
    return jax.ffi.ffi_call("pit_varlen_attention", (jax.ShapeDtypeStruct(out_shape, q.dtype),
                                                     jax.ShapeDtypeStruct(lse_shape, jnp.float32)))(
        q, k, v, lengths, order, scale=np.float32(0.125), causal=False, left_padded=False,
        window_left=np.int64(window[0]), window_right=np.int64(window[1]), max_seqlen=np.int64(0))


def _raw_bwd(lse):
    q = _B(2, 8, 1, 64)
    out = jax.ShapeDtypeStruct(q.shape, q.dtype)
    return jax.ffi.ffi_call("pit_varlen_attention_bwd", (out, out, out))(q, q, q, q, lse, q, _L, _NO_ORDER,
                                                                          scale=np.float32(0.125), causal=False,
                                                                          left_padded=False, window_left=np.int64(-1),
                                                                          window_right=np.int64(-1),
                                                                          max_seqlen=np.int64(0))


RAW_BAD = {
    ("pit_varlen_attention", "head_dim .* must be 64"): lambda: _raw_fwd(_B(2, 8, 1, 32), _B(2, 8, 1, 32),
                                                                         _B(2, 8, 1, 32), _L, (2, 8, 1, 32)),
    ("pit_varlen_attention", "seq .* must be at most 65536"): lambda: _raw_fwd(
        *(_B(2, 65537, 1, 64),) * 3, _L, (2, 65537, 1, 64), (2, 1, 65537)),
    ("pit_varlen_attention", "q must be bfloat16 or float16"): lambda: _raw_fwd(*(jnp.ones((2, 8, 1, 64)),) * 3, _L),
    ("pit_varlen_attention", "k must have q's shape"): lambda: _raw_fwd(_B(2, 8, 1, 64), _B(2, 7, 1, 64),
                                                                        _B(2, 8, 1, 64), _L),
    ("pit_varlen_attention", "k must have q's shape .* kv_heads dividing its heads"): lambda: _raw_fwd(
        _B(2, 8, 4, 64), _B(2, 8, 3, 64), _B(2, 8, 3, 64), _L, (2, 8, 4, 64), (2, 4, 8)),
    ("pit_varlen_attention", "v must have q's shape .* v k's shape"): lambda: _raw_fwd(
        _B(2, 8, 4, 64), _B(2, 8, 2, 64), _B(2, 8, 1, 64), _L, (2, 8, 4, 64), (2, 4, 8)),
    ("pit_varlen_attention", "lengths must be int32 \\[batch\\]"): lambda: _raw_fwd(
        _B(2, 8, 1, 64), _B(2, 8, 1, 64), _B(2, 8, 1, 64), jnp.zeros((3,), jnp.int32)),
    ("pit_varlen_attention", "lse .* must be float32 \\[batch, heads, seq\\]"): lambda: _raw_fwd(
        _B(2, 8, 1, 64), _B(2, 8, 1, 64), _B(2, 8, 1, 64), _L, lse_shape=(2, 8, 1)),
    ("pit_varlen_attention", "window_left and window_right must be >= 0 \\(or -1"): lambda: _raw_fwd(
        _B(2, 8, 1, 64), _B(2, 8, 1, 64), _B(2, 8, 1, 64), _L, window=(3, -2)),
    ("pit_varlen_attention", "order must be int32 \\[2\\] \\(the sequences\\) or \\[0\\]"): lambda: _raw_fwd(
        _B(2, 8, 1, 64), _B(2, 8, 1, 64), _B(2, 8, 1, 64), _L, order=jnp.zeros((3,), jnp.int32)),
    ("pit_varlen_attention_bwd", "lse must be float32"): lambda: _raw_bwd(jnp.zeros((2, 8), jnp.float32)),
}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case_", list(RAW_BAD), ids=lambda c: c[1][:30])
def test_raw_targets_refuse_bad_input(platform, case_):
    assert_call_raises(platform, case_[0] + ": .*" + case_[1], RAW_BAD[case_])


def test_launch_order():
    """The CUDA lowering's order operand: the sequences longest first (ties in index order,
    lengths clamped as the kernels clamp them) where the long kernels run bidirectionally;
    empty where causal or short (one CTA a sequence) but for the grouped backward."""
    from pit_jax.primitives.varlen_attention import launch_order

    q, k1 = jnp.zeros((4, 300, 4, 64)), jnp.zeros((4, 300, 1, 64))
    ln = jnp.array([5, 400, -3, 200], jnp.int32)
    assert launch_order(q, q, ln, False).tolist() == [1, 3, 0, 2]
    assert launch_order(q, q, ln, True, causal=True).shape == (0,)
    short = jnp.zeros((4, 128, 4, 64))
    assert launch_order(short, short, ln, False).shape == (0,)
    assert launch_order(short, k1[:, :128], ln, True).tolist() == [1, 3, 0, 2]  # grouped: the long backward
    # packed rows: row-major sequences, each clamped to its row and to max_seqlen
    cu = jnp.array([[0, 100, 300, 300], [-5, 150, 160, 400]], jnp.int32)
    qp = jnp.zeros((2, 300, 4, 64))
    assert launch_order(qp, qp, cu, False, max_seqlen=180).tolist() == [1, 3, 5, 0, 4, 2]


@pytest.mark.skipif("gpu" not in PLATFORMS, reason="no GPU visible to JAX")
@pytest.mark.parametrize("backward", [False, True])
def test_launch_order_changes_no_result_gpu(backward):
    """The long kernels with any launch order give grid order's bits: a random permutation
    of the sequences, the lengths' own order, and none."""
    rng, _ = fresh_rng()
    b, s, h, d = 5, 300, 2, 64
    q, k, v, dout = (jnp.asarray(randn(rng, (b, s, h, d), jnp.bfloat16)) for _ in range(4))
    ln = jnp.asarray(rng.integers(0, s + 1, size=b), jnp.int32)
    attrs = dict(scale=np.float32(d ** -0.5), causal=False, left_padded=False, window_left=np.int64(-1),
                 window_right=np.int64(-1), max_seqlen=np.int64(0))
    shapes = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, s), jnp.float32))

    def call(order):
        out, lse = jax.ffi.ffi_call("pit_varlen_attention", shapes)(q, k, v, ln, order, **attrs)
        if not backward:
            return out, lse
        return jax.ffi.ffi_call("pit_varlen_attention_bwd", (shapes[0],) * 3)(q, k, v, out, lse, dout, ln, order,
                                                                            **attrs)

    with jax.default_device(jax.devices("gpu")[0]):
        base = jax.jit(call)(jnp.zeros((0,), jnp.int32))
        for order in (rng.permutation(b), np.argsort(-np.asarray(ln), kind="stable")):
            got = jax.jit(call)(jnp.asarray(order, jnp.int32))
            for g, r in zip(got, base):
                np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(r, np.float32))


@pytest.mark.skipif("gpu" not in PLATFORMS, reason="no GPU visible to JAX")
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("b,s,h,d,causal", [(32, 100, 8, 64, True), (40, 128, 4, 64, False),
                                            (128, 77, 2, 128, True), (100, 128, 2, 80, False),
                                            (129, 100, 2, 64, False)])
def test_short_kernels_longest_first_changes_no_result_gpu(packed, b, s, h, d, causal):
    """The short kernels rank the sequences by length on the device and run them longest
    first when their CTAs fill more than one and at most four an SM (2-128 sequences: up to
    32 by one ballot each, past 32 by a radix select; 129: grid order, as head_dim 80's
    forward): every sequence's results are the bits it gets alone (one sequence a call:
    grid order). Lengths with many ties, empty and full ones; packed: the same sequences
    two a row. A sequence ranked twice would leave another unwritten (its outputs
    poisoned)."""
    rng, seed = fresh_rng()
    lengths = rng.choice(np.array([0, 1, 16, 17, 33, 64, s - 1, s], np.int32), size=b)
    lengths[:2] = (s, 0)
    q, k, v, dout = (randn(rng, (b, s, h, d), jnp.bfloat16) for _ in range(4))

    def padded(q, k, v, ln, do):
        out, vjp = jax.vjp(lambda q, k, v: pit_jax.varlen_attention(q, k, v, ln, causal=causal), q, k, v)
        return (out, *vjp(do))

    with jax.default_device(jax.devices("gpu")[0]):
        alone = jax.jit(padded)
        want = [np.stack([np.asarray(alone(q[i:i + 1], k[i:i + 1], v[i:i + 1], lengths[i:i + 1], dout[i:i + 1])[j][0],
                                     np.float32) for i in range(b)]) for j in range(4)]
        if not packed:
            got = [np.asarray(g, np.float32) for g in jax.jit(padded)(q, k, v, lengths, dout)]
        else:  # two sequences a row, one after the other, then padding up to 2 s tokens
            rows = -(-b // 2)
            ln = np.concatenate([lengths, np.zeros(2 * rows - b, np.int32)]).reshape(rows, 2)
            cu = np.concatenate([np.zeros((rows, 1), np.int32), np.cumsum(ln, 1, dtype=np.int32)], 1)
            spans = [(i // 2, int(cu[i // 2, i % 2]), int(lengths[i])) for i in range(b)]

            def pack(a):
                out = np.zeros((rows, 2 * s, *a.shape[2:]), a.dtype)
                for i, (r, o, n) in enumerate(spans):
                    out[r, o:o + n] = a[i, :n]
                return out

            def packed_call(q, k, v, cu, do):
                out, vjp = jax.vjp(lambda q, k, v: pit_jax.packed_attention(
                    q, k, v, cu, max_seqlen=s, causal=causal), q, k, v)
                return (out, *vjp(do))

            got = []
            for g in jax.jit(packed_call)(*(pack(a) for a in (q, k, v)), cu, pack(dout)):
                g, one = np.array(g, np.float32), np.zeros((b, s, h, d), np.float32)
                for i, (r, o, n) in enumerate(spans):
                    one[i, :n] = g[r, o:o + n]
                    g[r, o:o + n] = 0
                assert not g.any(), f"seed={seed}: the packed rows' padding tokens must be zeros"
                got.append(one)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_array_equal(g, w, err_msg=f"seed={seed} {name} lengths={lengths.tolist()}")


def test_primitives_are_registered():
    assert varlen_attention_p.multiple_results and varlen_attention_bwd_p.multiple_results
