"""`grouped_wgrad`: the expert weights' gradient, a gathered reduction over each expert's tokens.

    dw[..., e] = sum over a in group e of src[..., a // row_div, :]^T (x) dy[..., a, :]

Operands (src [..., R, D], dy [..., A, F], lists [..., E+1, A], counts [..., E+1]);
result dw [..., E, D, F] whose leading dims are the first `out_batch` of the full batch,
summing the rest (a weight shared by a batch of token groups). Empty experts give zeros;
float32 accumulation, deterministic for a given index (the sum follows its list order).
Only the routed rows are read: the cost is that of the live tokens, not of a dense
per-expert product over all tokens.

Bilinear in (src, dy); its transposes are grouped_matmul products on the same index.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives import _grouped, _lowering, _products
from pit_jax.primitives._vma import Primitive, typed_cotangents
from pit_jax.primitives.grouped_matmul import check_index, grouped_matmul

grouped_wgrad_p = Primitive("pit_grouped_wgrad")


def _abstract_eval(src, dy, lists, counts, *, row_div, allow_tf32, out_batch):
    what = "grouped_wgrad"
    e = check_index(lists, counts, what)
    if src.dtype != dy.dtype or src.dtype not in _products.FLOATS:
        raise TypeError(f"{what}: src and dy must share a float32/bfloat16/float16 dtype, got {src.dtype}, {dy.dtype}")
    if src.ndim < 2 or dy.ndim < 2:
        raise ValueError(f"{what}: src must be [..., R, D] and dy [..., A, F], got {src.shape} and {dy.shape}")
    a = lists.shape[-1]
    if dy.shape[-2] != a:
        raise ValueError(f"{what}: dy has {dy.shape[-2]} rows but the routing index has {a} assignments")
    if row_div < 1 or src.shape[-2] * row_div != a:
        raise ValueError(f"{what}: src has {src.shape[-2]} rows; with row_div={row_div} the index needs {a // max(row_div, 1)}")
    full = _grouped.full_batch(src, dy, lists, other_rank=2, what=what)
    if not 0 <= out_batch <= len(full):
        raise ValueError(f"{what}: out_batch {out_batch} must be in [0, {len(full)}]")
    return ShapedArray(full[:out_batch] + (e, src.shape[-1], dy.shape[-1]), src.dtype)


def _native(src, dy, lists, counts, *, row_div, allow_tf32, out_batch):
    lead = _grouped.foldable(src, lists, shared=out_batch == 0)
    if lead and tuple(dy.shape[:-2]) == lead:  # a shared weight's gradient: one product over all the groups' tokens
        fl, fc = _grouped.folded_index(lists, counts)
        return _native(src.reshape(-1, src.shape[-1]), dy.reshape(-1, dy.shape[-1]), fl, fc, row_div=row_div,
                       allow_tf32=allow_tf32, out_batch=0)
    out = _abstract_eval(src, dy, lists, counts, row_div=row_div, allow_tf32=allow_tf32, out_batch=out_batch)
    return jax.ffi.ffi_call("pit_grouped_wgrad", jax.ShapeDtypeStruct(out.shape, out.dtype))(
        src, dy, lists, counts, row_div=np.int64(row_div), allow_tf32=bool(allow_tf32)
    )


def grouped_wgrad(src, dy, lists, counts, *, row_div, allow_tf32=False, out_batch):
    return grouped_wgrad_p.bind(
        src, dy, lists, counts, row_div=int(row_div), allow_tf32=bool(allow_tf32), out_batch=int(out_batch)
    )


def _transpose(ct, src, dy, lists, counts, *, row_div, allow_tf32, out_batch):
    if type(ct) is ad.Zero:
        return [None, None, None, None]
    if ad.is_undefined_primal(lists) or ad.is_undefined_primal(counts):
        raise ValueError("grouped_wgrad: the routing index is not differentiable")
    ct_src = ct_dy = None
    if ad.is_undefined_primal(dy):
        g = grouped_matmul(src, ct, lists, counts, row_div=row_div, trans_w=False, allow_tf32=allow_tf32)
        ct_dy = _grouped.reduce_batch(g, dy.aval.ndim - 2, dy.aval.dtype)
    if ad.is_undefined_primal(src):
        g = grouped_matmul(dy, ct, lists, counts, row_div=1, trans_w=True, allow_tf32=allow_tf32)
        ct_src = _grouped.reduce_batch(_grouped.reduce_rows(g, row_div), src.aval.ndim - 2, src.aval.dtype)
    return [ct_src, ct_dy, None, None]


def _batch(args, dims, **params):
    return _grouped.batch_rule(grouped_wgrad_p, args, dims, (2, 2, 2, 1), **params)


grouped_wgrad_p.def_impl(lambda *args, **params: xla.apply_primitive(grouped_wgrad_p, *args, **params))
grouped_wgrad_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[grouped_wgrad_p] = _products.bilinear_jvp(grouped_wgrad_p)
ad.primitive_transposes[grouped_wgrad_p] = typed_cotangents(_transpose)
batching.primitive_batchers[grouped_wgrad_p] = _batch
_lowering.register_traced_lowering(grouped_wgrad_p, _native, ("pit_grouped_wgrad",), core=((2, 2, 2, 1), (3,)))
