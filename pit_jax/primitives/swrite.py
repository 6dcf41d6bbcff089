"""`swrite`: scatter packed micro-tiles back to their places (PIT's SWrite).

Operands packed [..., capacity, h, w], tiles [..., capacity], count [...], base
[..., R, C]. Result: base with the listed tiles overwritten by (accumulate=False) or
added to (accumulate=True) their packed slots; every other element is base's. The
native target writes in place into base's buffer (aliased), so only the listed tiles
are touched. Linear in (packed, base); the transpose reads the tiles back (`sread`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives import _lowering
from pit_jax.primitives._vma import Primitive, typed_cotangents, zero_tangent
from pit_jax.primitives.sread import _align_batch, sread

swrite_p = Primitive("pit_swrite")


def _abstract_eval(packed, tiles, count, base, *, accumulate):
    lead = tuple(base.shape[:-2])
    if tuple(packed.shape[:-3]) != lead or tuple(count.shape) != lead or tuple(tiles.shape[:-1]) != lead:
        raise ValueError(f"swrite: packed, the index and base must share leading dims, base has {lead}")
    if packed.shape[-3] != tiles.shape[-1] or packed.dtype != base.dtype:
        raise ValueError("swrite: packed must be [..., capacity, h, w] in base's dtype")
    return ShapedArray(base.shape, base.dtype)


def _native(packed, tiles, count, base, *, accumulate):
    out = jax.ShapeDtypeStruct(base.shape, base.dtype)
    return jax.ffi.ffi_call("pit_swrite", out, input_output_aliases={3: 0})(
        packed, tiles, count, base, accumulate=bool(accumulate)
    )


def swrite(packed, tiles, count, base, *, accumulate=False):
    return swrite_p.bind(packed, tiles, count, base, accumulate=bool(accumulate))


def _zeros(aval):
    return jnp.zeros(aval.shape, aval.dtype)


def _jvp(primals, tangents, *, accumulate):
    packed, tiles, count, base = primals
    out = swrite_p.bind(packed, tiles, count, base, accumulate=accumulate)
    dp, _, _, db = tangents
    if type(dp) is ad.Zero and type(db) is ad.Zero:
        return out, zero_tangent(out)
    dp = _zeros(dp.aval) if type(dp) is ad.Zero else dp
    db = _zeros(db.aval) if type(db) is ad.Zero else db
    return out, swrite_p.bind(dp, tiles, count, db, accumulate=accumulate)


def _transpose(ct, packed, tiles, count, base, *, accumulate):
    if type(ct) is ad.Zero:
        return [None] * 4
    tile = packed.aval.shape[-2:] if ad.is_undefined_primal(packed) else packed.shape[-2:]
    ct_packed = sread(ct, tiles, count, tile=tile) if ad.is_undefined_primal(packed) else None
    ct_base = None
    if ad.is_undefined_primal(base):
        # Overwritten elements of base do not reach the output: zero them in the cotangent.
        if accumulate:
            ct_base = ct
        else:
            shape = (*ct.shape[:-2], tiles.shape[-1], *tile)
            ct_base = swrite(jnp.zeros(shape, ct.dtype), tiles, count, ct, accumulate=False)
    return [ct_packed, None, None, ct_base]


def _batch(args, dims, *, accumulate):
    return swrite_p.bind(*_align_batch(args, dims), accumulate=accumulate), 0


swrite_p.def_impl(lambda *args, **params: xla.apply_primitive(swrite_p, *args, **params))
swrite_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[swrite_p] = _jvp
ad.primitive_transposes[swrite_p] = typed_cotangents(_transpose)
batching.primitive_batchers[swrite_p] = _batch
_lowering.register_traced_lowering(swrite_p, _native, ("pit_swrite",), core=((3, 1, 0, 2), (2,)))
