"""`row_layer_norm`: a layer norm over the listed row blocks of a padded batch.

    y = LN(x + residual + bias) * scale + offset     on the rows the index lists,
    y = 0                                            on every other row.

Operands: x [..., M, H]; residual x's shape or [0] (none); bias [H] or [0], scale [H],
offset [H] (float32); tiles [..., capacity], count [...] (an M-axis index of row blocks
of `tile_h` rows, x's batch dims). Float32 math (variance E[h^2] - E[h]^2, as Flax's
LayerNorm computes it by default), one rounding to x's dtype. This is what keeps a padded
model's residual adds and layer norms off its padding rows: XLA runs them over every row.

Autodiff differentiates the same expression written in jnp (`reference`), so a
differentiated step runs it over all rows; only a forward that is not differentiated
skips the padding. vmap moves the mapped axis into the batch dims (x, residual and the
index); a mapped bias, scale or offset falls back to the jnp expression.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax import reference as _ref
from pit_jax.primitives import _lowering, _products
from pit_jax.primitives._vma import Primitive, zero_tangent
from pit_jax.primitives.swrite import swrite

row_layer_norm_p = Primitive("pit_row_layer_norm")


def _check(x, residual, bias, scale, offset, tiles, count, *, tile_h):
    where = "row_layer_norm"
    if jnp.dtype(x.dtype) not in _products.FLOATS:
        raise TypeError(f"{where}: x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{where}: x must be [..., M, H], got shape {tuple(x.shape)}")
    m, h = x.shape[-2:]
    if residual.size and (tuple(residual.shape) != tuple(x.shape) or residual.dtype != x.dtype):
        raise ValueError(f"{where}: residual must be x's shape {tuple(x.shape)} and dtype {x.dtype}, "
                         f"got {tuple(residual.shape)} {residual.dtype}")
    for name, v, optional in (("bias", bias, True), ("scale", scale, False), ("offset", offset, False)):
        if v.dtype != jnp.float32 or v.ndim != 1 or (v.shape[0] != h and not (optional and v.shape[0] == 0)):
            raise ValueError(f"{where}: {name} must be float32 [H] = [{h}]"
                             f"{' (or [0])' if optional else ''}, got {v.dtype} {tuple(v.shape)}")
    if m and not 1 <= tile_h <= m:
        raise ValueError(f"{where}: tile_h must be in [1, M] = [1, {m}], got {tile_h}")
    batch = tuple(x.shape[:-2])
    if tuple(count.shape) != batch or tuple(tiles.shape[:-1]) != batch or tiles.ndim != len(batch) + 1:
        raise ValueError(f"{where}: the index's batch dims {tuple(count.shape)} (tiles {tuple(tiles.shape)}) "
                         f"must be x's {batch}")


def _abstract_eval(x, residual, bias, scale, offset, tiles, count, *, tile_h, epsilon):
    _check(x, residual, bias, scale, offset, tiles, count, tile_h=tile_h)
    return ShapedArray(x.shape, x.dtype)


def _native(x, residual, bias, scale, offset, tiles, count, *, tile_h, epsilon):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ffi.ffi_call("pit_row_layer_norm", out)(
        x, residual, bias, scale, offset, tiles, count, tile_h=np.int64(tile_h), epsilon=np.float32(epsilon)
    )


def _rows(tiles, count, m, tile_h, native):
    """bool [..., M]: the rows of the listed row blocks. Native: one SWrite of ones (a
    scatter kernel) instead of XLA's scatter of the list. (On the H100 the differentiated
    op ran 30-60 us per call slower than the same jnp expression given a ready mask, with
    either way of building it: the cause is not found.)"""
    if native:
        ones = jnp.ones((*tiles.shape, tile_h, 1), jnp.float32)
        base = jnp.zeros((*count.shape, m, 1), jnp.float32)
        return swrite(ones, tiles, count, base)[..., 0] > 0
    blocks = _ref.tile_mask_from_flat(tiles, count, -(-m // tile_h), 1)  # [..., tile_rows, 1]
    return _ref.element_mask(blocks, (tile_h, 1), (m, 1))[..., 0]


def reference(x, residual, bias, scale, offset, tiles, count, *, tile_h, epsilon, native_mask=False):
    """The same value in jnp, over every row (what autodiff differentiates)."""
    rows = _rows(tiles, count, x.shape[-2], tile_h, native_mask)
    return _ref.layer_norm_rows(x, scale, offset, rows, residual=residual if residual.size else None,
                                bias=bias if bias.size else None, epsilon=epsilon)


def row_layer_norm(x, residual, bias, scale, offset, tiles, count, *, tile_h, epsilon):
    """x [..., M, H]; residual / bias None or arrays; scale, offset [H]; the flat index list."""
    if residual is None:
        residual = jnp.zeros((0,), x.dtype)
    if bias is None:
        bias = jnp.zeros((0,), jnp.float32)
    return row_layer_norm_p.bind(x, residual, bias, scale, offset, tiles, count, tile_h=int(tile_h),
                                 epsilon=float(epsilon))


def _jvp(primals, tangents, **params):
    live = [i for i, t in enumerate(tangents[:5]) if type(t) is not ad.Zero]
    if not live:
        out = row_layer_norm_p.bind(*primals, **params)
        return out, zero_tangent(out)

    def f(*vals):
        args = list(primals)
        for i, v in zip(live, vals):
            args[i] = v
        return reference(*args, **params, native_mask=True)

    return jax.jvp(f, [primals[i] for i in live], [tangents[i] for i in live])


def _batch(args, dims, **params):
    x, residual, bias, scale, offset, tiles, count = args
    dx, dres, dbias, dscale, doffset, dtiles, dcount = dims
    if any(d is not None for d in (dbias, dscale, doffset)):
        return jax.vmap(functools.partial(reference, **params), in_axes=tuple(dims))(*args), 0
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    def front(a, d):
        return jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size, *a.shape))

    x, tiles, count = front(x, dx), front(tiles, dtiles), front(count, dcount)
    if residual.size or dres is not None:
        residual = front(residual, dres)
    return row_layer_norm_p.bind(x, residual, bias, scale, offset, tiles, count, **params), 0


row_layer_norm_p.def_impl(lambda *args, **params: xla.apply_primitive(row_layer_norm_p, *args, **params))
row_layer_norm_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[row_layer_norm_p] = _jvp
batching.primitive_batchers[row_layer_norm_p] = _batch
_lowering.register_traced_lowering(row_layer_norm_p, _native, ("pit_row_layer_norm",), core=((2, 2, 1, 1, 1, 1, 0), (2,)))
