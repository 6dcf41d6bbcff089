"""`row_split`: a product's tangent split into column parts, with a bias on the listed rows;
its transpose `row_concat_sum` concatenates the parts' cotangents and sums them over the
listed rows in one pass (`pit_row_concat_sum`).

    row_split(t, db)[k]        = (t + row_bcast(db))[..., k N / P : (k + 1) N / P]
    row_concat_sum(c_0 .. c_P-1) = (cat, sums): cat = the parts side by side on the listed
                                   rows (its other rows unspecified), sums = row_sum(cat)

t [..., M, N] is the tangent of `sparse_dense(..., out_parts=P, dead_rows="zeros")` before
its split, db the bias's tangent ([N], [..., N], or [0]: none). What it is for: JAX
transposes a split into a concatenation over every row, padding included, and the bias's
`row_sum` then reads the listed rows of that again (BERT b32's q / k / v on the H100: 9.4
+ 5.6 us a layer). Every reader of t's cotangent reads the listed rows only (the
products' transposes: the row-gather dx and weight gradient, or the masked dense route,
which zeroes the other rows of both operands), so `cat` leaves the others unwritten (the
CPU handler writes NaN there, so that a reader of them shows).

The kernel takes three parts (q, k, v); other part counts concatenate and sum in jnp.
Both primitives are linear, each the other's transpose; vmap moves the mapped axis into
row_concat_sum's batch dims, and row_split vmaps its jnp expression.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives import _lowering, _products
from pit_jax.primitives._vma import Primitive, typed_cotangents
from pit_jax.primitives.row_layer_norm import _mapped_to_front, check_row_index, listed_rows_only
from pit_jax.primitives.row_sum import row_bcast, row_sum, slices, vector_cotangent

row_split_p = Primitive("pit_row_split")
row_split_p.multiple_results = True
row_concat_sum_p = Primitive("pit_row_concat_sum")
row_concat_sum_p.multiple_results = True

KERNEL_PARTS = 3  # the parts pit_row_concat_sum takes


# -- row_split -------------------------------------------------------------------------


def row_split(t, db, tiles, count, *, parts, tile_h):
    """t [..., M, N], db None or [N] / [..., N] (t's dtype) -> `parts` arrays [..., M, N / parts]."""
    if db is None:
        db = jnp.zeros((0,), t.dtype)
    return row_split_p.bind(t, db, tiles, count, parts=int(parts), tile_h=int(tile_h))


def _split_abstract_eval(t, db, tiles, count, *, parts, tile_h):
    n = t.shape[-1]
    if t.ndim < 2 or parts < 1 or n % parts:
        raise ValueError(f"row_split: t must be [..., M, N] with N a multiple of parts = {parts}, got {t.shape}")
    batch = tuple(t.shape[:-2])
    if db.size and (db.dtype != t.dtype or db.shape[-1] != n or db.shape[:-1] not in ((), batch)):
        raise ValueError(f"row_split: db must be [N] or [..., N] = {(*batch, n)} in t's dtype {t.dtype}, "
                         f"got {tuple(db.shape)} {db.dtype}")
    check_row_index("row_split", t.shape, tiles, count, tile_h, "t's")
    return [ShapedArray((*t.shape[:-1], n // parts), t.dtype)] * parts


def _split_expr(t, db, tiles, count, *, parts, tile_h):
    if db.size:
        t = t + row_bcast(db, tiles, count, m=t.shape[-2], tile_h=tile_h)
    return list(jnp.split(t, parts, axis=-1))


def _split_transpose(cts, t, db, tiles, count, *, parts, tile_h):
    want_db = ad.is_undefined_primal(db)
    if all(type(c) is ad.Zero for c in cts):
        return [ad.Zero(t.aval) if ad.is_undefined_primal(t) else None,
                ad.Zero(db.aval) if want_db else None, None, None]
    cat, sums = row_concat_sum([_zeros_for(c, c.aval) for c in cts], tiles, count, tile_h=tile_h)
    return [cat if ad.is_undefined_primal(t) else None, vector_cotangent(sums, db.aval) if want_db else None,
            None, None]


def _zeros_for(t, like):
    return jnp.zeros(like.shape, like.dtype) if type(t) is ad.Zero else t


def _split_jvp(primals, tangents, **params):
    t, db, tiles, count = primals
    outs = row_split_p.bind(*primals, **params)
    return outs, row_split_p.bind(_zeros_for(tangents[0], t), _zeros_for(tangents[1], db), tiles, count, **params)


def _split_batch(args, dims, *, parts, **params):
    outs = jax.vmap(functools.partial(_split_expr, parts=parts, **params), in_axes=tuple(dims))(*args)
    return outs, [0] * parts


# -- row_concat_sum --------------------------------------------------------------------


def row_concat_sum(xs, tiles, count, *, tile_h):
    """xs: a list of P arrays [..., M, Np] (one shape and dtype) -> (cat [..., M, P Np] on the
    listed rows, sums [..., P Np]: its column sums over them, in the parts' dtype)."""
    return tuple(row_concat_sum_p.bind(*xs, tiles, count, tile_h=int(tile_h), parts=len(xs)))


def _concat_abstract_eval(*args, tile_h, parts):
    *xs, tiles, count = args
    x0 = xs[0]
    if jnp.dtype(x0.dtype) not in _products.FLOATS or x0.ndim < 2:
        raise TypeError(f"row_concat_sum: the parts must be float32, bfloat16 or float16 [..., M, Np], "
                        f"got {x0.dtype} {tuple(x0.shape)}")
    if any(x.shape != x0.shape or x.dtype != x0.dtype for x in xs):
        raise ValueError(f"row_concat_sum: every part must be {tuple(x0.shape)} {x0.dtype}, "
                         f"got {[(tuple(x.shape), str(x.dtype)) for x in xs]}")
    check_row_index("row_concat_sum", x0.shape, tiles, count, tile_h, "the parts'")
    n = len(xs) * x0.shape[-1]
    return [ShapedArray((*x0.shape[:-1], n), x0.dtype), ShapedArray((*x0.shape[:-2], n), x0.dtype)]


def _concat_native(*args, tile_h, parts):
    *xs, tiles, count = args
    if len(xs) != KERNEL_PARTS:  # the target takes three parts
        cat = jnp.concatenate(xs, axis=-1)
        return [cat, row_sum(cat, tiles, count, tile_h=tile_h)]
    x0 = xs[0]
    batch, n = tuple(x0.shape[:-2]), KERNEL_PARTS * x0.shape[-1]
    s = slices(int(np.prod(batch)) if batch else 1, tiles.shape[-1], n, x0.dtype)
    outs = (jax.ShapeDtypeStruct((*x0.shape[:-1], n), x0.dtype), jax.ShapeDtypeStruct((*batch, n), x0.dtype),
            jax.ShapeDtypeStruct((*batch, s, n) if s > 1 else (0,), jnp.float32))
    cat, sums, _ = jax.ffi.ffi_call("pit_row_concat_sum", outs)(*xs, tiles, count, tile_h=np.int64(tile_h))
    return [cat, sums]


def _concat_jvp(primals, tangents, **params):
    outs = row_concat_sum_p.bind(*primals, **params)
    *xs, tiles, count = primals
    tans = [_zeros_for(t, x) for t, x in zip(tangents, xs)]
    return outs, row_concat_sum_p.bind(*tans, tiles, count, **params)


def _concat_transpose(cts, *args, tile_h, parts):
    *xs, tiles, count = args
    ct_cat, ct_sums = cts
    shape, dtype = xs[0].aval.shape, xs[0].aval.dtype
    ct_cat = (jnp.zeros((*shape[:-1], parts * shape[-1]), dtype) if type(ct_cat) is ad.Zero
              else listed_rows_only(ct_cat, tiles, count, shape[-2], tile_h))  # cat's other rows are unspecified
    db = None if type(ct_sums) is ad.Zero else ct_sums
    pieces = row_split(ct_cat, db, tiles, count, parts=parts, tile_h=tile_h)
    return [p if ad.is_undefined_primal(x) else None for p, x in zip(pieces, xs)] + [None, None]


def _concat_batch(args, dims, **params):
    args = _mapped_to_front(args, dims, batched=tuple(range(len(args))))  # the parts and the index
    return row_concat_sum_p.bind(*args, **params), [0, 0]


row_split_p.def_impl(lambda *args, **params: xla.apply_primitive(row_split_p, *args, **params))
row_split_p.def_abstract_eval(_split_abstract_eval)
ad.primitive_jvps[row_split_p] = _split_jvp
ad.primitive_transposes[row_split_p] = typed_cotangents(_split_transpose)
batching.primitive_batchers[row_split_p] = _split_batch
_lowering.register_traced_lowering(row_split_p, _split_expr, (), core=(
    (2, 1, 1, 0), lambda *, parts, **_: (2,) * parts))

row_concat_sum_p.def_impl(lambda *args, **params: xla.apply_primitive(row_concat_sum_p, *args, **params))
row_concat_sum_p.def_abstract_eval(_concat_abstract_eval)
ad.primitive_jvps[row_concat_sum_p] = _concat_jvp
ad.primitive_transposes[row_concat_sum_p] = typed_cotangents(_concat_transpose)
batching.primitive_batchers[row_concat_sum_p] = _concat_batch
_lowering.register_traced_lowering(row_concat_sum_p, _concat_native, ("pit_row_concat_sum",), core=(
    lambda *, parts, **_: (2,) * parts + (1, 0), (2, 1)))
