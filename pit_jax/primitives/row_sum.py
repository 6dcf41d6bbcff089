"""`row_sum`: column sums over the listed rows of a padded batch, and its transpose `row_bcast`.

    row_sum(x)[..., :]     = the sum of x[..., r, :] over the rows r the index lists
    row_bcast(v)[..., r, :] = v on the listed rows, 0 on every other row

Operands: x [..., M, N]; v [N] or [..., N]; tiles [..., capacity], count [...] (an M-axis
index of row blocks of `tile_h` rows, x's batch dims). What they are for: a bias added on
the live rows only (`sparse_dense(..., dead_rows="zeros")`) has `row_bcast` as its tangent,
so its gradient is `row_sum` of the cotangent, which reads the live rows only; a bias on
every row has XLA's column sum of the cotangent as its gradient, a read of every row,
padding included. `row_sum` accumulates in float32 in a fixed order (the same result on
every run) and rounds once to x's dtype (`pit_row_sum`).

Autodiff: both are linear, each the other's transpose. vmap moves the mapped axis into
row_sum's batch dims; row_bcast (a jnp expression in every lowering: the primitive exists
for its transpose) vmaps its expression.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives import _lowering, _products
from pit_jax.primitives._vma import Primitive, typed_cotangents, zero_tangent
from pit_jax.primitives.row_layer_norm import _mapped_to_front, check_row_index, listed_rows_only

row_sum_p = Primitive("pit_row_sum")
row_bcast_p = Primitive("pit_row_bcast")

# About two blocks of the kernel per SM of an H100 (132 SMs): the list is split into this
# many slices over the column blocks and batch entries, each summed apart, then in order.
_TARGET_BLOCKS = 264
_SLICE_ROWS = 8  # list slots a block takes at a time (the kernel's kSplit)


# -- row_sum ---------------------------------------------------------------------------


def row_sum(x, tiles, count, *, tile_h):
    """x [..., M, N] -> [..., N] in x's dtype: the sums over the listed rows."""
    return row_sum_p.bind(x, tiles, count, tile_h=int(tile_h))


def _abstract_eval(x, tiles, count, *, tile_h):
    if jnp.dtype(x.dtype) not in _products.FLOATS:
        raise TypeError(f"row_sum: x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"row_sum: x must be [..., M, N], got shape {tuple(x.shape)}")
    check_row_index("row_sum", x.shape, tiles, count, tile_h, "the rows'")
    return ShapedArray((*x.shape[:-2], x.shape[-1]), x.dtype)


def slices(batch, capacity, n, dtype) -> int:
    """The list slices the kernel sums apart (the work buffer's length), from the shapes."""
    size = jnp.dtype(dtype).itemsize
    vec = 16 // size if (n * size) % 16 == 0 else 1
    blocks = max(1, -(-n // (32 * vec))) * max(1, batch)
    return int(max(1, min(-(-_TARGET_BLOCKS // blocks), -(-capacity // _SLICE_ROWS), 65535)))


def _native(x, tiles, count, *, tile_h):
    batch = tuple(x.shape[:-2])
    n = x.shape[-1]
    s = slices(math.prod(batch), tiles.shape[-1], n, x.dtype)
    work = jax.ShapeDtypeStruct((*batch, s, n) if s > 1 else (0,), jnp.float32)
    sums, _ = jax.ffi.ffi_call("pit_row_sum", (jax.ShapeDtypeStruct((*batch, n), x.dtype), work))(
        x, tiles, count, tile_h=np.int64(tile_h))
    return sums


def _jvp(primals, tangents, **params):
    out = row_sum_p.bind(*primals, **params)
    if type(tangents[0]) is ad.Zero:
        return out, zero_tangent(out)
    return out, row_sum_p.bind(tangents[0], *primals[1:], **params)


def _transpose(ct, x, tiles, count, *, tile_h):
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval), None, None]
    return [row_bcast(ct, tiles, count, m=x.aval.shape[-2], tile_h=tile_h).astype(x.aval.dtype), None, None]


def _batch(args, dims, **params):
    return row_sum_p.bind(*_mapped_to_front(args, dims, batched=(0, 1, 2)), **params), 0


# -- row_bcast -------------------------------------------------------------------------


def row_bcast(v, tiles, count, *, m, tile_h):
    """v [N] or [..., N] (the index's batch dims) -> [..., M, N]: v on the listed rows, 0 elsewhere."""
    return row_bcast_p.bind(v, tiles, count, m=int(m), tile_h=int(tile_h))


def bcast_reference(v, tiles, count, *, m, tile_h):
    return listed_rows_only(v[..., None, :] if v.ndim > 1 else v, tiles, count, m, tile_h)


def _bcast_abstract_eval(v, tiles, count, *, m, tile_h):
    batch = tuple(count.shape)
    if v.ndim < 1 or (v.ndim > 1 and tuple(v.shape[:-1]) != batch):
        raise ValueError(f"row_bcast: v must be [N] or [..., N] with the index's batch dims {batch}, "
                         f"got {tuple(v.shape)}")
    check_row_index("row_bcast", (*batch, m, v.shape[-1]), tiles, count, tile_h, "the rows'")
    return ShapedArray((*batch, m, v.shape[-1]), v.dtype)


def _bcast_jvp(primals, tangents, **params):
    out = row_bcast_p.bind(*primals, **params)
    if type(tangents[0]) is ad.Zero:
        return out, zero_tangent(out)
    return out, row_bcast_p.bind(tangents[0], *primals[1:], **params)


def vector_cotangent(sums, aval):
    """Per-entry sums [..., N] as the cotangent of a vector `aval` ([N] or [..., N]): an
    unbatched vector's sums the batch entries too (in float32), in the vector's dtype."""
    lead = sums.ndim - aval.ndim
    if lead:
        sums = jnp.sum(sums.astype(jnp.float32), axis=tuple(range(lead)))
    return sums.astype(aval.dtype)


def _bcast_transpose(ct, v, tiles, count, *, m, tile_h):
    if type(ct) is ad.Zero:
        return [ad.Zero(v.aval), None, None]
    return [vector_cotangent(row_sum(ct.astype(v.aval.dtype), tiles, count, tile_h=tile_h), v.aval), None, None]


def _bcast_batch(args, dims, **params):
    return jax.vmap(functools.partial(bcast_reference, **params), in_axes=tuple(dims))(*args), 0


row_sum_p.def_impl(lambda *args, **params: xla.apply_primitive(row_sum_p, *args, **params))
row_sum_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[row_sum_p] = _jvp
ad.primitive_transposes[row_sum_p] = typed_cotangents(_transpose)
batching.primitive_batchers[row_sum_p] = _batch
_lowering.register_traced_lowering(row_sum_p, _native, ("pit_row_sum",), core=((2, 1, 0), (1,)))

row_bcast_p.def_impl(lambda *args, **params: xla.apply_primitive(row_bcast_p, *args, **params))
row_bcast_p.def_abstract_eval(_bcast_abstract_eval)
ad.primitive_jvps[row_bcast_p] = _bcast_jvp
ad.primitive_transposes[row_bcast_p] = typed_cotangents(_bcast_transpose)
batching.primitive_batchers[row_bcast_p] = _bcast_batch
_lowering.register_traced_lowering(row_bcast_p, bcast_reference, (), core=((1, 1, 0), (2,)))
