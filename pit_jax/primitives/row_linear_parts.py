"""`row_linear_parts`: `row_linear` with its result split by columns into `parts` arrays.

    (y_0, ..., y_{P-1}) = split(act((x ∘ rows) @ w + bias), P, axis=-1)

A fused q/k/v projection is the case it exists for: attention wants q, k and v as arrays
of their own, and slicing them out of one [..., M, 3H] product is a pass over every row,
padding included (BERT-base batch 32 on the H100: 11.6 us a layer, docs/notes/
sm90_row_gather.md). On an sm_90a GPU, with 16-bit types, P = 3 and N / 3 a multiple of
256 the row-gather kernel writes the three results itself (`pit_row_gather_matmul3`);
everywhere else this is the single product and a split, with the same values.

Autodiff and vmap follow row_linear: the primal from the kernel that writes the parts, the
tangent from the linear map, split (its transpose concatenates the parts' cotangents);
vmap moves the mapped axis into the batch dims.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives import _lowering, _products
from pit_jax.primitives._vma import Primitive
from pit_jax.primitives.row_linear import _check, _native, _split, fused_jvp, mapped_to_batch, unfused

row_linear_parts_p = Primitive("pit_row_linear_parts")
row_linear_parts_p.multiple_results = True

_KERNEL_PARTS = 3  # the parts pit_row_gather_matmul3 writes
_KERNEL_TILE_N = 256  # its tile width: a tile must not straddle two parts


def _check_parts(x, w, bias, idx, *, tile_h, activation, parts):
    _check(x, w, bias, idx, tile_h=tile_h, activation=activation)
    n = w.shape[-1]
    if parts < 1 or n % parts:
        raise ValueError(f"row_linear_parts: parts must divide N = {n}, got {parts}")


def _abstract_eval(x, w, bias, *idx, tile_h, activation, allow_tf32, zero_dead, parts, skip_dead=False):
    _check_parts(x, w, bias, idx, tile_h=tile_h, activation=activation, parts=parts)
    n = w.shape[-1] // parts
    return [ShapedArray((*x.shape[:-1], n), x.dtype) for _ in range(parts)]


def kernel_writes_parts(x, w, tiles, tile_h, parts) -> bool:
    """Whether the CUDA kernel writes the parts itself (else: one product, then a split):
    the conditions of LaunchRowGatherGemmSm90 with column parts, known at trace time."""
    n, m = w.shape[-1], x.shape[-2]
    return (
        parts == _KERNEL_PARTS and x.dtype in (jnp.bfloat16, jnp.float16) and n % parts == 0
        and (n // parts) % _KERNEL_TILE_N == 0 and x.shape[-1] % 8 == 0 and m > 0
        and tiles.shape[-1] == -(-m // tile_h)  # the list at full capacity (dead ids listed)
        and _lowering.cuda_is_sm90()
    )


def _native_parts(x, w, bias, *idx, tile_h, activation, allow_tf32, zero_dead, parts, skip_dead=False, cuda=False):
    if not (cuda and kernel_writes_parts(x, w, idx[0], tile_h, parts)):
        y = _native(x, w, bias, *idx, tile_h=tile_h, activation=activation, allow_tf32=allow_tf32,
                    zero_dead=zero_dead, skip_dead=skip_dead, cuda=cuda)
        return _split(y, parts)
    out = jax.ShapeDtypeStruct((*x.shape[:-1], w.shape[-1] // parts), x.dtype)
    return list(_lowering.row_gather_call(
        x, w, idx[0], idx[1], out, tile_h=tile_h, trans_b=False, allow_tf32=allow_tf32,
        bias=bias if bias.shape[0] else None, activation=activation, parts=parts, zero_dead=zero_dead,
        skip_dead=skip_dead,
    ))


def row_linear_parts(x, w, bias, idx, *, tile_h, parts, activation=None, allow_tf32=False, zero_dead=False,
                     skip_dead=False):
    """x [..., M, K], w [K, N] or [..., K, N], bias [N] or None; idx: the six index arrays.
    Returns `parts` arrays [..., M, N / parts]; zero_dead and skip_dead as row_linear's."""
    if bias is None:
        bias = jnp.zeros((0,), x.dtype)
    return tuple(row_linear_parts_p.bind(x, w, bias, *idx, tile_h=int(tile_h), activation=activation,
                                         allow_tf32=bool(allow_tf32), zero_dead=bool(zero_dead or skip_dead),
                                         parts=int(parts), skip_dead=bool(skip_dead)))


def _jvp(primals, tangents, *, parts, **params):
    bind = functools.partial(row_linear_parts_p.bind, parts=parts)
    return fused_jvp(primals, tangents, params, lambda *a, **p: list(bind(*a, **p)), parts)


def _batch(args, dims, *, parts, **params):
    if dims[2] is not None:  # a mapped bias: the unfused expression, split
        fn = lambda *a: tuple(_split(unfused(*a, **params), parts))  # noqa: E731
        return list(jax.vmap(fn, in_axes=tuple(dims))(*args)), [0] * parts
    return row_linear_parts_p.bind(*mapped_to_batch(args, dims), parts=parts, **params), [0] * parts


row_linear_parts_p.def_impl(lambda *args, **params: xla.apply_primitive(row_linear_parts_p, *args, **params))
row_linear_parts_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[row_linear_parts_p] = _jvp
batching.primitive_batchers[row_linear_parts_p] = _batch
_lowering.register_traced_lowering(
    row_linear_parts_p, _native_parts, ("pit_row_gather_matmul", "pit_row_gather_matmul3"),
    cuda_fn=functools.partial(_native_parts, cuda=True),
    core=((2, 2, 1, *_products.INDEX_CORE), lambda parts, **_: (2,) * parts),
)
