"""`sdd_matmul`: a product computed only on the listed micro-tiles of its result.

    C = ( op_a(A) @ op_b(B) ) ∘ mask

`mask` = the live micro-tiles (`tile` = (h, w) on C [..., M, N]) listed by the index
operands (tiles, count, row_tiles, row_count, col_tiles, col_count), which have C's batch
dims; unlisted tiles are zero. It is the gradient of a stile product w.r.t. its masked
operand (K-axis dx = (dy @ w^T) ∘ m, weight-block dw = (x^T @ dy) ∘ m). When the tiles
span whole rows of C it is a row-gather product and lowers to that (M-axis dx).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives import _dense_route, _lowering, _products
from pit_jax.primitives._vma import Primitive, typed_cotangents

sdd_matmul_p = Primitive("pit_sdd_matmul")


def _shape(a, b, idx, *, trans_a, trans_b, out_batch):
    return _products.product_shape(
        a, b, _products.index_batch(idx), trans_a=trans_a, trans_b=trans_b, trans_c=False, out_batch=out_batch,
        what="sdd_matmul",
    )


def _abstract_eval(a, b, *idx, tile, trans_a, trans_b, allow_tf32, out_batch, packed_a=False):
    shape = _shape(a, b, idx, trans_a=trans_a, trans_b=trans_b, out_batch=out_batch)
    if tuple(idx[1].shape) != shape.full[:out_batch]:
        raise ValueError(
            f"sdd_matmul: the index has batch dims {tuple(idx[1].shape)}, the result {shape.full[:out_batch]}"
        )
    tr, tc = math.ceil(shape.m / tile[0]), math.ceil(shape.n / tile[1])
    if idx[0].shape[-1] > tr * tc or tile[0] > shape.m or tile[1] > shape.n:
        raise ValueError(f"sdd_matmul: the index does not match a {tile} micro-tiling of {(shape.m, shape.n)}")
    return ShapedArray(shape.out_shape, a.dtype)


def _row_gather(a, idx, shape, *, tile, trans_a, out_batch) -> bool:
    # Tiles spanning whole rows of C, rows of op_a(A) = rows of A: gather rows of A.
    return (
        not trans_a and math.ceil(shape.n / tile[1]) == 1 and out_batch == len(shape.full)
        and tuple(a.shape[:-2]) == shape.full
    )


# The generic SDD kernel gives each live tile one block that walks the whole reduction:
# past this length (a weight gradient reduces over every token) or on tiles filling less
# than half its 64x64 tile, cuBLAS's dense product, masked, is the faster STile on CUDA.
_SDD_MAX_REDUCTION = 1024
_SDD_MIN_AREA = 2048


def _dense_is_faster(shape, tile) -> bool:
    h, w = min(tile[0], 64), min(tile[1], 64)
    return shape.k > _SDD_MAX_REDUCTION or h * w < _SDD_MIN_AREA


def _packs_a(a, b, idx, shape, *, tile) -> bool:
    """Whether the M axis's weight gradient of this dx packs A's (dy's) live rows on this
    device, as row_gather_call would pack them here: the conditions of stile_matmul's
    packed route for x^T @ dy, seen from dx = (dy @ w^T) on the listed rows (its columns
    are x's, its reduction dy's), at full capacity. A batched dy under a shared w folds
    its entries' rows in both products alike (same reshape, same folded index) where the
    index has no row or column lists; per-entry weights pack per entry in both."""
    from pit_jax.primitives.stile_matmul import wgrad_packs_rows

    folds = b.ndim == 2 and a.ndim > 2
    return (
        a.dtype in (jnp.bfloat16, jnp.float16) and shape.m % tile[0] == 0 and idx[0].shape[-1] * tile[0] == shape.m
        and not (folds and any(v.size for v in idx[2:])) and wgrad_packs_rows(shape.n, shape.k)
    )


def _native(a, b, *idx, tile, trans_a, trans_b, allow_tf32, out_batch, packed_a=False, cuda=False):
    if trans_a and not trans_b and out_batch == 0 and a.ndim > 2 and a.shape[:-2] == b.shape[:-2]:
        # A shared weight's gradient, x^T @ dy summed over the batch: the batch is more of
        # the reduction's (contiguous) rows of both operands, one 2-D product.
        a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    shape = _shape(a, b, idx, trans_a=trans_a, trans_b=trans_b, out_batch=out_batch)
    out = jax.ShapeDtypeStruct(shape.out_shape, a.dtype)
    if _row_gather(a, idx, shape, tile=tile, trans_a=trans_a, out_batch=out_batch):
        # packed_a (the JVP's flag: the weight gradient is taken too): that gradient packs
        # dy's live rows (pit_sread_live); the same call here is merged with it by XLA's
        # CSE, and the kernel reads A by TMA from it (3-4 % faster than its row gather).
        pack_a = cuda and packed_a and _packs_a(a, b, idx, shape, tile=tile)
        return _lowering.row_gather_call(a, b, idx[0], idx[1], out, tile_h=tile[0], trans_b=trans_b,
                                         allow_tf32=allow_tf32, pack_a=pack_a)
    if cuda and _dense_is_faster(shape, tile):
        return _dense_route.sdd(a, b, idx[0], idx[1], tile=tile, trans_a=trans_a, trans_b=trans_b,
                                allow_tf32=allow_tf32, out_batch=out_batch)
    return jax.ffi.ffi_call("pit_sdd_matmul", out)(
        a,
        b,
        idx[0],
        idx[1],
        tile_h=np.int64(tile[0]),
        tile_w=np.int64(tile[1]),
        trans_a=bool(trans_a),
        trans_b=bool(trans_b),
        allow_tf32=bool(allow_tf32),
    )


def sdd_matmul(a, b, idx, *, tile, trans_a=False, trans_b=False, allow_tf32=False, out_batch, packed_a=False):
    """packed_a: the trace also packs A's listed rows for another product (stile_matmul's
    with_b_grad); a lowering may read them from there (same value)."""
    return sdd_matmul_p.bind(
        a,
        b,
        *idx,
        tile=tuple(tile),
        trans_a=bool(trans_a),
        trans_b=bool(trans_b),
        allow_tf32=bool(allow_tf32),
        out_batch=int(out_batch),
        packed_a=bool(packed_a),
    )


def _transpose(ct, a, b, *idx, tile, trans_a, trans_b, allow_tf32, out_batch, packed_a=False):
    from pit_jax.primitives.stile_matmul import stile_matmul  # the sparse-reduction products

    nones = [None] * _products.NUM_INDEX
    if type(ct) is ad.Zero:
        return [None, None, *nones]
    if any(ad.is_undefined_primal(x) for x in idx):
        raise ValueError("sdd_matmul: the index is not differentiable")
    # ct is masked by the same tiles as C: it is the sparse operand of the transposes.
    ct_a = ct_b = None
    if ad.is_undefined_primal(a):
        nb = a.aval.ndim - 2
        ct_a = (
            stile_matmul(ct, b, idx, sparse="a", tile=tile, trans_a=False, trans_b=not trans_b, out_batch=nb,
                         allow_tf32=allow_tf32)
            if not trans_a
            else stile_matmul(b, ct, idx, sparse="b", tile=tile, trans_a=trans_b, trans_b=True, out_batch=nb,
                              allow_tf32=allow_tf32)
        )
    if ad.is_undefined_primal(b):
        nb = b.aval.ndim - 2
        ct_b = (
            stile_matmul(a, ct, idx, sparse="b", tile=tile, trans_a=not trans_a, trans_b=False, out_batch=nb,
                         allow_tf32=allow_tf32)
            if not trans_b
            else stile_matmul(ct, a, idx, sparse="a", tile=tile, trans_a=True, trans_b=trans_a, out_batch=nb,
                              allow_tf32=allow_tf32)
        )
    return [ct_a, ct_b, *nones]


def _batch(args, dims, **params):
    return _products.batch_rule(sdd_matmul_p, args, dims, owner="c", **params)


sdd_matmul_p.def_impl(lambda *args, **params: xla.apply_primitive(sdd_matmul_p, *args, **params))
sdd_matmul_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[sdd_matmul_p] = _products.bilinear_jvp(sdd_matmul_p)
ad.primitive_transposes[sdd_matmul_p] = typed_cotangents(_transpose)
batching.primitive_batchers[sdd_matmul_p] = _batch
_lowering.register_traced_lowering(
    sdd_matmul_p, _native, ("pit_sdd_matmul", "pit_row_gather_matmul", "pit_row_gather_matmul_packed", "pit_sread_live"),
    cuda_fn=functools.partial(_native, cuda=True),
    core=((2, 2, *_products.INDEX_CORE), (2,)),
)
