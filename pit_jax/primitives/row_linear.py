"""`row_linear`: the M-axis product with its bias and activation in the kernel's epilogue.

    y = act((x ∘ rows) @ w + bias)

`rows` = the row blocks of x listed by the index operands (tiles, count, row_tiles,
row_count, col_tiles, col_count; exactly x's batch dims), `bias` [N] or [0] (none) in
x's dtype or float32 (rounded to x's dtype first, as a cast would, but in the kernel),
`activation` None or a name of `ACTIVATIONS`. Live rows get the product, the bias and
the activation before the one rounding to x's dtype; dead rows are written act(bias)
(zeros without a bias), or zeros with `zero_dead`, and cost no product. This is what
keeps a padded model's bias and activation off its padding rows: XLA would run them over
every row. With `zero_dead` the bias is on the live rows only, so its gradient sums the
cotangent over the live rows (`row_sum`) instead of every row. With `skip_dead`
(`dead_rows="unspecified"`) the dead rows are not written at all (NaN on the CPU and in
the jnp paths); autodiff is that of `zero_dead`, whose dead rows are constants too: they
carry no tangent and their cotangent is never read.

Autodiff: the primal comes from the fused kernel; with an activation it is
`row_linear_pre`, which also returns z = x @ w + bias on the live rows (the activation's
input, a residual no op reads off the list, so its other rows are not written), and the
activation's derivative runs on the live rows only (`row_activation`'s tangent map and
backward). The tangent is the linear map (stile_matmul of the tangents, plus the bias's),
transposed to PIT products. vmap batches like stile_matmul; a vmapped bias falls back to
the unfused expression.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax import _activations
from pit_jax.primitives import _lowering, _products
from pit_jax.primitives._vma import Primitive, zero_tangent
from pit_jax.primitives.row_activation import row_activation, row_activation_lin_p
from pit_jax.primitives.row_layer_norm import listed_rows_only
from pit_jax.primitives.row_split import row_split
from pit_jax.primitives.row_sum import row_bcast
from pit_jax.primitives.stile_matmul import plan, stile_matmul

row_linear_p = Primitive("pit_row_linear")
# (act(z), z) from one kernel, z on the listed rows only: the primal of a differentiated
# row_linear with an activation (fused_jvp).
row_linear_pre_p = Primitive("pit_row_linear_pre")
row_linear_pre_p.multiple_results = True

ACTIVATIONS = tuple(name for name in _lowering.ACTIVATION_CODES if name is not None)


def _tile(x, tile_h):
    return (tile_h, x.shape[-1])


def _check(x, w, bias, idx, *, tile_h, activation):
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"row_linear: activation must be None or one of {ACTIVATIONS}, got {activation!r}")
    n = w.shape[-1]
    if bias.ndim != 1 or bias.shape[0] not in (0, n):
        raise ValueError(f"row_linear: bias must be [N] = [{n}] (or [0] for none), got {tuple(bias.shape)}")
    if bias.dtype not in (x.dtype, jnp.float32):
        raise TypeError(f"row_linear: bias must have x's dtype {x.dtype} or float32, got {bias.dtype}")
    if w.ndim > 2 and tuple(w.shape[:-2]) != tuple(x.shape[:-2]):
        raise ValueError(f"row_linear: w's batch dims {tuple(w.shape[:-2])} must be x's {tuple(x.shape[:-2])} or none")
    p = plan(x, w, idx, sparse="a", tile=_tile(x, tile_h), trans_a=False, trans_b=False, trans_c=False,
             out_batch=x.ndim - 2)
    if p.target != "row_gather":
        raise ValueError("row_linear: the index must have x's batch dims and tile whole rows of x")


def _abstract_eval(x, w, bias, *idx, tile_h, activation, allow_tf32, zero_dead, skip_dead=False):
    _check(x, w, bias, idx, tile_h=tile_h, activation=activation)
    return ShapedArray((*x.shape[:-1], w.shape[-1]), x.dtype)


def _native(x, w, bias, *idx, tile_h, activation, allow_tf32, zero_dead, skip_dead=False, cuda=False, pre=False):
    out = jax.ShapeDtypeStruct((*x.shape[:-1], w.shape[-1]), x.dtype)
    trans_b = False
    if cuda:
        w, trans_b = _lowering.tf32_k_major(w, trans_b, dtype=x.dtype, allow_tf32=allow_tf32)
    return _lowering.row_gather_call(
        x, w, idx[0], idx[1], out, tile_h=tile_h, trans_b=trans_b, allow_tf32=allow_tf32,
        bias=bias if bias.shape[0] else None, activation=activation, zero_dead=zero_dead, skip_dead=skip_dead,
        pre=pre,
    )


def _pre_abstract_eval(x, w, bias, *idx, tile_h, activation, allow_tf32, zero_dead, skip_dead=False):
    if activation is None:
        raise ValueError("row_linear_pre: needs an activation (without one, z is the result: row_linear)")
    y = _abstract_eval(x, w, bias, *idx, tile_h=tile_h, activation=activation, allow_tf32=allow_tf32,
                       zero_dead=zero_dead)
    return [y, y]


def unfused(x, w, bias, *idx, tile_h, activation, allow_tf32, zero_dead, skip_dead=False):
    """The same value through stile_matmul, then the bias and the activation in XLA
    (skip_dead: NaN on the unlisted rows, the jnp paths' unspecified value)."""
    y = stile_matmul(x, w, idx, sparse="a", tile=_tile(x, tile_h), allow_tf32=allow_tf32, out_batch=x.ndim - 2)
    if bias.shape[-1]:
        y = y + bias.astype(y.dtype)
    y = _activations.ACTIVATIONS[activation](y) if activation is not None else y
    if not (zero_dead or skip_dead):
        return y
    return listed_rows_only(y, idx[0], idx[1], x.shape[-2], tile_h, fill=jnp.nan if skip_dead else 0.0)


def row_linear(x, w, bias, idx, *, tile_h, activation=None, allow_tf32=False, zero_dead=False, skip_dead=False):
    """x [..., M, K], w [K, N] or [..., K, N], bias [N] or None; idx: the six index arrays.
    zero_dead: the rows the index does not list are zeros (not act(bias)); skip_dead: they
    are left unwritten, and the bias is on the listed rows only (gradients as with zero_dead)."""
    if bias is None:
        bias = jnp.zeros((0,), x.dtype)
    return row_linear_p.bind(x, w, bias, *idx, tile_h=int(tile_h), activation=activation,
                             allow_tf32=bool(allow_tf32), zero_dead=bool(zero_dead or skip_dead),
                             skip_dead=bool(skip_dead))


def _split(v, parts):
    return list(jnp.split(v, parts, axis=-1)) if parts > 1 else [v]


def _linear_tangents(primals, tangents, *, tile_h, allow_tf32, parts, zero_dead):
    """The tangent of (x ∘ rows) @ w + bias (the bias on every row, or with `zero_dead`
    on the listed rows only), split into `parts` column blocks: linear in the tangents of
    x, w and bias; None when none varies (only the bias has a tangent and there is no bias)."""
    x, w, bias, *idx = primals
    dx, dw, db = tangents[:3]
    mm = functools.partial(stile_matmul, idx=idx, sparse="a", tile=_tile(x, tile_h), allow_tf32=allow_tf32,
                           out_batch=x.ndim - 2)
    with_dw = type(dw) is not ad.Zero
    terms = ([mm(dx, w, with_b_grad=with_dw)] if type(dx) is not ad.Zero else []) + ([mm(x, dw)] if with_dw else [])
    t = functools.reduce(jnp.add, terms) if terms else None
    has_db = type(db) is not ad.Zero and bias.shape[-1]
    if parts > 1 and zero_dead and t is not None:
        # Split with the bias on the listed rows as one linear op, whose transpose
        # concatenates the parts' cotangents and sums them for the bias in one pass over
        # the listed rows (row_split), not a concatenation over every row and a row_sum.
        return row_split(t, db.astype(x.dtype) if has_db else None, idx[0], idx[1], parts=parts, tile_h=tile_h)
    if has_db:
        if zero_dead:
            # The bias on the listed rows: its gradient is row_sum of the cotangent, a read
            # of the live rows only.
            tb = row_bcast(db.astype(x.dtype), idx[0], idx[1], m=x.shape[-2], tile_h=tile_h)
        else:
            # The bias on every row: its transpose (the bias's gradient) is XLA's column sum
            # of the cotangent. Measured on the H100 (BERT fine-tuning kernel time, one
            # process): a ones-column product instead 6.860 ms (a cuBLAS gemv for ffn_in), a
            # [M, 2] x [2, N] product 7.282, this 6.814; per part (q, k, v) 8.21 ms.
            tb = jnp.broadcast_to(db.astype(x.dtype), (*x.shape[:-1], db.shape[-1]))
        t = tb if t is None else t + tb
    return None if t is None else _split(t, parts)


def _dead_fill(bias, db, *, activation, dtype, zero_dead):
    """(fill, fill_dot): the dead rows' value act(bias), in float32 rounded once (what the
    fused kernel writes there), and its tangent; (None, None) for zeros (no bias, or
    `zero_dead`), fill_dot None when the bias has no tangent."""
    if not bias.shape[-1] or zero_dead:
        return None, None
    dead = lambda b: _lowering.dead_row_value(b, activation, dtype)  # noqa: E731
    if type(db) is ad.Zero:
        return dead(bias), None
    return jax.jvp(dead, (bias,), (db,))


def _activate_rows(z, z_dot, bias, db, idx, *, activation, tile_h, zero_dead):
    """(act(z), its tangent) on the index's rows; the other rows get `_dead_fill`'s value."""
    rows = functools.partial(row_activation, tiles=idx[0], count=idx[1], tile_h=tile_h, activation=activation)
    fill, fill_dot = _dead_fill(bias, db, activation=activation, dtype=z.dtype, zero_dead=zero_dead)
    if fill_dot is None:
        return jax.jvp(lambda z: rows(z, fill), (z,), (z_dot,))
    return jax.jvp(rows, (z, fill), (z_dot, fill_dot))


def _activation_tangent(z, z_dot, bias, db, idx, *, activation, tile_h, zero_dead):
    """The tangent of _activate_rows's value without its primal: row_activation's tangent
    map, which reads z on the listed rows only. Its transpose leaves z's cotangent
    unwritten off the list where nothing reads it there: z's cotangent goes to the
    product's transposes (PIT products over the listed rows; the masked dense route zeroes
    both operands' dead rows, _dense_route.stile) and, with a bias, to the bias's gradient:
    a sum over the listed rows (`row_sum`) with `zero_dead`; without it a sum over every
    row, so there the zeros are written."""
    fill, fill_dot = _dead_fill(bias, db, activation=activation, dtype=z.dtype, zero_dead=zero_dead)
    live, tans = ((0,), [z_dot]) if fill_dot is None else ((0, 1), [z_dot, fill_dot])
    fill = jnp.zeros((0,), z.dtype) if fill is None else fill
    return row_activation_lin_p.bind(z, fill, idx[0], idx[1], *tans, live=live, tile_h=int(tile_h),
                                     activation=activation, dead_zeros=bool(bias.shape[-1]) and not zero_dead)


def fused_jvp(primals, tangents, params, bind, parts=1):
    """(outs, tangents), lists of `parts` column blocks, for row_linear (parts=1) and
    row_linear_parts. The primal comes from the fused kernel (`bind`: bias in its epilogue;
    with an activation and one part, `row_linear_pre`: act(z) and z from one kernel, else z
    from it, then `row_activation` on the live rows); the activation's gradient runs on the
    live rows only and the tangent is the linear map, transposed to PIT products. So a
    differentiated step runs neither the bias nor the activation (nor, for parts, a split)
    over every row."""
    x, w, bias, *idx = primals
    act = params["activation"]
    z_dots = _linear_tangents(primals, tangents, tile_h=params["tile_h"], allow_tf32=params["allow_tf32"],
                              parts=parts, zero_dead=params["zero_dead"])
    if z_dots is None:  # no tangent, or only a bias tangent and no bias
        outs = bind(*primals, **params)
        return outs, [zero_tangent(o) for o in outs]
    if act is not None and parts == 1:
        y, z = row_linear_pre_p.bind(*primals, **params)
        y_dot = _activation_tangent(z, z_dots[0], bias, tangents[2], idx, activation=act, tile_h=params["tile_h"],
                                    zero_dead=params["zero_dead"])
        return [y], [y_dot]
    zs = bind(*primals, **dict(params, activation=None))
    if act is None:
        return zs, z_dots
    db = tangents[2]
    biases = _split(bias, parts) if bias.shape[-1] else [bias] * parts
    dbs = _split(db, parts) if type(db) is not ad.Zero else [db] * parts
    pairs = [_activate_rows(z, t, b, d, idx, activation=act, tile_h=params["tile_h"], zero_dead=params["zero_dead"])
             for z, t, b, d in zip(zs, z_dots, biases, dbs)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _jvp(primals, tangents, **params):
    (out,), (out_dot,) = fused_jvp(primals, tangents, params, lambda *a, **p: [row_linear_p.bind(*a, **p)])
    return out, out_dot


def _pre_jvp(primals, tangents, **params):
    """Differentiating (act(z), z) again (second order): z from row_linear without the
    activation and act(z) from row_activation, each with its own rules."""
    _, _, bias, *idx = primals
    z_dots = _linear_tangents(primals, tangents, tile_h=params["tile_h"], allow_tf32=params["allow_tf32"], parts=1,
                              zero_dead=params["zero_dead"])
    if z_dots is None:
        outs = row_linear_pre_p.bind(*primals, **params)
        return outs, [zero_tangent(o) for o in outs]
    z = row_linear_p.bind(*primals, **dict(params, activation=None))
    y, y_dot = _activate_rows(z, z_dots[0], bias, tangents[2], idx, activation=params["activation"],
                              tile_h=params["tile_h"], zero_dead=params["zero_dead"])
    return [y, z], [y_dot, z_dots[0]]


def mapped_to_batch(args, dims):
    """(x, w, bias, *idx) with vmap's axis moved to the front as one more batch dim of x
    and the index (w too when mapped or batched); the bias must be unmapped."""
    x, w, bias, *idx = args
    dx, dw, _, *didx = dims
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    def front(a, d):
        return jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size, *a.shape))

    x = front(x, dx)
    idx = [front(a, d) for a, d in zip(idx, didx)]  # the index has x's batch dims
    if dw is not None or w.ndim > 2:
        w = front(w, dw)
    return (x, w, bias, *idx)


def _batch(args, dims, **params):
    if dims[2] is not None:  # a mapped bias: the unfused expression
        return jax.vmap(functools.partial(unfused, **params), in_axes=tuple(dims))(*args), 0
    return row_linear_p.bind(*mapped_to_batch(args, dims), **params), 0


def _pre_batch(args, dims, **params):
    if dims[2] is not None:  # a mapped bias: the unfused expressions
        pair = lambda *a: (unfused(*a, **params), unfused(*a, **dict(params, activation=None)))  # noqa: E731
        return list(jax.vmap(pair, in_axes=tuple(dims))(*args)), [0, 0]
    return row_linear_pre_p.bind(*mapped_to_batch(args, dims), **params), [0, 0]


row_linear_p.def_impl(lambda *args, **params: xla.apply_primitive(row_linear_p, *args, **params))
row_linear_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[row_linear_p] = _jvp
batching.primitive_batchers[row_linear_p] = _batch
_lowering.register_traced_lowering(
    row_linear_p, _native, ("pit_row_gather_matmul",), cuda_fn=functools.partial(_native, cuda=True),
    core=((2, 2, 1, *_products.INDEX_CORE), (2,)),
)

row_linear_pre_p.def_impl(lambda *args, **params: xla.apply_primitive(row_linear_pre_p, *args, **params))
row_linear_pre_p.def_abstract_eval(_pre_abstract_eval)
ad.primitive_jvps[row_linear_pre_p] = _pre_jvp
batching.primitive_batchers[row_linear_pre_p] = _pre_batch
_lowering.register_traced_lowering(
    row_linear_pre_p, functools.partial(_native, pre=True), ("pit_row_gather_matmul_pre",),
    cuda_fn=functools.partial(_native, cuda=True, pre=True),
    core=((2, 2, 1, *_products.INDEX_CORE), (2, 2)),
)
