"""`varlen_attention`: softmax attention over padded sequences, on the valid tokens.

    out[b, i] = softmax_j(scale q[b, i] . k[b, j]) v[b, j]   for valid i, j (causal: j <= i;
                                                              a local window: i - left <= j <= i + right)
    out[b, i] = 0                                             for padding i

q, out [B, S, H, D] (16-bit, D = 64, 80, 96 or 128, S <= 65536: up to 128 one CTA holds a
sequence's keys, longer sequences run in blocks of 128 tokens with an online softmax), k, v
[B, S, H_kv, D] with H_kv dividing H (grouped-query attention: query head h reads kv head
h // (H // H_kv), addressed by the kernels, no copy; H_kv = H is multi-head attention),
lengths [B] int32 (clamped to [0, S]): sequence b's first lengths[b] tokens are valid, or
its last with `left_padded`. Params: scale, causal, left_padded, window_left and window_right
(-1: no bound), max_seqlen (0: padded rows; > 0: packed rows, `lengths` then cu_seqlens
[B, n + 1] int32: row b's sequence i is its tokens [cu[b, i], cu[b, i + 1]), at most
max_seqlen <= 65536 of them valid, a row up to 2^24 tokens). Two primitives, each one
FFI target, whose CUDA lowering adds an operand `order` (`launch_order`: the long
bidirectional kernels run the sequences longest first; [0] elsewhere):
`varlen_attention_p` (q, k, v, lengths) -> (out, lse) with lse [B, H, S] float32, each
valid query's log-sum-exp (0 on padding rows), and `varlen_attention_bwd_p` (q, k, v,
out, lse, dout, lengths) -> (dq, dk, dv) in q's, k's and v's shapes (with grouped kv heads
the kernels sum each group's query heads into its dk, dv), zeros on padding rows. vmap
folds mapped axes into B.

Autodiff: the forward's JVP is a third primitive, `varlen_attention_tangent_p` (q, k, v,
out, lse, lengths, dq, dk, dv) -> (dout, dlse), linear in (dq, dk, dv): forward mode
evaluates it as the jnp reference's tangent; reverse mode transposes it into the backward
target (plus, only where lse's cotangent is not zero, the reference's lse gradient).
Second order differentiates the reference's expressions (the backward's JVP recomputes
out and lse from q, k, v, so it takes no tangent of its o and lse operands: they are the
forward's results of the same q, k, v).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax import reference as _ref
from pit_jax.primitives import _lowering
from pit_jax.primitives._vma import Primitive, typed_cotangents, zero_tangent

varlen_attention_p = Primitive("pit_varlen_attention")
varlen_attention_p.multiple_results = True
varlen_attention_bwd_p = Primitive("pit_varlen_attention_bwd")
varlen_attention_bwd_p.multiple_results = True
varlen_attention_tangent_p = Primitive("pit_varlen_attention_tangent")
varlen_attention_tangent_p.multiple_results = True

HEAD_DIMS = (64, 80, 96, 128)  # cuda/common/varlen_attention_params.h
SHORT_SEQ = 128  # up to here one CTA holds a whole sequence (cuda/kernels/varlen_attention.cu)
MAX_SEQ = 65536  # beyond SHORT_SEQ: blocks of 128 tokens (cuda/kernels/varlen_attention_long.cu)
MAX_PACKED_ROW = 1 << 24  # a packed row's tokens (kVarlenAttentionMaxPackedRow)
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def kernel_applies(shape, dtype, max_seqlen=0) -> bool:
    """Whether q of this [B, S, H, D] shape and dtype runs the kernels (else the op's jnp
    path); max_seqlen > 0: packed rows whose sequences have at most that many tokens."""
    longest_ok = 0 < max_seqlen <= MAX_SEQ and shape[1] <= MAX_PACKED_ROW if max_seqlen else shape[1] <= MAX_SEQ
    return len(shape) == 4 and shape[3] in HEAD_DIMS and longest_ok and jnp.dtype(dtype) in DTYPES


def check_qkv(q, k, v, where="varlen_attention", like_k=None, **like_q):
    """q [batch, seq, heads, head_dim]; k, v q's dtype and shape, or [batch, seq, kv_heads,
    head_dim] with kv_heads dividing heads (v k's shape); the `like_k` operands (a dict)
    k's shape and the `like_q` ones q's, both in q's dtype. Errors name the argument."""
    if q.ndim != 4:
        raise ValueError(f"{where}: q must be [batch, seq, heads, head_dim], got shape {tuple(q.shape)}")
    b, s, h, d = q.shape
    grouped = k.ndim == 4 and (k.shape[0], k.shape[1], k.shape[3]) == (b, s, d) and (
        k.shape[2] == h or (k.shape[2] > 0 and h % k.shape[2] == 0))
    for name, a in (("k", k), ("v", v)):
        if not grouped or tuple(a.shape) != tuple(k.shape) or a.dtype != q.dtype:
            raise ValueError(f"{where}: k and v must have q's shape {tuple(q.shape)}, or its batch, seq and "
                             f"head_dim with kv_heads dividing its {h} heads (one shape for both), and q's dtype "
                             f"{q.dtype}; got {name} {tuple(a.shape)} {a.dtype}")
    for like, operands in (("k", like_k or {}), ("q", like_q)):
        shape = tuple(k.shape if like == "k" else q.shape)
        for name, a in operands.items():
            if tuple(a.shape) != shape or a.dtype != q.dtype:
                raise ValueError(f"{where}: {name} must have {like}'s shape {shape} and dtype {q.dtype}, "
                                 f"got {tuple(a.shape)} {a.dtype}")


def check(q, k, v, lengths, where="varlen_attention", like_k=None, max_seqlen=0, **like_q):
    """Trace-time checks of the kernels' operands (`check_qkv`, the kernels' shapes and
    dtypes, int32 lengths, or cu_seqlens [batch, n + 1] for packed rows); errors name the
    argument."""
    check_qkv(q, k, v, where, like_k, **like_q)
    if not kernel_applies(q.shape, q.dtype, max_seqlen):
        raise ValueError(f"{where}: the kernels take bfloat16 or float16, head_dim in {HEAD_DIMS} and seq <= "
                         f"{MAX_SEQ} (packed rows: max_seqlen <= {MAX_SEQ}, seq <= {MAX_PACKED_ROW}); got "
                         f"{q.dtype} {tuple(q.shape)}, max_seqlen {max_seqlen}")
    if max_seqlen:
        if lengths.ndim != 2 or lengths.shape[0] != q.shape[0] or lengths.shape[1] < 2 or lengths.dtype != jnp.int32:
            raise ValueError(f"{where}: cu_seqlens must be int32 [batch, segments + 1] = [{q.shape[0]}, >= 2], "
                             f"got {lengths.dtype} {tuple(lengths.shape)}")
    elif tuple(lengths.shape) != (q.shape[0],) or lengths.dtype != jnp.int32:
        raise ValueError(f"{where}: lengths must be int32 [batch] = [{q.shape[0]}], got {lengths.dtype} "
                         f"{tuple(lengths.shape)}")


def _abstract_eval(q, k, v, lengths, max_seqlen=0, **params):
    check(q, k, v, lengths, max_seqlen=max_seqlen)
    b, s, h, _ = q.shape
    return ShapedArray(q.shape, q.dtype), ShapedArray((b, h, s), jnp.float32)


def _attrs(scale, causal=False, left_padded=False, window_left=-1, window_right=-1, max_seqlen=0):
    return dict(scale=np.float32(scale), causal=bool(causal), left_padded=bool(left_padded),
                window_left=np.int64(window_left), window_right=np.int64(window_right),
                max_seqlen=np.int64(max_seqlen))


def longest_sequence(q_shape, max_seqlen=0) -> int:
    """The longest sequence the kernels see: a packed row's max_seqlen (clamped to the row),
    else the padded row (the C++ decoder's `seq`)."""
    return min(max_seqlen or q_shape[1], q_shape[1])


def launch_order(q, k, lengths, backward, causal=False, max_seqlen=0, **_):
    """The kernels' launch order operand: int32 [sequences], the sequences longest first,
    where the long kernels run bidirectionally (there every block of a sequence walks all
    of its keys or queries, so the longest sequences' blocks are the longest work: started
    first, the short ones fill the tail; grid order alone left the H200's SMs idle a third
    of the long documents' forward); else [0] (causal: the grid's own order starts the
    longest walks first, the forward's and dQ's last queries and dK / dV's first keys)."""
    seq = longest_sequence(q.shape, max_seqlen)
    long_kernels = seq > SHORT_SEQ or (backward and k.shape[2] != q.shape[2])
    if causal or not long_kernels:
        return jnp.zeros((0,), jnp.int32)
    if max_seqlen:  # cu_seqlens [B, n + 1]: the sequences' lengths as the kernels clamp them
        n = _ref.packed_sequences(lengths, q.shape[1], seq)[1].reshape(-1)
    else:
        n = jnp.clip(lengths, 0, seq)
    return jnp.argsort(-n, stable=True).astype(jnp.int32)


def _native(q, k, v, lengths, ordered=False, **params):
    b, s, h, _ = q.shape
    order = launch_order(q, k, lengths, False, **params) if ordered else jnp.zeros((0,), jnp.int32)
    return jax.ffi.ffi_call("pit_varlen_attention", (jax.ShapeDtypeStruct(q.shape, q.dtype),
                                                     jax.ShapeDtypeStruct((b, h, s), jnp.float32)))(
        q, k, v, lengths, order, **_attrs(**params))


def shared_memory_bytes(seq: int, head_dim: int, backward: bool, grouped: bool = False) -> int:
    """A CTA's shared memory, in rows of head_dim + 8 elements (the kernels' FwdSmem /
    BwdSmem / DqSmem / DkvSmem). Up to SHORT_SEQ: q, k, v (and dO, and dS over o, backward)
    of a whole sequence. Longer, and the backward of grouped kv heads (`grouped`) at any
    length: two stages of 64-token chunks of k, v (forward, dQ) or q, dO, o (dK, dV), or
    the 128-token block first staged (dQ: q, dO, o), and a few floats a row; the backward
    takes the larger of its dK / dV and dQ blocks' (the dK / dV blocks' at head_dim 64,
    which keep their keys and values in shared memory)."""
    pitch = head_dim + 8
    if seq > SHORT_SEQ or (backward and grouped):
        if not backward:
            return 4 * 64 * pitch * 2
        # at head_dim 64 the dK / dV blocks keep their 128 keys and values too (DkvKvInSmem;
        # not with a local window, whose smaller need this bound covers)
        kv_block = 2 * 128 * pitch * 2 if head_dim == 64 else 0
        return 6 * 64 * pitch * 2 + kv_block + 4 * 64 * 4
    s16 = -(-seq // 16) * 16
    if not backward:
        return 3 * s16 * pitch * 2
    return (4 * s16 * pitch + s16 * max(s16 + 8, pitch)) * 2 + 2 * s16 * 4


# The shared memory a block may opt in to, by compute capability (CUDA C++ Programming
# Guide, "Features and Technical Specifications"); other GPUs: 99 KB.
SMEM_OPTIN = {(8, 0): 163 * 1024, (8, 7): 163 * 1024, (9, 0): 227 * 1024, (10, 0): 227 * 1024,
              (10, 3): 227 * 1024}
SMEM_OPTIN_OTHER = 99 * 1024


def _checked_on_cuda(fn, backward):
    """The CUDA lowering of `fn`: a sequence whose staging needs more shared memory than
    the GPU gives a block (e.g. head_dim 128 on an A100, seq 128 backward on Ada) is an
    error at lowering time that says so, not a failed launch."""
    def lower(q, k, *args, **params):
        device = _lowering._first_cuda_device()
        cc = None if device is None else _lowering._capability(device)
        seq = longest_sequence(q.shape, params.get("max_seqlen", 0))
        need = shared_memory_bytes(seq, q.shape[-1], backward, grouped=k.shape[2] != q.shape[2])
        have = None if cc is None else SMEM_OPTIN.get(cc, SMEM_OPTIN_OTHER)
        if have is not None and need > have:
            what = "backward" if backward else "forward"
            raise NotImplementedError(
                f"varlen_attention: the {what} of seq {seq} at head_dim {q.shape[-1]} stages "
                f"{need // 1024} KB of shared memory per block, more than the {have // 1024} KB of "
                f"{getattr(device, 'device_kind', 'this GPU')} (compute capability {cc[0]}.{cc[1]}). "
                f"Use shorter sequences or a narrower head, or set PIT_JAX_REFERENCE=varlen_attention "
                f"to run the XLA path.")
        return fn(q, k, *args, **params)

    return lower


def _bwd_abstract_eval(q, k, v, o, lse, dout, lengths, max_seqlen=0, **params):
    check(q, k, v, lengths, "varlen_attention_bwd", max_seqlen=max_seqlen, o=o, dout=dout)
    b, s, h, _ = q.shape
    if tuple(lse.shape) != (b, h, s) or lse.dtype != jnp.float32:
        raise ValueError(f"varlen_attention_bwd: lse must be float32 [batch, heads, seq] = [{b}, {h}, {s}], "
                         f"got {lse.dtype} {tuple(lse.shape)}")
    return ShapedArray(q.shape, q.dtype), ShapedArray(k.shape, k.dtype), ShapedArray(v.shape, v.dtype)


def _bwd_native(q, k, v, o, lse, dout, lengths, ordered=False, **params):
    dq, dk = jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype)
    order = launch_order(q, k, lengths, True, **params) if ordered else jnp.zeros((0,), jnp.int32)
    return jax.ffi.ffi_call("pit_varlen_attention_bwd", (dq, dk, dk))(
        q, k, v, o, lse, dout, lengths, order, **_attrs(**params))


def _folded(prim, args, dims, **params):
    """vmap: every mapped axis to the front (unmapped operands broadcast), folded into the
    batch; every operand and result has the batch first (lse [B, H, S] too)."""
    n = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    flat = [jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (n, *a.shape)) for a, d in zip(args, dims)]
    outs = prim.bind(*(a.reshape((n * a.shape[1],) + a.shape[2:]) for a in flat), **params)
    return [o.reshape((n, o.shape[0] // n) + o.shape[1:]) for o in outs], [0] * len(outs)


def _batch(args, dims, **params):
    return _folded(varlen_attention_p, args, dims, **params)


def _bwd_batch(args, dims, **params):
    return _folded(varlen_attention_bwd_p, args, dims, **params)


def _jvp(primals, tangents, **params):
    q, k, v, lengths = primals
    out, lse = varlen_attention_p.bind(*primals, **params)
    if all(type(t) is ad.Zero for t in tangents[:3]):
        return [out, lse], [zero_tangent(out), zero_tangent(lse)]
    dq, dk, dv = (ad.instantiate_zeros(t) for t in tangents[:3])
    return [out, lse], varlen_attention_tangent_p.bind(q, k, v, out, lse, lengths, dq, dk, dv, **params)


def _tangent_abstract_eval(q, k, v, o, lse, lengths, dq, dk, dv, max_seqlen=0, **params):
    check(q, k, v, lengths, "varlen_attention_tangent", dict(dk=dk, dv=dv), max_seqlen=max_seqlen, o=o, dq=dq)
    b, s, h, _ = q.shape
    if tuple(lse.shape) != (b, h, s) or lse.dtype != jnp.float32:
        raise ValueError(f"varlen_attention_tangent: lse must be float32 [batch, heads, seq] = [{b}, {h}, {s}], "
                         f"got {lse.dtype} {tuple(lse.shape)}")
    return [ShapedArray(q.shape, q.dtype), ShapedArray((b, h, s), jnp.float32)]


def _tangent_map(q, k, v, o, lse, lengths, dq, dk, dv, **params):
    """Forward mode: the reference's tangent (o and lse are its primal results)."""
    f = lambda q, k, v: _ref.varlen_attention(q, k, v, lengths, **params)  # noqa: E731
    return list(jax.jvp(f, (q, k, v), (dq, dk, dv))[1])


def _tangent_transpose(cts, q, k, v, o, lse, lengths, dq, dk, dv, **params):
    if any(ad.is_undefined_primal(a) for a in (q, k, v, o, lse, lengths)):
        raise NotImplementedError("varlen_attention_tangent is linear in its tangents only")
    ct_out, ct_lse = cts
    grads = [None] * 3
    if type(ct_out) is not ad.Zero:
        grads = list(varlen_attention_bwd_p.bind(q, k, v, o, lse, ct_out.astype(q.dtype), lengths, **params))
    if type(ct_lse) is not ad.Zero:  # only when a caller reads lse (the op itself does not)
        lse_of = lambda q, k: _ref.varlen_attention(q, k, v, lengths, **params)[1]  # noqa: E731
        extra = jax.vjp(lse_of, q, k)[1](ct_lse.astype(jnp.float32))
        grads[:2] = [e if g is None else g + e for g, e in zip(grads[:2], extra)]
    tangents = (dq, dk, dv)
    return [None] * 6 + [g if ad.is_undefined_primal(t) else None for g, t in zip(grads, tangents)]


def _tangent_jvp(primals, tangents, **params):
    """Second order: the jvp of the tangent map's jnp expression."""
    outs = varlen_attention_tangent_p.bind(*primals, **params)
    tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
    return outs, jax.jvp(lambda *a: _tangent_map(*a, **params), tuple(primals), tangents)[1]


def _tangent_batch(args, dims, **params):
    return _folded(varlen_attention_tangent_p, args, dims, **params)


def bwd_reference(q, k, v, o, lse, dout, lengths, **params):
    """The backward in jnp: the reference's VJP (o and lse recomputed from q, k, v)."""
    f = lambda q, k, v: _ref.varlen_attention(q, k, v, lengths, **params)[0]  # noqa: E731
    return list(jax.vjp(f, q, k, v)[1](dout))


def _bwd_jvp(primals, tangents, **params):
    """Second order (e.g. forward over reverse): the jvp of the backward's jnp expression."""
    outs = varlen_attention_bwd_p.bind(*primals, **params)
    tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
    return outs, jax.jvp(lambda *a: bwd_reference(*a, **params), tuple(primals), tangents)[1]


def _core(*ranks):
    """The operands' ranks without the batch dim (`_partition`), the lengths' (None in
    `ranks`, else last) 0, or 1 for packed rows' cu_seqlens [batch, n + 1]."""
    def core(max_seqlen=0, **_):
        lengths = 1 if max_seqlen else 0
        out = [lengths if r is None else r for r in ranks]
        return tuple(out) if None in ranks else (*out, lengths)
    return core


varlen_attention_p.def_impl(lambda *args, **params: xla.apply_primitive(varlen_attention_p, *args, **params))
varlen_attention_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[varlen_attention_p] = _jvp
batching.primitive_batchers[varlen_attention_p] = _batch
_lowering.register_traced_lowering(varlen_attention_p, _native, ("pit_varlen_attention",),
                                   _checked_on_cuda(functools.partial(_native, ordered=True), False),
                                   core=(_core(3, 3, 3), (3, 2)))

varlen_attention_bwd_p.def_impl(lambda *args, **params: xla.apply_primitive(varlen_attention_bwd_p, *args, **params))
varlen_attention_bwd_p.def_abstract_eval(_bwd_abstract_eval)
ad.primitive_jvps[varlen_attention_bwd_p] = _bwd_jvp
batching.primitive_batchers[varlen_attention_bwd_p] = _bwd_batch
_lowering.register_traced_lowering(varlen_attention_bwd_p, _bwd_native, ("pit_varlen_attention_bwd",),
                                   _checked_on_cuda(functools.partial(_bwd_native, ordered=True), True),
                                   core=(_core(3, 3, 3, 3, 2, 3), (3, 3, 3)))

varlen_attention_tangent_p.def_impl(
    lambda *args, **params: xla.apply_primitive(varlen_attention_tangent_p, *args, **params))
varlen_attention_tangent_p.def_abstract_eval(_tangent_abstract_eval)
ad.primitive_jvps[varlen_attention_tangent_p] = _tangent_jvp
ad.primitive_transposes[varlen_attention_tangent_p] = typed_cotangents(_tangent_transpose)
batching.primitive_batchers[varlen_attention_tangent_p] = _tangent_batch
_lowering.register_traced_lowering(varlen_attention_tangent_p, _tangent_map, (),
                                   core=(_core(3, 3, 3, 3, 2, None, 3, 3, 3), (3, 2)))
