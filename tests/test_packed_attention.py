"""pit_jax.packed_attention: sequences packed one after another into rows (cu_seqlens),
against float64 per sequence, against varlen_attention on the same sequences padded, and
its transformations and errors."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import PLATFORMS, assert_call_raises, attention64, check_close, f64, fresh_rng, put, randn

import pit_jax
from pit_jax.primitives.varlen_attention import varlen_attention_p

pytestmark = pytest.mark.usefixtures("poison_outputs")

DTYPES = [jnp.bfloat16, jnp.float16]


def random_cu(rng, b, s, n, longest=None):
    """cu_seqlens [b, n + 1]: n sequences a row of at most `longest` tokens (default s), the
    second one empty, the first starting past a gap and the last ending before the row's
    end (both gaps padding); the first as long as the bound allows."""
    longest = s if longest is None else longest
    rows = []
    for _ in range(b):
        lead = int(rng.integers(0, s // 8 + 1))
        lens = rng.integers(1, longest + 1, size=n)
        if n > 1:
            lens[1] = 0
        room = s - lead - 3
        if lens.sum() > room:
            lens = lens * room // lens.sum()
        lens[0] = min(longest, room - (lens.sum() - lens[0]))
        rows.append(lead + np.concatenate([[0], np.cumsum(lens)]))
    return np.asarray(rows, np.int32)


def packed64(q, k, v, dout, cu, max_seqlen, scale, causal=False, window=None):
    """(out, lse, dq, dk, dv, valid) in float64: each row's sequences [cu[i], cu[i + 1]),
    at most max_seqlen tokens valid, over their own tokens; k, v with kv heads dividing
    q's (each query head's kv head by repeating); the backward's delta from the output
    stored in q's dtype."""
    group, out_dtype = q.shape[2] // k.shape[2], np.asarray(q).dtype
    q, dout = f64(q), f64(dout)
    k, v = (np.repeat(f64(a), group, axis=2) for a in (k, v))
    b_, s_, h_, _ = q.shape
    out, dq, dk, dv = (np.zeros_like(q) for _ in range(4))
    lse = np.zeros((b_, h_, s_))
    valid = np.zeros((b_, s_), bool)
    for b in range(b_):
        for i in range(cu.shape[1] - 1):
            o = int(np.clip(cu[b, i], 0, s_))
            n = min(int(np.clip(cu[b, i + 1], o, s_)) - o, max_seqlen)
            if n == 0:
                continue
            t = slice(o, o + n)
            valid[b, t] = True
            for h in range(h_):
                out[b, t, h], lse[b, h, t], dq[b, t, h], dk[b, t, h], dv[b, t, h] = attention64(
                    q[b, t, h], k[b, t, h], v[b, t, h], dout[b, t, h], scale, causal, window, out_dtype)
    dk, dv = (a.reshape(b_, s_, h_ // group, group, -1).sum(3) for a in (dk, dv))
    return out, lse, dq, dk, dv, valid


def vjp_call(**kw):
    def f(q, k, v, cu, dout):
        out, vjp = jax.vjp(lambda q, k, v: pit_jax.packed_attention(q, k, v, cu, **kw), q, k, v)
        return (out, *vjp(dout))
    return f


# (batch, seq, sequences a row, max_seqlen, heads, kv_heads, head_dim): the short kernels
# (max_seqlen <= 128, rows much longer), the long ones, grouped heads, sequences cut at
# max_seqlen (their tail padding).
CASES = [
    (2, 300, 4, 128, 2, 2, 64),
    (1, 77, 3, 77, 3, 1, 128),
    (2, 520, 3, 300, 2, 1, 64),
    (3, 260, 2, 200, 4, 2, 80),
    (2, 200, 3, 40, 2, 2, 96),  # max_seqlen below the longest: its tail is padding
]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, (24, 0)), (False, (9, 30))],
                         ids=["bidirectional", "causal", "causal-window", "window"])
@pytest.mark.parametrize("b,s,n,max_seqlen,h,kv,d", CASES)
def test_value_and_gradients(platform, dtype, causal, window, b, s, n, max_seqlen, h, kv, d):
    rng, seed = fresh_rng()
    q, dout = (randn(rng, (b, s, h, d), dtype) for _ in range(2))
    k, v = (randn(rng, (b, s, kv, d), dtype) for _ in range(2))
    cu = random_cu(rng, b, s, n, longest=None if max_seqlen == 40 else max_seqlen)
    kw = dict(max_seqlen=max_seqlen, causal=causal, local_window_size=window)
    args = put(platform, q, k, v, cu, dout)
    jaxpr = str(jax.make_jaxpr(vjp_call(**kw))(*args))
    assert "pit_varlen_attention[" in jaxpr and "pit_varlen_attention_bwd[" in jaxpr
    got = jax.jit(vjp_call(**kw))(*args)
    scale = 1 / math.sqrt(d)
    *want, valid = packed64(q, k, v, dout, cu, max_seqlen, scale, causal, window)
    what = f"seed={seed} cu={cu.tolist()}"
    token_valid = {"out": valid, "dq": valid, "dk": valid, "dv": valid}
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, (want[0], *want[2:])):
        check_close(g, w, dtype, f"{what} {name}")
        assert not f64(g)[~token_valid[name]].any(), f"{what}: {name}'s padding tokens must be zeros"
    params = dict(scale=scale, causal=causal, max_seqlen=max_seqlen)
    if window is not None:
        params.update(window_left=window[0], window_right=0 if causal else window[1])
    _, lse = jax.jit(lambda *a: varlen_attention_p.bind(*a, **params))(*args[:4])
    lse = f64(lse)
    assert np.abs(lse - want[1]).max() <= 1e-5 * max(1.0, np.abs(want[1]).max()), f"{what} lse"
    assert not lse.transpose(0, 2, 1)[~valid].any(), f"{what}: lse's padding tokens must be 0"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("s,causal", [(100, False), (100, True), (400, False), (400, True)])
def test_equals_the_padded_sequences(platform, s, causal):
    """The same sequences packed and padded (one a row) run the same tiles: the same bits."""
    rng, seed = fresh_rng()
    lengths = np.array([s, 0, int(rng.integers(1, s)), int(rng.integers(1, s))], np.int32)
    h, d = 2, 64
    padded = [randn(rng, (len(lengths), s, h, d), jnp.bfloat16) for _ in range(4)]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = int(cu[-1]) + 7  # a tail of padding
    pack = lambda a: jnp.concatenate([a[i, :n] for i, n in enumerate(lengths)] + [  # noqa: E731
        jnp.zeros((7, *a.shape[2:]), a.dtype)])
    packed = [pack(a) for a in padded]
    assert packed[0].shape[0] == tokens
    want = jax.jit(lambda q, k, v, ln, do: jax.vjp(
        lambda q, k, v: pit_jax.varlen_attention(q, k, v, ln, causal=causal), q, k, v)[1](do))(
        *put(platform, *padded[:3], lengths, padded[3]))
    want_out = jax.jit(lambda q, k, v, ln: pit_jax.varlen_attention(q, k, v, ln, causal=causal))(
        *put(platform, *padded[:3], lengths))
    got_out, *got = jax.jit(vjp_call(max_seqlen=s, causal=causal))(*put(platform, *packed[:3], cu, packed[3]))
    for name, g, w in zip(("out", "dq", "dk", "dv"), (got_out, *got), (want_out, *want)):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(pack(w), np.float32),
                                      err_msg=f"seed={seed} {name}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_flat_tokens_and_vmap(platform):
    """q [tokens, heads, head_dim] with cu_seqlens [n + 1] (flash-attention's varlen
    layout) is one packed row; vmap over rows matches a call per row, and vmap of grad."""
    rng, seed = fresh_rng()
    b, s, h, d = 3, 150, 2, 64
    q, k, v = (randn(rng, (b, s, h, d), jnp.bfloat16) for _ in range(3))
    cu = random_cu(rng, b, s, 3)
    q, k, v, cu_d = put(platform, q, k, v, cu)
    rows = jax.jit(lambda q, k, v, cu: pit_jax.packed_attention(q, k, v, cu, max_seqlen=s))(q, k, v, cu_d)
    for i in range(b):
        one = jax.jit(lambda q, k, v, c: pit_jax.packed_attention(q, k, v, c, max_seqlen=s))(q[i], k[i], v[i],
                                                                                               cu_d[i])
        np.testing.assert_array_equal(np.asarray(one, np.float32), np.asarray(rows[i], np.float32),
                                      err_msg=f"seed={seed} row {i}")
    mapped = jax.jit(jax.vmap(lambda q, k, v, c: pit_jax.packed_attention(q, k, v, c, max_seqlen=s)))(q, k, v, cu_d)
    np.testing.assert_array_equal(np.asarray(mapped, np.float32), np.asarray(rows, np.float32))
    loss = lambda q, k, v, c: jnp.sum(pit_jax.packed_attention(q, k, v, c, max_seqlen=s,  # noqa: E731
                                                                causal=True).astype(jnp.float32) ** 2)
    g_rows = jax.jit(jax.grad(lambda q: sum(loss(q[i], k[i], v[i], cu_d[i]) for i in range(b))))(q)
    g_map = jax.jit(jax.vmap(jax.grad(loss)))(q, k, v, cu_d)
    np.testing.assert_array_equal(np.asarray(g_map, np.float32), np.asarray(g_rows, np.float32))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_no_sequence_and_empty_sequences(platform):
    rng, _ = fresh_rng()
    q, k, v = (randn(rng, (2, 40, 2, 64), jnp.bfloat16) for _ in range(3))
    for cu in (np.zeros((2, 1), np.int32), np.array([[0, 0, 0], [40, 40, 40]], np.int32)):
        out = jax.jit(lambda q, k, v, c: pit_jax.packed_attention(q, k, v, c))(*put(platform, q, k, v, cu))
        assert not np.asarray(out, np.float32).any(), f"cu={cu.tolist()}: every token is padding"


def test_reference_path_matches_float64():
    """Shapes the kernels do not take (float32, head_dim 32) run the masked softmax in XLA."""
    rng, seed = fresh_rng()
    b, s, h, d = 2, 50, 2, 32
    q, k, v, dout = (randn(rng, (b, s, h, d), jnp.float32) for _ in range(4))
    cu = random_cu(rng, b, s, 3)
    f = vjp_call(max_seqlen=30, causal=True)
    assert "pit_varlen_attention" not in str(jax.make_jaxpr(f)(q, k, v, cu, dout))
    got = jax.jit(f)(q, k, v, cu, dout)
    *want, _ = packed64(q, k, v, dout, cu, 30, 1 / math.sqrt(d), causal=True)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, (want[0], *want[2:])):
        check_close(g, w, jnp.float32, f"seed={seed} {name}")


def test_bad_input_is_a_clear_error():
    q = jnp.ones((2, 16, 2, 64), jnp.bfloat16)
    cu = jnp.array([[0, 5, 16], [0, 16, 16]], jnp.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens must be integers \[batch, n \+ 1\] = \[2, n \+ 1\]"):
        pit_jax.packed_attention(q, q, q, cu[0])
    with pytest.raises(ValueError, match=r"cu_seqlens must be integers"):
        pit_jax.packed_attention(q, q, q, cu.astype(jnp.float32))
    with pytest.raises(ValueError, match="max_seqlen must be a static int >= 1"):
        pit_jax.packed_attention(q, q, q, cu, max_seqlen=0)
    with pytest.raises(ValueError, match="max_seqlen must be a static int >= 1"):
        pit_jax.packed_attention(q, q, q, cu, max_seqlen=jnp.int32(5))
    with pytest.raises(ValueError, match="k and v must have q's shape"):
        pit_jax.packed_attention(q, q[:, :8], q, cu)
    with pytest.raises(ValueError, match=r"with q \[tokens, heads, head_dim\], k and v must be"):
        pit_jax.packed_attention(q[0], q, q, cu[0])
    with pytest.raises(ValueError, match="local_window_size must be None"):
        pit_jax.packed_attention(q, q, q, cu, local_window_size=-2)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_raw_target_refuses_bad_packed_input(platform):
    """The FFI target's own checks (a call that skipped the op's): cu_seqlens' shape, left
    padding with packed rows, max_seqlen out of range."""
    q = jnp.ones((2, 16, 2, 64), jnp.bfloat16)

    def call(cu, **attrs):
        base = dict(scale=np.float32(0.125), causal=False, left_padded=False, window_left=np.int64(-1),
                    window_right=np.int64(-1), max_seqlen=np.int64(16))
        return lambda q: jax.ffi.ffi_call("pit_varlen_attention", (
            jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((2, 2, 16), jnp.float32)))(
                q, q, q, cu, jnp.zeros((0,), jnp.int32), **{**base, **attrs})

    cu, qd = put(platform, np.array([[0, 5, 16], [0, 16, 16]], np.int32), q)
    assert_call_raises(platform, r"packed rows take cu_seqlens int32 \[batch = 2, segments \+ 1\]",
                       lambda: call(cu[:, :1])(qd))
    assert_call_raises(platform, "and left_padded", lambda: call(cu, left_padded=True)(qd))
    assert_call_raises(platform, r"max_seqlen must be in \[0, 65536\]",
                       lambda: call(cu, max_seqlen=np.int64(70000))(qd))
