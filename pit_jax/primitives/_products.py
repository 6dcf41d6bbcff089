"""Geometry and batching shared by the two sparse-product primitives.

Both products compute, per batch entry, `P = op_a(A) @ op_b(B)` where op is the
identity or a transpose of the stored row-major matrix; `stile_matmul` masks one
operand by its micro-tiles, `sdd_matmul` keeps only listed tiles of the result.

Batch convention (the same as the native targets, docs/kernels.md): every operand's
leading dims are a PREFIX of one full batch shape; an operand with fewer dims is
shared by the trailing entries (a weight shared by a batch of inputs). The result
has the first `out_batch` dims of the full batch and sums over the rest (that is how
the gradient of a shared weight sums over the batch).

The index arrays (six, in `PitIndex.arrays` order) are operands too, so transposes
can pick the lists they need; they have their owner's batch dims.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence, Tuple

import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad

from pit_jax.primitives._vma import zero_tangent


NUM_INDEX = 6  # tiles, count, row_tiles, row_count, col_tiles, col_count
INDEX_CORE = (1, 0, 2, 1, 2, 1)  # their ranks without batch dims
FLOATS = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def is_count(value) -> bool:
    """Whether `value` is a static count: an int (Python or NumPy, not a bool) >= 1 (an op's
    out_parts, a layer norm's copies)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1


def stored_dims(shape: Sequence[int], trans: bool) -> Tuple[int, int]:
    """(rows, cols) of op(X) for X stored as `shape` [..., r, c]."""
    r, c = shape[-2:]
    return (c, r) if trans else (r, c)


def full_batch(*batch_shapes: Tuple[int, ...], what: str) -> Tuple[int, ...]:
    """The longest of `batch_shapes`; every one must be a prefix of it."""
    full = max(batch_shapes, key=len)
    for s in batch_shapes:
        if tuple(full[: len(s)]) != tuple(s):
            raise ValueError(
                f"{what}: batch dims {tuple(s)} are not a prefix of {tuple(full)}; pit_jax products "
                f"share an operand over TRAILING batch entries only"
            )
    return tuple(full)


@dataclasses.dataclass(frozen=True)
class ProductShape:
    m: int
    n: int
    k: int
    full: Tuple[int, ...]
    out_shape: Tuple[int, ...]


def product_shape(a, b, idx_batch, *, trans_a, trans_b, trans_c, out_batch, what) -> ProductShape:
    m, k = stored_dims(a.shape, trans_a)
    kb, n = stored_dims(b.shape, trans_b)
    if k != kb:
        raise ValueError(f"{what}: inner dimensions differ: {k} (a) vs {kb} (b)")
    if a.dtype != b.dtype or a.dtype not in FLOATS:
        raise TypeError(f"{what}: a and b must share a float32/bfloat16/float16 dtype, got {a.dtype} and {b.dtype}")
    full = full_batch(tuple(a.shape[:-2]), tuple(b.shape[:-2]), tuple(idx_batch), what=what)
    if out_batch > len(full):
        raise ValueError(f"{what}: out_batch {out_batch} exceeds the {len(full)} batch dims")
    tail = (n, m) if trans_c else (m, n)
    return ProductShape(m, n, k, full, tuple(full[:out_batch]) + tail)


def index_batch(index_avals) -> Tuple[int, ...]:
    """Leading dims of the index (those of its count)."""
    return tuple(index_avals[1].shape)


def has_rows(index_avals) -> bool:
    """Whether the index carries per-tile-row lists ([..., tile_rows, tile_cols])."""
    return index_avals[2].shape[-1] > 0


def has_cols(index_avals) -> bool:
    return index_avals[4].shape[-1] > 0


# -- autodiff -------------------------------------------------------------------------


def bilinear_tangent(prim, primals, tangents, *, both_flag=None, **params):
    """d prim(a, b, *index) of a product bilinear in (a, b), or None when both tangents are zero.
    both_flag: the name of a bool param set on the a-term when the b-term exists too (so
    that its transpose may share work with the b-term's)."""
    a, b, *idx = primals
    da, db = tangents[:2]
    terms = []
    if type(da) is not ad.Zero:
        a_params = dict(params, **{both_flag: type(db) is not ad.Zero}) if both_flag else params
        terms.append(prim.bind(da, b, *idx, **a_params))
    if type(db) is not ad.Zero:
        terms.append(prim.bind(a, db, *idx, **params))
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else terms[0] + terms[1]


def bilinear_jvp(prim, both_flag=None):
    """JVP rule of a product bilinear in its first two operands (the index is constant);
    both_flag as for bilinear_tangent."""

    def jvp(primals, tangents, **params):
        out = prim.bind(*primals, **params)
        dout = bilinear_tangent(prim, primals, tangents, both_flag=both_flag, **params)
        return out, zero_tangent(out) if dout is None else dout

    return jvp


# -- batching -------------------------------------------------------------------------


def batch_rule(prim, args, dims, *, owner: str, **params):
    """vmap of a product primitive: the vmapped axis becomes the first batch dim.

    `owner` ("a", "b" or "c") is the matrix the index belongs to; the native targets need
    the index to have exactly its owner's batch dims. Operands that are not vmapped keep
    being shared when they have no batch dims; otherwise they (or the index) are
    broadcast over the new axis to keep the prefix convention.
    """
    a, b, *idx = args
    da, db, *didx = dims
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)

    def front(x, d):
        return x if d is None else jnp.moveaxis(x, d, 0)

    def bcast(x):
        return jnp.broadcast_to(x, (size, *x.shape))

    a, b = front(a, da), front(b, db)
    idx = [front(x, d) for x, d in zip(idx, didx)]
    a_in, b_in = da is not None, db is not None
    i_in = any(d is not None for d in didx)
    if i_in:  # all six index arrays move together
        idx = [x if d is not None else bcast(x) for x, d in zip(idx, didx)]
    if not a_in and a.ndim > 2:
        a, a_in = bcast(a), True
    if not b_in and b.ndim > 2:
        b, b_in = bcast(b), True
    owner_in = {"a": a_in, "b": b_in, "c": True}[owner]
    if owner_in and not i_in:
        idx, i_in = [bcast(x) for x in idx], True
    if i_in and not owner_in:
        if owner == "a":
            a = bcast(a)
        else:
            b = bcast(b)
    params = dict(params, out_batch=params["out_batch"] + 1)
    return prim.bind(a, b, *idx, **params), 0


def flat_as_group(tiles, count):
    """A flat list seen as the single group of a grouped-list operand."""
    return tiles[..., None, :], count[..., None]
