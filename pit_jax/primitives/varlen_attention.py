"""`varlen_attention`: softmax attention over right-padded sequences, on the valid tokens.

    out[b, i] = softmax_j(scale q[b, i] . k[b, j]) v[b, j]   for i, j < lengths[b]
    out[b, i] = 0                                             for i >= lengths[b]

q, k, v, out [B, S, H, D] (16-bit, D = 64, S <= 128: one CTA holds a sequence's keys),
lengths [B] int32 (clamped to [0, S]). Two primitives, each one FFI target:
`varlen_attention_p` (q, k, v, lengths) -> (out, lse) with lse [B, H, S] float32, each
valid query's log-sum-exp (0 on padding rows), and `varlen_attention_bwd_p` (q, k, v,
out, lse, dout, lengths) -> (dq, dk, dv), zeros on padding rows. The functional op
(`pit_jax.ops.attention`) pairs them in a custom VJP. vmap folds mapped axes into B.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import batching, xla

from pit_jax.primitives import _lowering
from pit_jax.primitives._vma import Primitive

varlen_attention_p = Primitive("pit_varlen_attention")
varlen_attention_p.multiple_results = True
varlen_attention_bwd_p = Primitive("pit_varlen_attention_bwd")
varlen_attention_bwd_p.multiple_results = True

HEAD_DIM = 64  # cuda/common/varlen_attention_params.h
MAX_SEQ = 128
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def kernel_applies(shape, dtype) -> bool:
    """Whether q of this [B, S, H, D] shape and dtype runs the kernels (else the op's jnp path)."""
    return len(shape) == 4 and shape[3] == HEAD_DIM and shape[1] <= MAX_SEQ and jnp.dtype(dtype) in DTYPES


def check_qkv(q, k, v, where="varlen_attention", **like_q):
    """q [batch, seq, heads, head_dim]; k, v and the `like_q` operands q's shape and dtype.
    Errors name the argument."""
    if q.ndim != 4:
        raise ValueError(f"{where}: q must be [batch, seq, heads, head_dim], got shape {tuple(q.shape)}")
    for name, a in (("k", k), ("v", v), *like_q.items()):
        if tuple(a.shape) != tuple(q.shape) or a.dtype != q.dtype:
            raise ValueError(f"{where}: {name} must have q's shape {tuple(q.shape)} and dtype {q.dtype}, "
                             f"got {tuple(a.shape)} {a.dtype}")


def check(q, k, v, lengths, where="varlen_attention", **like_q):
    """Trace-time checks of the kernels' operands (`check_qkv`, the kernels' shapes and
    dtypes, int32 lengths); errors name the argument."""
    check_qkv(q, k, v, where, **like_q)
    if not kernel_applies(q.shape, q.dtype):
        raise ValueError(f"{where}: the kernels take bfloat16 or float16, head_dim {HEAD_DIM} and seq <= {MAX_SEQ}; "
                         f"got {q.dtype} {tuple(q.shape)}")
    if tuple(lengths.shape) != (q.shape[0],) or lengths.dtype != jnp.int32:
        raise ValueError(f"{where}: lengths must be int32 [batch] = [{q.shape[0]}], got {lengths.dtype} "
                         f"{tuple(lengths.shape)}")


def _abstract_eval(q, k, v, lengths, *, scale):
    check(q, k, v, lengths)
    b, s, h, _ = q.shape
    return ShapedArray(q.shape, q.dtype), ShapedArray((b, h, s), jnp.float32)


def _native(q, k, v, lengths, *, scale):
    b, s, h, _ = q.shape
    return jax.ffi.ffi_call("pit_varlen_attention", (jax.ShapeDtypeStruct(q.shape, q.dtype),
                                                     jax.ShapeDtypeStruct((b, h, s), jnp.float32)))(
        q, k, v, lengths, scale=np.float32(scale))


def _bwd_abstract_eval(q, k, v, o, lse, dout, lengths, *, scale):
    check(q, k, v, lengths, "varlen_attention_bwd", o=o, dout=dout)
    b, s, h, _ = q.shape
    if tuple(lse.shape) != (b, h, s) or lse.dtype != jnp.float32:
        raise ValueError(f"varlen_attention_bwd: lse must be float32 [batch, heads, seq] = [{b}, {h}, {s}], "
                         f"got {lse.dtype} {tuple(lse.shape)}")
    return (ShapedArray(q.shape, q.dtype),) * 3


def _bwd_native(q, k, v, o, lse, dout, lengths, *, scale):
    out = jax.ShapeDtypeStruct(q.shape, q.dtype)
    return jax.ffi.ffi_call("pit_varlen_attention_bwd", (out, out, out))(
        q, k, v, o, lse, dout, lengths, scale=np.float32(scale))


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


varlen_attention_p.def_impl(lambda *args, **params: xla.apply_primitive(varlen_attention_p, *args, **params))
varlen_attention_p.def_abstract_eval(_abstract_eval)
batching.primitive_batchers[varlen_attention_p] = _batch
_lowering.register_traced_lowering(varlen_attention_p, _native, ("pit_varlen_attention",),
                                   core=((3, 3, 3, 0), (3, 2)))

varlen_attention_bwd_p.def_impl(lambda *args, **params: xla.apply_primitive(varlen_attention_bwd_p, *args, **params))
varlen_attention_bwd_p.def_abstract_eval(_bwd_abstract_eval)
batching.primitive_batchers[varlen_attention_bwd_p] = _bwd_batch
_lowering.register_traced_lowering(varlen_attention_bwd_p, _bwd_native, ("pit_varlen_attention_bwd",),
                                   core=((3, 3, 3, 3, 2, 3, 0), (3, 3, 3)))
