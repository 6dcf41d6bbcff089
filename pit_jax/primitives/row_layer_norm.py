"""`row_layer_norm`: a layer norm over the listed row blocks of a padded batch.

    y = LN(x + residual + bias) * scale + offset     on the rows the index lists,
    y = 0                                            on every other row.

Operands: x [..., M, H]; residual x's shape or [0] (none); bias [H] or [0], scale [H],
offset [H] (float32); tiles [..., capacity], count [...] (an M-axis index of row blocks
of `tile_h` rows, x's batch dims). Float32 math (variance E[h^2] - E[h]^2, as Flax's
LayerNorm computes it by default), one rounding to x's dtype. This is what keeps a padded
model's residual adds and layer norms off its padding rows: XLA runs them over every row.

Autodiff: the JVP is a linear primitive (`row_layer_norm_lin_p`, the jnp tangent map,
only evaluated in forward mode) whose transpose is the backward target
`pit_row_layer_norm_bwd` (`row_layer_norm_bwd_p`): the cotangents on the listed rows
only, with the column sums for scale, offset and bias added in a fixed order. Second
order differentiates the backward's jnp expression. vmap moves the mapped axis into
the batch dims (x, residual and the index); a mapped bias, scale or offset falls back to
the jnp expression.

`copies` = n returns y n times (the same buffer): a y with two consumers (a residual
stream: the next product and the next norm's residual) gets each consumer's cotangent
apart, and the backward kernel adds the two on the listed rows (its `dy2`), where JAX
would add them over every row before the transpose.
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
from pit_jax.primitives._vma import Primitive, typed_cotangents, zero_tangent
from pit_jax.primitives.swrite import swrite

row_layer_norm_p = Primitive("pit_row_layer_norm")
row_layer_norm_p.multiple_results = True  # `copies` outputs
row_layer_norm_lin_p = Primitive("pit_row_layer_norm_lin")
row_layer_norm_lin_p.multiple_results = True
row_layer_norm_bwd_p = Primitive("pit_row_layer_norm_bwd")
row_layer_norm_bwd_p.multiple_results = True

TANGENTS = ("x", "residual", "bias", "scale", "offset")  # the differentiable operands, in order
_TANGENT_RANKS = (2, 2, 1, 1, 1)  # their own ranks (no batch dims), for _partition


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
    check_row_index(where, x.shape, tiles, count, tile_h, "x's")


def check_row_index(where, shape, tiles, count, tile_h, owner):
    """The row-wise ops' index check: tile_h in [1, M] and the flat list (tiles [...,
    capacity], count [...]) with the batch dims of `shape` [..., M, N] (`owner`: whose, in
    the message)."""
    m = shape[-2]
    if m and not 1 <= tile_h <= m:
        raise ValueError(f"{where}: tile_h must be in [1, M] = [1, {m}], got {tile_h}")
    batch = tuple(shape[:-2])
    if tuple(count.shape) != batch or tuple(tiles.shape[:-1]) != batch or tiles.ndim != len(batch) + 1:
        raise ValueError(f"{where}: the index's batch dims {tuple(count.shape)} (tiles {tuple(tiles.shape)}) "
                         f"must be {owner} {batch}")


def _abstract_eval(x, residual, bias, scale, offset, tiles, count, *, tile_h, epsilon, skip_dead, copies):
    _check(x, residual, bias, scale, offset, tiles, count, tile_h=tile_h)
    return [ShapedArray(x.shape, x.dtype)] * copies


def _native(x, residual, bias, scale, offset, tiles, count, *, tile_h, epsilon, skip_dead, copies):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    y = jax.ffi.ffi_call("pit_row_layer_norm", out)(
        x, residual, bias, scale, offset, tiles, count, tile_h=np.int64(tile_h), epsilon=np.float32(epsilon),
        skip_dead=bool(skip_dead),
    )
    return [y] * copies


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


def listed_rows_only(y, tiles, count, m, tile_h, native=True, fill=0.0):
    """y (broadcast to [..., M, N]) on the listed rows, `fill` on the others (NaN: the
    jnp paths' value for rows left unspecified, so that a reader of them shows)."""
    return jnp.where(_rows(tiles, count, m, tile_h, native)[..., None], y, jnp.asarray(fill, y.dtype))


def reference(x, residual, bias, scale, offset, tiles, count, *, tile_h, epsilon, skip_dead=False,
              native_mask=False):
    """The same value in jnp, over every row (what autodiff differentiates); with
    skip_dead, NaN on the unlisted rows."""
    rows = _rows(tiles, count, x.shape[-2], tile_h, native_mask)
    y = _ref.layer_norm_rows(x, scale, offset, rows, residual=residual if residual.size else None,
                             bias=bias if bias.size else None, epsilon=epsilon)
    # NaN off the list: a constant there, so its tangent is zero (the kernels' rule).
    return jnp.where(rows[..., None], y, jnp.nan) if skip_dead else y


def row_layer_norm(x, residual, bias, scale, offset, tiles, count, *, tile_h, epsilon, skip_dead=False, copies=1):
    """x [..., M, H]; residual / bias None or arrays; scale, offset [H]; the flat index list.
    skip_dead: the unlisted rows are left unwritten; they carry no gradient (as zeros there would).
    copies > 1: a tuple of that many references to y, one per consumer (module docstring)."""
    if residual is None:
        residual = jnp.zeros((0,), x.dtype)
    if bias is None:
        bias = jnp.zeros((0,), jnp.float32)
    outs = row_layer_norm_p.bind(x, residual, bias, scale, offset, tiles, count, tile_h=int(tile_h),
                                 epsilon=float(epsilon), skip_dead=bool(skip_dead), copies=int(copies))
    return outs[0] if copies == 1 else tuple(outs)


def _jvp(primals, tangents, **params):
    live = tuple(i for i, t in enumerate(tangents[:5]) if type(t) is not ad.Zero)
    outs = row_layer_norm_p.bind(*primals, **params)
    if not live:
        return outs, [zero_tangent(o) for o in outs]
    # skip_dead changes only the primal's unlisted rows, which carry no tangent either way.
    params.pop("skip_dead")
    x, residual, bias, scale, _, tiles, count = primals
    t_outs = row_layer_norm_lin_p.bind(x, residual, bias, scale, tiles, count, *(tangents[i] for i in live),
                                       live=live, **params)
    return outs, t_outs


# -- the tangent map and its transpose -----------------------------------------------------


def _tangent_map(x, residual, bias, scale, tiles, count, *tans, live, tile_h, epsilon, copies):
    """jnp: the forward's tangent for the tangents of the operands `live` names (indices
    into TANGENTS), over every row, once per copy."""
    primals = [x, residual, bias, scale, jnp.zeros_like(scale)]

    def f(*vals):
        args = list(primals)
        for i, v in zip(live, vals):
            args[i] = v
        return reference(*args, tiles, count, tile_h=tile_h, epsilon=epsilon, native_mask=True)

    return [jax.jvp(f, [primals[i] for i in live], list(tans))[1]] * copies


def _lin_abstract_eval(x, residual, bias, scale, tiles, count, *tans, live, tile_h, epsilon, copies):
    _check(x, residual, bias, scale, scale, tiles, count, tile_h=tile_h)
    return [ShapedArray(x.shape, x.dtype)] * copies


def _lin_transpose(cts, x, residual, bias, scale, tiles, count, *tans, live, tile_h, epsilon, copies):
    none = [None] * 6
    cts = [ct for ct in cts if type(ct) is not ad.Zero]
    if not cts:
        return none + [None if not ad.is_undefined_primal(t) else ad.Zero(t.aval) for t in tans]
    # The kernel adds a second consumer's cotangent on the listed rows; more than two
    # consumers (not a pattern the models have) add the rest first, over every row.
    dy2 = functools.reduce(jnp.add, cts[2:], cts[1]) if len(cts) > 1 else None
    dh, dvec = row_layer_norm_bwd(x, residual, bias, scale, tiles, count, cts[0], tile_h=tile_h, epsilon=epsilon,
                                  dy2=dy2)
    dvec = jnp.sum(dvec, axis=tuple(range(dvec.ndim - 2)))  # a shared vector's: over the batch dims too
    by_name = {"x": dh, "residual": dh, "bias": dvec[2], "scale": dvec[0], "offset": dvec[1]}
    return none + [by_name[TANGENTS[i]].astype(t.aval.dtype) if ad.is_undefined_primal(t) else None
                   for i, t in zip(live, tans)]


def _lin_batch(args, dims, *, live, copies, **params):
    outs = jax.vmap(functools.partial(_tangent_map, live=live, copies=copies, **params), in_axes=tuple(dims))(*args)
    return outs, [0] * copies


def _lin_core(*, live, copies, **_):
    return (2, 2, 1, 1, 1, 0, *(_TANGENT_RANKS[i] for i in live)), (2,) * copies


# -- the backward target -------------------------------------------------------------------

# Warps per batch entry of the backward kernel (blocks of 8): a few list slots each, so a
# warp's rows are few; the column sums' slices (one [3, H] per block, or per warp for long
# rows) stay small. Rows of up to 3 16-byte vectors a lane (H * itemsize <= 1536 bytes: 768
# 16-bit elements) run two blocks an SM (cuda/kernels/row_layer_norm.cu), so 2048 warps fill
# one wave of an H100 with 2 slots each: at BERT's densities no warp holds two live rows
# (H100, BERT b32: 4 slots a warp 12.3 us a norm; 2 and 1 slot at one block an SM were
# slower, 14.8 / 17.7 us, as were 8 / 16 / 32 slots, 15.2 / 21.2 / 33.7 us).
_BLOCK = 8
_TWO_BLOCKS_MAX_ROW_BYTES = 3 * 32 * 16


def bwd_warps(capacity, tile_h, h, itemsize):
    """The backward kernel's warps per batch entry, from the index's capacity and the row
    (static)."""
    rows_per_warp, max_warps = (2, 2048) if h * itemsize <= _TWO_BLOCKS_MAX_ROW_BYTES else (4, 1024)
    w = max(1, min(max_warps, -(-capacity * tile_h // rows_per_warp)))
    return int(-(-w // _BLOCK) * _BLOCK)


def row_layer_norm_bwd(x, residual, bias, scale, tiles, count, dy, *, tile_h, epsilon, dy2=None):
    """(dh, dvec): dh = d(x + residual + bias) [..., M, H] in x's dtype (0 on unlisted
    rows) for the cotangent dy (+ dy2: a second consumer's, added in float32 on the
    listed rows); dvec [..., 3, H] float32: per batch entry, the sums over its rows of
    d scale, d offset and d bias."""
    dy2 = jnp.zeros((0,), x.dtype) if dy2 is None else dy2.astype(x.dtype)
    dh, dvec, _ = row_layer_norm_bwd_p.bind(x, residual, bias, scale, tiles, count, dy.astype(x.dtype), dy2,
                                            tile_h=int(tile_h), epsilon=float(epsilon),
                                            warps=bwd_warps(tiles.shape[-1], tile_h, x.shape[-1], x.dtype.itemsize))
    return dh, dvec


def bwd_reference(x, residual, bias, scale, tiles, count, dy, dy2, *, tile_h, epsilon, warps=1):
    """The backward in jnp over every row: (dh, dvec, work) as the target returns them
    (work, the kernel's scratch, as zeros). dy2 [0]: none; else added to dy in float32,
    rounded to x's dtype."""
    if dy2.size:
        dy = (dy.astype(jnp.float32) + dy2.astype(jnp.float32)).astype(x.dtype)
    batch, h = tuple(x.shape[:-2]), x.shape[-1]
    n = int(np.prod(batch)) if batch else 1
    flat = lambda a: a.reshape((n, *a.shape[len(batch):]))  # noqa: E731
    vec = jnp.zeros((h,), jnp.float32)
    bias_v = bias if bias.size else vec  # adding zeros: d bias is still the sum of dh

    def one(xb, rb, tb, cb, db):
        def g(xv, sv, ov, bv):
            return reference(xv, rb, bv, sv, ov, tb, cb, tile_h=tile_h, epsilon=epsilon, native_mask=True)

        _, vjp = jax.vjp(g, xb, scale, vec, bias_v)
        dxb, dsb, dob, dbb = vjp(db)
        return dxb, jnp.stack([dsb, dob, dbb])

    if residual.size:
        dh, dvec = jax.vmap(one)(flat(x), flat(residual), flat(tiles), count.reshape(-1), flat(dy.astype(x.dtype)))
    else:
        dh, dvec = jax.vmap(lambda xb, tb, cb, db: one(xb, residual, tb, cb, db))(
            flat(x), flat(tiles), count.reshape(-1), flat(dy.astype(x.dtype)))
    return [dh.reshape(x.shape), dvec.reshape((*batch, 3, h)), jnp.zeros((*batch, warps, 3, h), jnp.float32)]


def _bwd_abstract_eval(x, residual, bias, scale, tiles, count, dy, dy2, *, tile_h, epsilon, warps):
    _check(x, residual, bias, scale, scale, tiles, count, tile_h=tile_h)
    for name, v, optional in (("dy", dy, False), ("dy2", dy2, True)):
        if (tuple(v.shape) != tuple(x.shape) and not (optional and v.size == 0)) or v.dtype != x.dtype:
            raise ValueError(f"row_layer_norm_bwd: {name} must be x's shape {tuple(x.shape)}"
                             f"{' (or [0])' if optional else ''} and dtype {x.dtype}, got {tuple(v.shape)} {v.dtype}")
    if warps < 1:
        raise ValueError(f"row_layer_norm_bwd: warps must be >= 1, got {warps}")
    batch, h = tuple(x.shape[:-2]), x.shape[-1]
    return [ShapedArray(x.shape, x.dtype), ShapedArray((*batch, 3, h), jnp.float32),
            ShapedArray((*batch, warps, 3, h), jnp.float32)]


def _bwd_native(x, residual, bias, scale, tiles, count, dy, dy2, *, tile_h, epsilon, warps):
    batch, h = tuple(x.shape[:-2]), x.shape[-1]
    outs = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((*batch, 3, h), jnp.float32),
            jax.ShapeDtypeStruct((*batch, warps, 3, h), jnp.float32))
    return jax.ffi.ffi_call("pit_row_layer_norm_bwd", outs)(
        x, residual, bias, scale, tiles, count, dy, dy2, tile_h=np.int64(tile_h), epsilon=np.float32(epsilon))


def _bwd_jvp(primals, tangents, **params):
    """Second order: the jvp of the backward's jnp expression."""
    outs = row_layer_norm_bwd_p.bind(*primals, **params)
    live = [i for i, t in enumerate(tangents) if type(t) is not ad.Zero and i not in (4, 5)]
    if not live:
        return outs, [zero_tangent(o) for o in outs]

    def f(*vals):
        args = list(primals)
        for i, v in zip(live, vals):
            args[i] = v
        return bwd_reference(*args, **params)

    _, t_outs = jax.jvp(f, [primals[i] for i in live], [tangents[i] for i in live])
    return outs, t_outs


def _bwd_batch(args, dims, **params):
    if any(d is not None for d in dims[2:4]):  # a mapped bias or scale: the jnp expression
        return jax.vmap(functools.partial(bwd_reference, **params), in_axes=tuple(dims))(*args), [0, 0, 0]
    # x, residual, tiles, count, dy, dy2
    args = _mapped_to_front(args, dims, batched=(0, 1, 4, 5, 6, 7), optional=(1, 7))
    return row_layer_norm_bwd_p.bind(*args, **params), [0, 0, 0]


def _mapped_to_front(args, dims, *, batched, optional=()):
    """The operands with vmap's axis as one more leading batch dim of those at the
    positions `batched` (broadcast where unmapped); an absent operand at a position in
    `optional` (empty, unmapped: the layer norm's residual) stays absent."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    def front(i, a, d):
        if i not in batched or (i in optional and not a.size and d is None):
            return a
        return jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size, *a.shape))

    return [front(i, a, d) for i, (a, d) in enumerate(zip(args, dims))]


def _batch(args, dims, *, copies, **params):
    if any(d is not None for d in dims[2:5]):  # a mapped bias, scale or offset: the jnp expression
        y = jax.vmap(functools.partial(reference, **params), in_axes=tuple(dims))(*args)
        return [y] * copies, [0] * copies
    args = _mapped_to_front(args, dims, batched=(0, 1, 5, 6), optional=(1,))  # x, residual, tiles, count
    return row_layer_norm_p.bind(*args, copies=copies, **params), [0] * copies


row_layer_norm_p.def_impl(lambda *args, **params: xla.apply_primitive(row_layer_norm_p, *args, **params))
row_layer_norm_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[row_layer_norm_p] = _jvp
batching.primitive_batchers[row_layer_norm_p] = _batch
_lowering.register_traced_lowering(row_layer_norm_p, _native, ("pit_row_layer_norm",), core=(
    (2, 2, 1, 1, 1, 1, 0), lambda *, copies, **_: (2,) * copies))

row_layer_norm_lin_p.def_impl(lambda *args, **params: xla.apply_primitive(row_layer_norm_lin_p, *args, **params))
row_layer_norm_lin_p.def_abstract_eval(_lin_abstract_eval)
ad.primitive_transposes[row_layer_norm_lin_p] = typed_cotangents(_lin_transpose)
batching.primitive_batchers[row_layer_norm_lin_p] = _lin_batch
_lowering.register_traced_lowering(row_layer_norm_lin_p, _tangent_map, (), core=(
    lambda **p: _lin_core(**p)[0], lambda **p: _lin_core(**p)[1]))

row_layer_norm_bwd_p.def_impl(lambda *args, **params: xla.apply_primitive(row_layer_norm_bwd_p, *args, **params))
row_layer_norm_bwd_p.def_abstract_eval(_bwd_abstract_eval)
ad.primitive_jvps[row_layer_norm_bwd_p] = _bwd_jvp
batching.primitive_batchers[row_layer_norm_bwd_p] = _bwd_batch
_lowering.register_traced_lowering(row_layer_norm_bwd_p, _bwd_native, ("pit_row_layer_norm_bwd",),
                                   core=((2, 2, 1, 1, 1, 0, 2, 2), (2, 2, 3)))
