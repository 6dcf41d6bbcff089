"""`grouped_matmul`: SRead token rows -> one expert's dense tile -> SWrite assignment rows.

    y[..., a, :] = src[..., a // row_div, :] @ op(w[..., e, :, :])   for a in group e < E
    y[..., a, :] = 0                                                for a in group E (dropped)

Operands (src [..., R, D], w [..., E, D, F] ([..., E, F, D] with trans_w), lists
[..., E+1, A], counts [..., E+1]) with R * row_div == A: row_div = k when src holds
tokens, 1 when it holds assignments. y [..., A, F] has the full batch (prefix
convention, `_grouped`). float32 accumulation; the routing index is a MoeIndex's arrays.

Bilinear in (src, w) for a fixed index; the transposes reuse the same index:
d src = grouped_matmul(dy, w, trans_w=not trans_w) summed over each token's k
assignments, d w = grouped_wgrad(src, dy) (a gathered reduction over the expert's
tokens, never a dense product over all tokens).

`relu=True` clamps y at 0 in the kernel's epilogue (the MoE FFN's first product): one
pass over the [A, F] activations fewer. ReLU's derivative is read from the output
(y > 0), so the JVP keeps the fused forward: tangent = where(y > 0, bilinear tangent, 0),
whose products are the plain (relu=False) primitive.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives import _grouped, _lowering, _products
from pit_jax.primitives._vma import Primitive, typed_cotangents, zero_tangent

grouped_matmul_p = Primitive("pit_grouped_matmul")


def check_index(lists, counts, what: str) -> int:
    """Number of experts E of a routing index; raises on malformed index arrays."""
    if lists.dtype != jnp.int32 or counts.dtype != jnp.int32:
        raise TypeError(f"{what}: the routing index must be int32, got {lists.dtype} and {counts.dtype}")
    if lists.ndim < 2 or tuple(counts.shape) != tuple(lists.shape[:-1]) or lists.shape[-2] < 2:
        raise ValueError(
            f"{what}: the routing index must be lists [..., E+1, A] and counts [..., E+1] with E >= 1, got "
            f"{tuple(lists.shape)} and {tuple(counts.shape)}"
        )
    return lists.shape[-2] - 1


def _abstract_eval(src, w, lists, counts, *, row_div, trans_w, allow_tf32, relu=False):
    what = "grouped_matmul"
    e = check_index(lists, counts, what)
    if src.dtype != w.dtype or src.dtype not in _products.FLOATS:
        raise TypeError(f"{what}: src and w must share a float32/bfloat16/float16 dtype, got {src.dtype}, {w.dtype}")
    if src.ndim < 2 or w.ndim < 3:
        raise ValueError(f"{what}: src must be [..., R, D] and w [..., E, D, F], got {src.shape} and {w.shape}")
    r, d = src.shape[-2:]
    we, wd, f = (w.shape[-3], w.shape[-1], w.shape[-2]) if trans_w else w.shape[-3:]
    a = lists.shape[-1]
    if we != e:
        raise ValueError(f"{what}: w has {we} experts but the routing index has {e}")
    if wd != d:
        raise ValueError(f"{what}: src rows have {d} features but w expects {wd}")
    if row_div < 1 or r * row_div != a:
        raise ValueError(f"{what}: src has {r} rows; with row_div={row_div} the index's {a} assignments need {a // max(row_div, 1)}")
    full = _grouped.full_batch(src, w, lists, other_rank=3, what=what)
    return ShapedArray(full + (a, f), src.dtype)


def _native(src, w, lists, counts, *, row_div, trans_w, allow_tf32, relu):
    lead = _grouped.foldable(src, lists, shared=w.ndim == 3)
    if lead:  # token groups sharing the experts: one product over all their tokens
        fl, fc = _grouped.folded_index(lists, counts)
        y = _native(src.reshape(-1, src.shape[-1]), w, fl, fc, row_div=row_div, trans_w=trans_w,
                    allow_tf32=allow_tf32, relu=relu)
        return y.reshape(*lead, lists.shape[-1], y.shape[-1])
    out = _abstract_eval(src, w, lists, counts, row_div=row_div, trans_w=trans_w, allow_tf32=allow_tf32)
    return jax.ffi.ffi_call("pit_grouped_matmul", jax.ShapeDtypeStruct(out.shape, out.dtype))(
        src, w, lists, counts, row_div=np.int64(row_div), trans_w=bool(trans_w), allow_tf32=bool(allow_tf32),
        activation=np.int64(_lowering.ACTIVATION_CODES["relu"] if relu else 0),
    )


def grouped_matmul(src, w, lists, counts, *, row_div, trans_w=False, allow_tf32=False, relu=False):
    return grouped_matmul_p.bind(
        src, w, lists, counts, row_div=int(row_div), trans_w=bool(trans_w), allow_tf32=bool(allow_tf32),
        relu=bool(relu),
    )


def _jvp(primals, tangents, *, relu, **params):
    y = grouped_matmul_p.bind(*primals, relu=relu, **params)
    dz = _products.bilinear_tangent(grouped_matmul_p, primals, tangents, relu=False, **params)
    if dz is None:
        return y, zero_tangent(y)
    return y, jnp.where(y > 0, dz, jnp.zeros((), dz.dtype)) if relu else dz


def _transpose(ct, src, w, lists, counts, *, row_div, trans_w, allow_tf32, relu):
    from pit_jax.primitives.grouped_wgrad import grouped_wgrad

    # The JVP above only emits relu=False products, the linear ones.
    assert not relu, "grouped_matmul(relu=True) is not linear; its JVP transposes the plain product"
    if type(ct) is ad.Zero:
        return [None, None, None, None]
    if ad.is_undefined_primal(lists) or ad.is_undefined_primal(counts):
        raise ValueError("grouped_matmul: the routing index is not differentiable")
    ct_src = ct_w = None
    if ad.is_undefined_primal(src):
        g = grouped_matmul(ct, w, lists, counts, row_div=1, trans_w=not trans_w, allow_tf32=allow_tf32)
        ct_src = _grouped.reduce_batch(_grouped.reduce_rows(g, row_div), src.aval.ndim - 2, src.aval.dtype)
    if ad.is_undefined_primal(w):
        nb = w.aval.ndim - 3
        ct_w = grouped_wgrad(src, ct, lists, counts, row_div=row_div, allow_tf32=allow_tf32, out_batch=nb)
        if trans_w:
            ct_w = jnp.swapaxes(ct_w, -1, -2)
    return [ct_src, ct_w, None, None]


def _batch(args, dims, **params):
    return _grouped.batch_rule(grouped_matmul_p, args, dims, (2, 3, 2, 1), **params)


grouped_matmul_p.def_impl(lambda *args, **params: xla.apply_primitive(grouped_matmul_p, *args, **params))
grouped_matmul_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[grouped_matmul_p] = _jvp
ad.primitive_transposes[grouped_matmul_p] = typed_cotangents(_transpose)
batching.primitive_batchers[grouped_matmul_p] = _batch
_lowering.register_traced_lowering(grouped_matmul_p, _native, ("pit_grouped_matmul",), core=((2, 3, 2, 1), (2,)))
