"""`pit_block_topk`: block magnitude pruning's mask, on the device, with no sort.

Operands: density float32 [], then the matrices of one or more groups, group after group
(`groups[g]` operands each); a group's matrices [..., K_g, N_g] share one trailing shape
and dtype (float32 / bfloat16 / float16; leading dims are more matrices) and one block
`tiles[g]` = (h, w). Results, three per group, with M_g = the group's matrices in operand
order and (tk, tn) = (ceil(K_g / h), ceil(N_g / w)):
  live bool [M_g, tk, tn]: the blocks whose score is at least the matrix's cut,
  scores float32 [M_g, tk, tn]: each block's L1 norm (sum of |w|; edge blocks partial),
  thresholds float32 [M_g]: the cut, the keep-th largest score of the matrix, where
    keep = clip(round_half_even(density * tk * tn), 1, tk * tn) (NaN density: 1).
Params: tiles, groups.

Taking the matrices as separate operands lets a model prune its 12 same-shaped kernels
in one call without stacking (a copy of every weight); taking several groups lets it
prune all its kernel shapes in one call, whose selects run as one launch (the select is
latency-bound: four launches cost about four times one). No gradient flows: the results
are functions of stop_gradient(w) (their tangents are zero). vmap: the mapped axis
becomes more matrices of each group (a mapped density runs the reference). Under jit
over several devices it has no batch-split rule (its results concatenate its operands'
matrices), so XLA gathers the matrices whole, as pruned kernels are in data-parallel
training.
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
from pit_jax.primitives._vma import Primitive, zero_tangent

block_topk_p = Primitive("pit_block_topk")
block_topk_p.multiple_results = True


def _group_operands(mats, groups):
    """The matrix operands split by group."""
    out, first = [], 0
    for count in groups:
        out.append(mats[first:first + count])
        first += count
    return out


def _abstract_eval(density, *mats, tiles, groups):
    outs = []
    for (tile_h, tile_w), ms in zip(tiles, _group_operands(mats, groups)):
        k, n = ms[0].shape[-2:]
        m = sum(math.prod(a.shape[:-2]) for a in ms)
        grid = (m, math.ceil(k / tile_h), math.ceil(n / tile_w))
        outs += [ShapedArray(grid, jnp.bool_), ShapedArray(grid, jnp.float32), ShapedArray((m,), jnp.float32)]
    return outs


def _jvp(primals, tangents, **params):
    outs = block_topk_p.bind(*primals, **params)
    return outs, [zero_tangent(o) for o in outs]


def reference_groups(density, *mats, tiles, groups):
    """The results of every group by the sort-based reference (pit_jax.reference)."""
    outs = []
    for (tile_h, tile_w), ms in zip(tiles, _group_operands(mats, groups)):
        outs += list(reference.block_topk(density, *ms, tile_h=tile_h, tile_w=tile_w))
    return outs


def _batch(args, dims, *, tiles, groups):
    density, *mats = args
    d_density, *d_mats = dims
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    if d_density is not None:
        fn = lambda *a: reference_groups(*a, tiles=tiles, groups=groups)  # noqa: E731
        outs = jax.vmap(fn, in_axes=tuple(dims))(*args)
        return outs, (0,) * len(outs)
    # Each operand's matrices as [size, m_i, K, N]; a group's results come back operand
    # by operand ([size * m_i] each) and are regrouped as [size, M_g].
    lead = []
    moved = []
    for a, d in zip(mats, d_mats):
        a = jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
        lead.append(math.prod(a.shape[1:-2]))
        moved.append(a)
    outs = block_topk_p.bind(density, *moved, tiles=tiles, groups=groups)
    regrouped = []
    for g, group_lead in enumerate(_group_operands(lead, groups)):
        for out in outs[3 * g:3 * g + 3]:
            parts, start = [], 0
            for m in group_lead:
                parts.append(out[start:start + size * m].reshape(size, m, *out.shape[1:]))
                start += size * m
            regrouped.append(jnp.concatenate(parts, axis=1))
    return regrouped, (0,) * len(regrouped)


def _lowering_rule(ctx, *args, tiles, groups):
    return jax.ffi.ffi_lowering("pit_block_topk")(
        ctx, *args, tile_h=np.array([t[0] for t in tiles], np.int64), tile_w=np.array([t[1] for t in tiles], np.int64),
        group_sizes=np.array(groups, np.int64),
    )


block_topk_p.def_impl(lambda *args, **params: xla.apply_primitive(block_topk_p, *args, **params))
block_topk_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[block_topk_p] = _jvp
batching.primitive_batchers[block_topk_p] = _batch
_lowering.register_platforms(block_topk_p, _lowering_rule, "pit_block_topk")
