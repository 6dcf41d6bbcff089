"""`sread`: gather live micro-tiles into a packed dense buffer (PIT's SRead).

Operands x [..., R, C], tiles [..., capacity], count [...] (the index's flat list; same
leading dims). Result packed [..., capacity, h, w]: slot s holds tile tiles[s] (zeros
where a partial edge tile has no elements), slots past min(count, capacity) are zero.
Linear in x; its transpose is an accumulating `swrite` into zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives import _lowering
from pit_jax.primitives._vma import Primitive, typed_cotangents, zero_tangent

sread_p = Primitive("pit_sread")


def _abstract_eval(x, tiles, count, *, tile):
    if tuple(count.shape) != tuple(x.shape[:-2]) or tuple(tiles.shape[:-1]) != tuple(x.shape[:-2]):
        raise ValueError(f"sread: the index's batch dims {tuple(count.shape)} differ from x's {tuple(x.shape[:-2])}")
    return ShapedArray((*x.shape[:-2], tiles.shape[-1], *tile), x.dtype)


def _native(x, tiles, count, *, tile):
    out = jax.ShapeDtypeStruct((*x.shape[:-2], tiles.shape[-1], *tile), x.dtype)
    return jax.ffi.ffi_call("pit_sread", out)(x, tiles, count, tile_h=np.int64(tile[0]), tile_w=np.int64(tile[1]))


def sread(x, tiles, count, *, tile):
    return sread_p.bind(x, tiles, count, tile=tuple(tile))


def _jvp(primals, tangents, *, tile):
    x, tiles, count = primals
    out = sread_p.bind(x, tiles, count, tile=tile)
    dx = tangents[0]
    if type(dx) is ad.Zero:
        return out, zero_tangent(out)
    return out, sread_p.bind(dx, tiles, count, tile=tile)


def _transpose(ct, x, tiles, count, *, tile):
    from pit_jax.primitives.swrite import swrite

    if type(ct) is ad.Zero or not ad.is_undefined_primal(x):
        return [None, None, None]
    zeros = jnp.zeros(x.aval.shape, x.aval.dtype)
    return [swrite(ct, tiles, count, zeros, accumulate=True), None, None]


def _batch(args, dims, *, tile):
    x, tiles, count = _align_batch(args, dims)
    return sread_p.bind(x, tiles, count, tile=tile), 0


def _align_batch(args, dims):
    """Moves the vmapped axis of every operand to the front, broadcasting the others."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    return [jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]


sread_p.def_impl(lambda *args, **params: xla.apply_primitive(sread_p, *args, **params))
sread_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[sread_p] = _jvp
ad.primitive_transposes[sread_p] = typed_cotangents(_transpose)
batching.primitive_batchers[sread_p] = _batch
_lowering.register_traced_lowering(sread_p, _native, ("pit_sread",), core=((2, 1, 0), (3,)))
