"""`stile_matmul`: SRead -> dense tile product -> SWrite, one operand masked by an index.

    C = T_c( op_a(A ∘ mask) @ op_b(B) )      sparse == "a"
    C = T_c( op_a(A) @ op_b(B ∘ mask) )      sparse == "b"

`mask` is the set of live micro-tiles (`tile` = (h, w) on the masked operand's STORED
layout) listed by the index; op is the identity or a transpose (`trans_a`, `trans_b`);
with `trans_c` C is stored transposed. float32 accumulation. Operands:
(a, b, tiles, count, row_tiles, row_count, col_tiles, col_count) — the index arrays of
the masked operand, which has exactly their batch dims. Batching: see `_products`.

PIT axes: the M axis (row micro-tiles (h, K) of x) lowers to the row-gather target;
the K axis ((h, w) tiles of x) and weight blocks ((bk, bn) tiles of w) lower to the
stile target, which reduces each output block over its group's listed tiles only.
The transposes are the other PIT products on the same index (never rebuilt):
an SDD product for the masked operand, a stile product for the dense one.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax import reference
from pit_jax.primitives import _dense_route, _lowering, _products
from pit_jax.primitives._vma import Primitive, typed_cotangents

stile_matmul_p = Primitive("pit_stile_matmul")


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a stile product runs: which native target, with which list."""

    target: str  # "row_gather" or "stile"
    lists: str  # "flat" (one group), "rows", "cols", "rows_from_flat" or "cols_from_flat"
    reduce_cols: bool
    tile_rows: int
    tile_cols: int


def plan(a, b, idx, *, sparse, tile, trans_a, trans_b, trans_c, out_batch) -> Plan:
    """Chooses the target and the list; raises if the index lacks what is needed."""
    s = a if sparse == "a" else b
    rows, cols = s.shape[-2:]
    h, w = tile
    tr, tc = math.ceil(rows / h), math.ceil(cols / w)
    reduce_cols = (sparse == "a" and not trans_a) or (sparse == "b" and trans_b)
    full = _products.full_batch(tuple(a.shape[:-2]), tuple(b.shape[:-2]), what="stile_matmul")
    if (
        sparse == "a"
        and not trans_a
        and tc == 1
        and not trans_c
        and out_batch == len(full)
        and tuple(a.shape[:-2]) == full
    ):
        return Plan("row_gather", "flat", reduce_cols, tr, tc)
    if reduce_cols:  # groups are tile rows, entries tile columns
        if tr == 1:
            lists = "flat"
        elif _products.has_rows(idx):
            lists = "rows"
        elif tc == 1:
            lists = "rows_from_flat"
        else:
            raise ValueError(
                "pit_jax: this product reduces along the columns of the sparse operand and needs "
                "the index's per-row lists; build the index with group_by='row' (or 'both' to "
                "also differentiate)"
            )
    else:  # groups are tile columns, entries tile rows
        if tc == 1:
            lists = "flat"
        elif _products.has_cols(idx):
            lists = "cols"
        elif tr == 1:
            lists = "cols_from_flat"
        else:
            raise ValueError(
                "pit_jax: this product reduces along the rows of the sparse operand and needs the "
                "index's per-column lists; build the index with group_by='col' (or 'both' to also "
                "differentiate)"
            )
    return Plan("stile", lists, reduce_cols, tr, tc)


def group_lists(idx, p: Plan):
    """(lists [..., groups, capacity], counts [..., groups]) as the stile target takes them."""
    tiles, count, row_tiles, row_count, col_tiles, col_count = idx
    if p.lists == "flat":
        return _products.flat_as_group(tiles, count)
    if p.lists == "rows":
        return row_tiles, row_count
    if p.lists == "cols":
        return col_tiles, col_count
    # One tile per group at most (the tiles span the other dim): groups from the flat list.
    groups = p.tile_rows if p.lists == "rows_from_flat" else p.tile_cols
    cap = tiles.shape[-1]
    valid = jnp.arange(cap) < jnp.minimum(count, cap)[..., None]
    ids = jnp.where(valid, tiles, groups).reshape(-1, cap)
    live = jax.vmap(lambda t: jnp.zeros((groups,), jnp.int32).at[t].set(1, mode="drop"))(ids)
    live = live.reshape(*count.shape, groups)
    return jnp.where(live > 0, 0, -1)[..., None].astype(jnp.int32), live


def _check_index(a, b, idx, *, sparse, tile):
    s = a if sparse == "a" else b
    rows, cols = s.shape[-2:]
    h, w = tile
    tr, tc = math.ceil(rows / h), math.ceil(cols / w)
    tiles, count = idx[0], idx[1]
    if tuple(count.shape) != tuple(s.shape[:-2]):
        raise ValueError(
            f"stile_matmul: the index has batch dims {tuple(count.shape)} but the sparse operand "
            f"{sparse} has {tuple(s.shape[:-2])}"
        )
    if tiles.shape[-1] > tr * tc or any(x.dtype != jnp.int32 for x in idx):
        raise ValueError(f"stile_matmul: index arrays do not match a {tile} micro-tiling of {(rows, cols)}")
    if _products.has_rows(idx) and tuple(idx[2].shape[-2:]) != (tr, tc):
        raise ValueError(f"stile_matmul: the index's row lists are not those of a {tile} tiling of {(rows, cols)}")
    if _products.has_cols(idx) and tuple(idx[4].shape[-2:]) != (tc, tr):
        raise ValueError(f"stile_matmul: the index's column lists are not those of a {tile} tiling of {(rows, cols)}")


def _abstract_eval(a, b, *idx, sparse, tile, trans_a, trans_b, trans_c, allow_tf32, out_batch, with_b_grad=False):
    shape = _products.product_shape(
        a, b, (), trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, out_batch=out_batch, what="stile_matmul"
    )
    _check_index(a, b, idx, sparse=sparse, tile=tile)
    plan(a, b, idx, sparse=sparse, tile=tile, trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, out_batch=out_batch)
    return ShapedArray(shape.out_shape, a.dtype)


def _native(a, b, *idx, sparse, tile, trans_a, trans_b, trans_c, allow_tf32, out_batch, with_b_grad=False, cuda=False):
    """The custom call(s), traced inside the lowering (one per platform). `with_b_grad`
    matters only to the transpose (see stile_matmul)."""
    if sparse == "b" and b.ndim == 2 and a.ndim > 2 and not (trans_a or trans_c) and out_batch == a.ndim - 2:
        # A shared sparse weight under a batched x (W axis, forward and dx): x's batch is
        # more of its (contiguous) rows, so the call is one 2-D product, which the kernels
        # run as fast as a folded x (with per-entry products a forward + backward at BERT's
        # sizes took 2.2-3.1x the folded time).
        y = _native(a.reshape(-1, a.shape[-1]), b, *idx, sparse=sparse, tile=tile, trans_a=False, trans_b=trans_b,
                    trans_c=False, allow_tf32=allow_tf32, out_batch=0, cuda=cuda)
        return y.reshape(*a.shape[:-1], y.shape[-1])
    if _rows_wgrad_folds(a, b, idx, sparse=sparse, tile=tile, trans_a=trans_a, trans_b=trans_b, trans_c=trans_c,
                         out_batch=out_batch):
        # The M axis's weight gradient x^T dy summed over x's batch (a shared w): the
        # entries' rows of both as one matrix, their lists as one (the forward and dx fold
        # the same way in _lowering.row_gather_call).
        nb = a.ndim - 2
        lists = (v.reshape(v.shape[nb:]) for v in idx[2:])
        return _native(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]),
                       *_lowering.folded_row_index(idx[0], idx[1]), *lists, sparse=sparse, tile=tile, trans_a=True,
                       trans_b=False, trans_c=False, allow_tf32=allow_tf32, out_batch=0, cuda=cuda)
    shape = _products.product_shape(
        a, b, (), trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, out_batch=out_batch, what="stile_matmul"
    )
    out = jax.ShapeDtypeStruct(shape.out_shape, a.dtype)
    p = plan(a, b, idx, sparse=sparse, tile=tile, trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, out_batch=out_batch)
    if p.target == "row_gather":
        if cuda:
            b, trans_b = _lowering.tf32_k_major(b, trans_b, dtype=a.dtype, allow_tf32=allow_tf32)
        return _lowering.row_gather_call(a, b, idx[0], idx[1], out, tile_h=tile[0], trans_b=trans_b,
                                         allow_tf32=allow_tf32)
    if cuda and _rows_wgrad_applies(a, b, idx, p, sparse=sparse, tile=tile, trans_a=trans_a, trans_b=trans_b,
                                    trans_c=trans_c, out_batch=out_batch):
        return _rows_wgrad(a, b, idx, tile, allow_tf32, out_batch).reshape(out.shape)
    lists, counts = group_lists(idx, p)
    if cuda and _transposed_weight_layout(a, b, p, sparse=sparse, tile=tile, trans_a=trans_a, trans_b=trans_b,
                                          trans_c=trans_c, out_batch=out_batch):
        # dx of weight blocks, dy @ (w ∘ m)^T: the same product on w^T stored, whose
        # (bn, bk) tiles grouped by tile column are w's per-row lists (already chosen).
        b, trans_b, tile = jnp.swapaxes(b, -1, -2), False, (tile[1], tile[0])
        p = dataclasses.replace(p, reduce_cols=False, tile_rows=p.tile_cols, tile_cols=p.tile_rows)
    if cuda and _gather_rows_layout(a, b, p, sparse=sparse, tile=tile, trans_a=trans_a, trans_b=trans_b,
                                    trans_c=trans_c, out_batch=out_batch):
        # Same product, same lists: x stored transposed, so every listed k is a contiguous
        # row of x^T (and of w) that the Hopper stile kernel copies with 16-byte vectors.
        # The masked x's micro-tile is on its stored layout, so it turns with it.
        a, trans_a = jnp.swapaxes(a, -1, -2), True
        if sparse == "a":
            tile = (tile[1], tile[0])
    elif cuda and _too_thin(p, tile):
        return _dense_route.stile(a, b, reference.stile_tile_mask(idx, p), sparse=sparse, tile=tile, trans_a=trans_a, trans_b=trans_b,
                                  trans_c=trans_c, allow_tf32=allow_tf32, out_batch=out_batch)
    return jax.ffi.ffi_call("pit_stile_matmul", out)(
        a,
        b,
        lists,
        counts,
        sparse_b=sparse == "b",
        tile_h=np.int64(tile[0]),
        tile_w=np.int64(tile[1]),
        trans_a=bool(trans_a),
        trans_b=bool(trans_b),
        trans_c=bool(trans_c),
        allow_tf32=bool(allow_tf32),
    )


def _rows_wgrad_folds(a, b, idx, *, sparse, tile, trans_a, trans_b, trans_c, out_batch) -> bool:
    """Whether this is a weight gradient x^T dy over x's row blocks with x and dy batched
    alike and the batch summed, on a row index that folds (`_lowering.row_index_folds`, no
    row or column lists)."""
    return (
        sparse == "a" and trans_a and not (trans_b or trans_c) and out_batch == 0 and tile[1] >= a.shape[-1]
        and tuple(b.shape[:-1]) == tuple(a.shape[:-1]) and not any(v.size for v in idx[2:])
        and _lowering.row_index_folds(idx[0], a.shape[:-1], tile[0])
    )


def _hopper_covers(a, b, p: Plan, out_batch, *dims) -> bool:
    """What both layout rewrites below need of a call: a stile product in a 16-bit type on
    an sm_90 device, no batch reduction, the given extents multiples of 8."""
    full = _products.full_batch(tuple(a.shape[:-2]), tuple(b.shape[:-2]), what="stile_matmul")
    return (
        p.target == "stile" and out_batch == len(full) and a.dtype in (jnp.bfloat16, jnp.float16)
        and all(d % 8 == 0 for d in dims) and _lowering.cuda_is_sm90()
    )


def _gather_rows_layout(a, b, p: Plan, *, sparse, tile, trans_a, trans_b, trans_c, out_batch) -> bool:
    """Whether to hand the Hopper stile kernel (cuda/kernels/sm90/stile_gemm.cu) x stored
    transposed: the K-axis forward (x's (h, w) tiles, per-row lists) always, weight blocks
    (w's (bk, bn) tiles, per-column lists) when bk is not a whole 16-byte vector of x's row
    (1x64, 1x32). M and N multiples of 8 (and `_hopper_covers`): the kernel's covered
    cases; elsewhere the generic kernel keeps x as it is."""
    if trans_a or trans_b or trans_c or not _hopper_covers(a, b, p, out_batch, a.shape[-2], b.shape[-1]):
        return False
    if sparse == "a":
        return p.reduce_cols
    return not p.reduce_cols and tile[0] % 8 != 0


def _transposed_weight_layout(a, b, p: Plan, *, sparse, tile, trans_a, trans_b, trans_c, out_batch) -> bool:
    """Whether to hand the Hopper stile kernel w^T for a weight-block product that reads
    w transposed (dx = dy @ (w ∘ m)^T), which it does not cover: on w^T stored the
    groups are w's (bk-wide) tile rows and each listed n block a run of bn contiguous
    elements, the layout it gathers. bk a multiple of 8 up to 64, bn of 8 (x [M, K] rows
    then hold whole vectors), M and K of 8, no other transposes (and `_hopper_covers`)."""
    bk, bn = tile
    return (
        sparse == "b" and trans_b and not (trans_a or trans_c) and p.lists == "rows" and bk <= 64
        and _hopper_covers(a, b, p, out_batch, bk, bn, a.shape[-2], b.shape[-2])
        and not _weight_block_kernel_covers(a, b, p, sparse=sparse, tile=tile, trans_a=trans_a, trans_c=trans_c,
                                            out_batch=out_batch)
    )


def _weight_block_kernel_covers(a, b, p: Plan, *, sparse, tile, trans_a, trans_c, out_batch) -> bool:
    """Whether the Hopper (32, 64) weight-block kernel (cuda/kernels/sm90/wblock_gemm.cu)
    runs this product with the operands as they are: the forward and the dx, rows of a
    and w whole 16-byte vectors, at most 1024 reduction blocks."""
    if sparse != "b" or tuple(tile) != (32, 64) or trans_a or trans_c:
        return False
    red, block = a.shape[-1], (64 if p.reduce_cols else 32)
    return _hopper_covers(a, b, p, out_batch, red, b.shape[-2], b.shape[-1]) and math.ceil(red / block) <= 1024


def _too_thin(p: Plan, tile) -> bool:
    """Whether the tiles are too thin for the generic kernel to gather (a group narrower
    than 8 of its 64-wide tile, or fewer than 8 contiguous elements per listed K run):
    then the dense product on the masked operand is the faster STile (_dense_route)."""
    h, w = tile
    group, run = (h, w) if p.reduce_cols else (w, h)
    return p.target == "stile" and (group < 8 or run < 8)


def _rows_wgrad_applies(a, b, idx, p: Plan, *, sparse, tile, trans_a, trans_b, trans_c, out_batch) -> bool:
    """Whether this is the M axis's weight gradient, A^T @ B reduced over A's live row
    blocks (B dense, same rows), in a 16-bit type: on CUDA that is the grouped weight
    gradient with one group, whose Hopper kernel gathers the rows of both operands
    (measured 1.2-2x faster than the stile kernel at BERT's sizes)."""
    rows = a.shape[-2]
    return (
        p.target == "stile" and sparse == "a" and trans_a and not trans_b and not trans_c and p.tile_cols == 1
        and rows % tile[0] == 0 and b.shape[-2] == rows and a.dtype in (jnp.bfloat16, jnp.float16)
        and a.dtype == b.dtype and tuple(a.shape[:-2]) == tuple(b.shape[:-2]) == tuple(idx[1].shape)
        and out_batch <= a.ndim - 2
    )


# Packing the live rows first pays once the product is large: it moves the live rows of
# both operands once more (read + write) but lets the kernel read whole stages by TMA
# instead of gathering rows (docs/notes/sm90_grouped.md, run 11). K * N at least this.
PACKED_WGRAD_MIN_KN = 2048 * 2048


def wgrad_packs_rows(k, n) -> bool:
    """Whether the M axis's weight gradient of a K x N weight packs the live rows of its
    operands on this device (sdd_matmul's dx asks for the same packing of dy then)."""
    return k * n >= PACKED_WGRAD_MIN_KN and _lowering.cuda_is_sm90()


def _rows_wgrad(a, b, idx, tile, allow_tf32, out_batch):
    """pit_grouped_wgrad with E = 1: the listed row blocks expanded to row ids (its list
    entries are rows of both operands), -1 past the count; the empty group 1 is the
    "dropped" group of the MoE contract. For large products the live rows of both
    operands are packed first (pit_sread_live) and pit_grouped_wgrad_packed reads them
    in order (its lists are the identity)."""
    tiles, count = idx[0], idx[1]
    h, rows = tile[0], a.shape[-2]
    cap = tiles.shape[-1]
    lead = tuple(tiles.shape[:-1])
    packed = wgrad_packs_rows(a.shape[-1], b.shape[-1])
    if packed:
        # The raw count: pit_sread_live packs min(count, capacity) slots and the kernel
        # clamps its count to the packed rows, so a min here would be one more launch.
        # dy's packing is the one dx reads too (sdd_matmul's packed_a; CSE merges them).
        a, b = (_lowering.pack_live_rows(m, tiles, count, tile_h=h) for m in (a, b))
        # The packed kernel reads rows 0 .. count - 1 in order and never the lists' values:
        # a constant identity (XLA folds it; no kernel builds it per call).
        ids = jnp.broadcast_to(jnp.arange(cap * h, dtype=jnp.int32), lead + (cap * h,))
    else:
        count = jnp.minimum(count, cap)
        ids = (tiles[..., :, None] * h + jnp.arange(h, dtype=jnp.int32)).reshape(*lead, cap * h)
        ids = jnp.where(jnp.arange(cap * h) < (count * h)[..., None], ids, -1)
        ids = jnp.pad(ids, [(0, 0)] * (ids.ndim - 1) + [(0, rows - cap * h)], constant_values=-1)
    lists = jnp.stack([ids, jnp.full_like(ids, -1)], axis=-2).astype(jnp.int32)
    counts = jnp.stack([count * h, jnp.zeros_like(count)], axis=-1).astype(jnp.int32)
    batch = tuple(a.shape[:-2])[:out_batch]
    out = jax.ShapeDtypeStruct(batch + (1, a.shape[-1], b.shape[-1]), a.dtype)
    return jax.ffi.ffi_call("pit_grouped_wgrad_packed" if packed else "pit_grouped_wgrad", out)(
        a, b, lists, counts, row_div=np.int64(1), allow_tf32=bool(allow_tf32)
    )


def stile_matmul(a, b, idx, *, sparse, tile, trans_a=False, trans_b=False, trans_c=False, allow_tf32=False, out_batch,
                 with_b_grad=False):
    """with_b_grad (set by the JVPs on a tangent's a-term when b has a tangent too): the
    same trace also takes b's gradient, so a's gradient may read what that one packs
    (the M axis's dx reads dy's live rows as the weight gradient packs them)."""
    return stile_matmul_p.bind(
        a,
        b,
        *idx,
        sparse=sparse,
        tile=tuple(tile),
        trans_a=bool(trans_a),
        trans_b=bool(trans_b),
        trans_c=bool(trans_c),
        allow_tf32=bool(allow_tf32),
        out_batch=int(out_batch),
        with_b_grad=bool(with_b_grad),
    )


# -- autodiff: bilinear in (a, b) for a fixed index ------------------------------------


def _transpose(ct, a, b, *idx, sparse, tile, trans_a, trans_b, trans_c, allow_tf32, out_batch, with_b_grad=False):
    from pit_jax.primitives.sdd_matmul import sdd_matmul  # the masked operand's gradient

    nones = [None] * _products.NUM_INDEX
    if type(ct) is ad.Zero:
        return [None, None, *nones]
    if any(ad.is_undefined_primal(x) for x in idx):
        raise ValueError("stile_matmul: the index is not differentiable")
    common = dict(allow_tf32=allow_tf32)
    ct_a = ct_b = None
    if ad.is_undefined_primal(a):
        nb = a.aval.ndim - 2
        if sparse == "a":
            ct_a = (
                sdd_matmul(ct, b, idx, tile=tile, trans_a=trans_c, trans_b=not trans_b, out_batch=nb,
                           packed_a=with_b_grad, **common)
                if not trans_a
                else sdd_matmul(b, ct, idx, tile=tile, trans_a=trans_b, trans_b=not trans_c, out_batch=nb, **common)
            )
        else:
            ct_a = (
                stile_matmul(ct, b, idx, sparse="b", tile=tile, trans_a=trans_c, trans_b=not trans_b, out_batch=nb, **common)
                if not trans_a
                else stile_matmul(b, ct, idx, sparse="a", tile=tile, trans_a=trans_b, trans_b=not trans_c, out_batch=nb, **common)
            )
    if ad.is_undefined_primal(b):
        nb = b.aval.ndim - 2
        if sparse == "b":
            ct_b = (
                sdd_matmul(a, ct, idx, tile=tile, trans_a=not trans_a, trans_b=trans_c, out_batch=nb, **common)
                if not trans_b
                else sdd_matmul(ct, a, idx, tile=tile, trans_a=not trans_c, trans_b=trans_a, out_batch=nb, **common)
            )
        else:
            ct_b = (
                stile_matmul(a, ct, idx, sparse="a", tile=tile, trans_a=not trans_a, trans_b=trans_c, out_batch=nb, **common)
                if not trans_b
                else stile_matmul(ct, a, idx, sparse="b", tile=tile, trans_a=not trans_c, trans_b=trans_a, out_batch=nb, **common)
            )
    return [ct_a, ct_b, *nones]


def _batch(args, dims, **params):
    return _products.batch_rule(stile_matmul_p, args, dims, owner=params["sparse"], **params)


stile_matmul_p.def_impl(lambda *args, **params: xla.apply_primitive(stile_matmul_p, *args, **params))
stile_matmul_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[stile_matmul_p] = _products.bilinear_jvp(stile_matmul_p, both_flag="with_b_grad")
ad.primitive_transposes[stile_matmul_p] = typed_cotangents(_transpose)
batching.primitive_batchers[stile_matmul_p] = _batch
_lowering.register_traced_lowering(
    stile_matmul_p, _native,
    ("pit_stile_matmul", "pit_row_gather_matmul", "pit_grouped_wgrad", "pit_grouped_wgrad_packed", "pit_sread_live"),
    cuda_fn=functools.partial(_native, cuda=True), core=((2, 2, *_products.INDEX_CORE), (2,)),
)
