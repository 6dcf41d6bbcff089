"""`pit_mask_blocks`: a block mask applied to weight matrices, and cast, in one pass.

Operands: live bool [M, tk, tn], then matrices [..., K, N] of one trailing shape and dtype
(float32 / bfloat16 / float16; leading dims are more matrices; M counts them all, in
operand order, and (tk, tn) = (ceil(K / h), ceil(N / w)) for the block `tile` = (h, w)).
Results, one per matrix operand, of its shape in `dtype`: the elements of live blocks
converted (rounded to nearest even), those of dead blocks 0 (a dead block is not read:
NaN there gives 0, as `jnp.where` does). Params: tile, dtype.

Block-pruned training multiplies each kernel by its mask and casts it for the product
every step: XLA reads all of the float32 weights for that, in one launch per kernel.
This op reads only the live blocks, for every same-shaped kernel of a model in one
launch (pit_jax.mask_blocks). It is linear in the matrices: its tangent is the masked
cast by jnp ops, whose transpose (the masked gradient) XLA fuses into whatever reads
it (an optimizer's update). vmap: the mapped axis becomes more matrices. Under jit over
several devices it has no batch-split rule: XLA gathers the matrices whole, as pruned
kernels are in data-parallel training.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax import reference
from pit_jax.primitives import _lowering
from pit_jax.primitives._vma import Primitive

mask_blocks_p = Primitive("pit_mask_blocks")
mask_blocks_p.multiple_results = True


def _abstract_eval(live, *mats, tile, dtype):
    return [ShapedArray(m.shape, dtype) for m in mats]


def _jvp(primals, tangents, *, tile, dtype):
    live, *mats = primals
    outs = mask_blocks_p.bind(live, *mats, tile=tile, dtype=dtype)
    # Linear in the matrices: the tangent is the same masked cast, by jnp ops (their
    # transpose is the gradient's mask, which XLA fuses into its consumer).
    tans, first = [], 0
    for m, t, o in zip(mats, tangents[1:], outs):
        count = math.prod(m.shape[:-2])
        if type(t) is ad.Zero:
            tans.append(ad.Zero(jax.typeof(o).to_tangent_aval()))
        else:
            tans.append(reference.mask_blocks(live[first:first + count], ad.instantiate_zeros(t), tile_h=tile[0],
                                              tile_w=tile[1], dtype=dtype)[0])
        first += count
    return outs, tans


def _batch(args, dims, *, tile, dtype):
    live, *mats = args
    d_live, *d_mats = dims
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    # Each operand as [size, *lead, K, N]; its size * lead matrices come one after the other,
    # so each one's blocks are taken from live ([size, M, ...] or [M, ...]) in that order.
    moved = [jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
             for a, d in zip(mats, d_mats)]
    live = jnp.broadcast_to(live, (size, *live.shape)) if d_live is None else jnp.moveaxis(live, d_live, 0)
    parts, first = [], 0
    for a in moved:
        count = math.prod(a.shape[1:-2])
        parts.append(live[:, first:first + count].reshape(size * count, *live.shape[2:]))
        first += count
    outs = mask_blocks_p.bind(jnp.concatenate(parts), *moved, tile=tile, dtype=dtype)
    return outs, (0,) * len(outs)


def _lowering_rule(ctx, *args, tile, dtype):
    return jax.ffi.ffi_lowering("pit_mask_blocks")(ctx, *args, tile_h=np.int64(tile[0]), tile_w=np.int64(tile[1]))


mask_blocks_p.def_impl(lambda *args, **params: xla.apply_primitive(mask_blocks_p, *args, **params))
mask_blocks_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[mask_blocks_p] = _jvp
batching.primitive_batchers[mask_blocks_p] = _batch
_lowering.register_platforms(mask_blocks_p, _lowering_rule, "pit_mask_blocks")
