"""`row_activation`: an activation on the listed rows of a padded batch, with its gradient.

    y = act(z)   on the rows the index lists,
    y = fill     on every other row (fill [N], or zeros)

Operands: z [..., M, N]; fill [N] in z's dtype or [0]; tiles [..., capacity], count [...]
(an M-axis index of row blocks of `tile_h` rows, z's batch dims). Float32 math, one
rounding. What it is for: in a differentiated step the M-axis product with an activation
(`row_linear`) gives z = x @ w + bias (the bias on dead rows) from its fused kernel, and
this op runs the activation - and in the backward its derivative - on the live rows
only, where XLA's elementwise fusions ran over every row (compute-bound for GELU's erf).
The dead rows' value is `fill` = act(bias), not read from z, so their cotangent goes to
fill (the sum of dy over the dead rows), none to z.

Autodiff: the JVP is a linear primitive (`row_activation_lin_p`, the jnp tangent map,
evaluated only in forward mode) whose transpose is the backward target
`pit_row_activation_bwd` (dz = dy * act'(z) on the listed rows, 0 elsewhere) plus a
masked column sum for fill. Second order differentiates the backward's jnp expression.
vmap moves the mapped axis into the batch dims; a mapped fill falls back to jnp.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax import _activations
from pit_jax.primitives import _lowering, _products
from pit_jax.primitives._vma import Primitive, typed_cotangents, zero_tangent
from pit_jax.primitives.row_layer_norm import _mapped_to_front, _rows, check_row_index

row_activation_p = Primitive("pit_row_activation")
row_activation_lin_p = Primitive("pit_row_activation_lin")
row_activation_bwd_p = Primitive("pit_row_activation_bwd")

NAMES = ("relu", "gelu", "gelu_exact", "silu", "swish")  # the kernels' activations (_lowering.ACTIVATION_CODES)


def _check(z, tiles, count, *, tile_h, activation, where="row_activation"):
    if jnp.dtype(z.dtype) not in _products.FLOATS:
        raise TypeError(f"{where}: z must be float32, bfloat16 or float16, got {z.dtype}")
    if z.ndim < 2:
        raise ValueError(f"{where}: z must be [..., M, N], got shape {tuple(z.shape)}")
    if activation not in NAMES:
        raise ValueError(f"{where}: activation must be one of {NAMES}, got {activation!r}")
    check_row_index(where, z.shape, tiles, count, tile_h, "z's")


def _act(activation):
    return _activations.ACTIVATIONS[activation]


def _act_grad(activation, v):
    """act'(v), elementwise, in jnp (differentiable again)."""
    return jax.jvp(_act(activation), (v,), (jnp.ones_like(v),))[1]


def reference(z, fill, tiles, count, *, tile_h, activation):
    """The same value in jnp over every row. z's unlisted rows are never read: they are
    replaced before any arithmetic (a product's z holds nothing there, and NaN * 0 in a
    derivative of this expression would leak out)."""
    rows = _rows(tiles, count, z.shape[-2], tile_h, True)
    z = jnp.where(rows[..., None], z, jnp.zeros((), z.dtype))
    other = fill.astype(jnp.float32) if fill.size else jnp.zeros((z.shape[-1],), jnp.float32)
    return jnp.where(rows[..., None], _act(activation)(z.astype(jnp.float32)), other).astype(z.dtype)


def row_activation(z, fill, tiles, count, *, tile_h, activation):
    """z [..., M, N]; fill [N] (z's dtype) or None (zeros); the flat index list."""
    if fill is None:
        fill = jnp.zeros((0,), z.dtype)
    return row_activation_p.bind(z, fill.astype(z.dtype), tiles, count, tile_h=int(tile_h), activation=activation)


def _abstract_eval(z, fill, tiles, count, *, tile_h, activation):
    _check(z, tiles, count, tile_h=tile_h, activation=activation)
    if fill.ndim != 1 or fill.shape[0] not in (0, z.shape[-1]) or fill.dtype != z.dtype:
        raise ValueError(f"row_activation: fill must be [N] = [{z.shape[-1]}] in z's dtype {z.dtype} (or [0]), "
                         f"got {fill.dtype} {tuple(fill.shape)}")
    return ShapedArray(z.shape, z.dtype)


def _native(z, fill, tiles, count, *, tile_h, activation):
    return jax.ffi.ffi_call("pit_row_activation", jax.ShapeDtypeStruct(z.shape, z.dtype))(
        z, fill, tiles, count, tile_h=np.int64(tile_h), activation=np.int64(_lowering.ACTIVATION_CODES[activation]))


def _jvp(primals, tangents, **params):
    out = row_activation_p.bind(*primals, **params)
    live = tuple(i for i, t in enumerate(tangents[:2]) if type(t) is not ad.Zero)
    if not live:
        return out, zero_tangent(out)
    z, fill, tiles, count = primals
    return out, row_activation_lin_p.bind(z, fill, tiles, count, *(tangents[i] for i in live), live=live, **params)


def _batch(args, dims, **params):
    if dims[1] is not None:  # a mapped fill: the jnp expression
        return jax.vmap(functools.partial(reference, **params), in_axes=tuple(dims))(*args), 0
    return row_activation_p.bind(*_mapped_to_front(args, dims, batched=(0, 2, 3)), **params), 0  # z, tiles, count


# -- the tangent map and its transpose -----------------------------------------------------


def _tangent_map(z, fill, tiles, count, *tans, live, tile_h, activation, dead_zeros=True):
    """jnp: the tangent for the tangents of z and / or fill (`live`: indices 0, 1)."""
    primals = [z, fill]

    def f(*vals):
        args = list(primals)
        for i, v in zip(live, vals):
            args[i] = v
        return reference(*args, tiles, count, tile_h=tile_h, activation=activation)

    return jax.jvp(f, [primals[i] for i in live], list(tans))[1]


def _lin_abstract_eval(z, fill, tiles, count, *tans, live, tile_h, activation, dead_zeros=True):
    _check(z, tiles, count, tile_h=tile_h, activation=activation)
    return ShapedArray(z.shape, z.dtype)


def _lin_transpose(ct, z, fill, tiles, count, *tans, live, tile_h, activation, dead_zeros=True):
    """dead_zeros False (row_linear, when every reader of z's cotangent takes the listed
    rows only): z's cotangent is left unwritten off the list."""
    none = [None] * 4
    if type(ct) is ad.Zero:
        return none + [ad.Zero(t.aval) if ad.is_undefined_primal(t) else None for t in tans]
    out = []
    for i, t in zip(live, tans):
        if not ad.is_undefined_primal(t):
            out.append(None)
        elif i == 0:  # z: the listed rows only
            out.append(row_activation_bwd(z, tiles, count, ct, tile_h=tile_h, activation=activation,
                                          dead_zeros=dead_zeros))
        else:  # fill: the sum of the cotangent over the other rows (and the batch), as a
            # product with the dead rows' mask: one read of ct, no masked copy of it
            dead = jnp.logical_not(_rows(tiles, count, z.shape[-2], tile_h, True)).astype(ct.dtype)
            n = ct.shape[-1]
            out.append(jnp.matmul(dead.reshape(1, -1), ct.reshape(-1, n), preferred_element_type=jnp.float32)
                       .reshape(n).astype(t.aval.dtype))
    return none + out


def _lin_batch(args, dims, *, live, dead_zeros=True, **params):
    return jax.vmap(functools.partial(_tangent_map, live=live, **params), in_axes=tuple(dims))(*args), 0


def _lin_core(*, live, **_):
    return (2, 1, 1, 0, *((2, 1)[i] for i in live)), (2,)


# -- the backward target -------------------------------------------------------------------


def row_activation_bwd(z, tiles, count, dy, *, tile_h, activation, dead_zeros=True):
    """dz [..., M, N] in z's dtype: dy * act'(z) on the listed rows, 0 on the others; with
    dead_zeros False the others are left unwritten (unspecified), for a dz that only readers
    of the listed rows take (saves its writes of zeros: BERT b32's GELU backward writes
    18.5 MB of them a layer)."""
    return row_activation_bwd_p.bind(z, tiles, count, dy.astype(z.dtype), tile_h=int(tile_h), activation=activation,
                                     dead_zeros=bool(dead_zeros))


def bwd_reference(z, tiles, count, dy, *, tile_h, activation, dead_zeros=True):
    rows = _rows(tiles, count, z.shape[-2], tile_h, True)
    z = jnp.where(rows[..., None], z, jnp.zeros((), z.dtype))  # unlisted rows unread (reference)
    g = dy.astype(jnp.float32) * _act_grad(activation, z.astype(jnp.float32))
    return jnp.where(rows[..., None], g, 0.0).astype(z.dtype)


def _bwd_abstract_eval(z, tiles, count, dy, *, tile_h, activation, dead_zeros):
    _check(z, tiles, count, tile_h=tile_h, activation=activation, where="row_activation_bwd")
    if tuple(dy.shape) != tuple(z.shape) or dy.dtype != z.dtype:
        raise ValueError(f"row_activation_bwd: dy must be z's shape {tuple(z.shape)} and dtype {z.dtype}, "
                         f"got {tuple(dy.shape)} {dy.dtype}")
    return ShapedArray(z.shape, z.dtype)


def _bwd_native(z, tiles, count, dy, *, tile_h, activation, dead_zeros):
    return jax.ffi.ffi_call("pit_row_activation_bwd", jax.ShapeDtypeStruct(z.shape, z.dtype))(
        z, tiles, count, dy, tile_h=np.int64(tile_h), activation=np.int64(_lowering.ACTIVATION_CODES[activation]),
        dead_zeros=bool(dead_zeros))


def _bwd_jvp(primals, tangents, **params):
    """Second order: the jvp of the backward's jnp expression."""
    out = row_activation_bwd_p.bind(*primals, **params)
    live = [i for i in (0, 3) if type(tangents[i]) is not ad.Zero]
    if not live:
        return out, zero_tangent(out)

    def f(*vals):
        args = list(primals)
        for i, v in zip(live, vals):
            args[i] = v
        return bwd_reference(*args, **params)

    return out, jax.jvp(f, [primals[i] for i in live], [tangents[i] for i in live])[1]


def _bwd_batch(args, dims, **params):
    return row_activation_bwd_p.bind(*_mapped_to_front(args, dims, batched=range(4)), **params), 0


row_activation_p.def_impl(lambda *args, **params: xla.apply_primitive(row_activation_p, *args, **params))
row_activation_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[row_activation_p] = _jvp
batching.primitive_batchers[row_activation_p] = _batch
_lowering.register_traced_lowering(row_activation_p, _native, ("pit_row_activation",), core=((2, 1, 1, 0), (2,)))

row_activation_lin_p.def_impl(lambda *args, **params: xla.apply_primitive(row_activation_lin_p, *args, **params))
row_activation_lin_p.def_abstract_eval(_lin_abstract_eval)
ad.primitive_transposes[row_activation_lin_p] = typed_cotangents(_lin_transpose)
batching.primitive_batchers[row_activation_lin_p] = _lin_batch
_lowering.register_traced_lowering(row_activation_lin_p, _tangent_map, (), core=(
    lambda **p: _lin_core(**p)[0], lambda **p: _lin_core(**p)[1]))

row_activation_bwd_p.def_impl(lambda *args, **params: xla.apply_primitive(row_activation_bwd_p, *args, **params))
row_activation_bwd_p.def_abstract_eval(_bwd_abstract_eval)
ad.primitive_jvps[row_activation_bwd_p] = _bwd_jvp
batching.primitive_batchers[row_activation_bwd_p] = _bwd_batch
_lowering.register_traced_lowering(row_activation_bwd_p, _bwd_native, ("pit_row_activation_bwd",),
                                   core=((2, 1, 0, 2), (2,)))
