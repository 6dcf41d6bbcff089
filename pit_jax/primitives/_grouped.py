"""Batching and reductions shared by the two grouped (MoE) product primitives.

Operands are (src, other, lists, counts); `other` is w [..., E, D, F] for
`grouped_matmul` and dy [..., A, F] for `grouped_wgrad`. Batch dims follow the prefix
convention of the native targets (docs/kernels.md): each operand's leading dims are a
prefix of one full batch shape, and an operand with fewer dims is shared by the
trailing entries.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import jax.numpy as jnp

from pit_jax.primitives import _products


def batch_dims(src, other, lists, *, other_rank: int) -> Tuple[Tuple[int, ...], ...]:
    """(src, other, index) batch shapes."""
    return tuple(src.shape[:-2]), tuple(other.shape[:-other_rank]), tuple(lists.shape[:-2])


def full_batch(src, other, lists, *, other_rank: int, what: str) -> Tuple[int, ...]:
    return _products.full_batch(*batch_dims(src, other, lists, other_rank=other_rank), what=what)


def reduce_rows(x, row_div: int):
    """[..., A, D] -> [..., A / row_div, D]: sums the row_div assignments of each token (float32)."""
    if row_div == 1:
        return x.astype(jnp.float32)
    return x.reshape(*x.shape[:-2], x.shape[-2] // row_div, row_div, x.shape[-1]).astype(jnp.float32).sum(-2)


def reduce_batch(x, keep: int, dtype):
    """Sums the batch dims past the first `keep` (a shared operand's gradient) and casts."""
    nb = x.ndim - 2
    if keep < nb:
        x = x.astype(jnp.float32).sum(axis=tuple(range(keep, nb)))
    return x.astype(dtype)


def folded_index(lists, counts):
    """One routing index over a batch of token groups: lists [..., E+1, A] and counts
    [..., E+1] of G groups -> [E+1, G*A] and [E+1], assignment a of group g becoming
    g*A + a (each group's lists in group order, so the result is a fixed function of the
    index: the products stay deterministic). Entries past a count are never read."""
    e1, a = lists.shape[-2:]
    g = math.prod(lists.shape[:-2])
    lists, counts = lists.reshape(g, e1, a), jnp.clip(counts.reshape(g, e1), 0, a)
    start = jnp.cumsum(counts, axis=0) - counts  # each group's offset in an expert's folded list
    i = jnp.arange(a, dtype=jnp.int32)
    pos = jnp.where(i < counts[:, :, None], start[:, :, None] + i, g * a)  # past the count: dropped
    vals = lists + (jnp.arange(g, dtype=jnp.int32) * a)[:, None, None]
    rows = jnp.arange(e1, dtype=jnp.int32)[None, :, None]
    out = jnp.zeros((e1, g * a), jnp.int32).at[rows, pos].set(vals, mode="drop", unique_indices=True)
    return out, counts.sum(0, dtype=jnp.int32)


def foldable(src, lists, shared) -> Optional[Tuple[int, ...]]:
    """The batch of token groups to fold into one, or None: src and the index carry the same
    batch and the weight (`shared`: w, or the summed-over dW) has none. Per-group tiles
    are cut at each group's expert counts, so small groups waste most of their tiles
    (E = 64 over 8 groups of 2048 tokens: 2.4x the folded time, forward + backward on the
    H200); one index over all the groups' tokens has the folded tiles."""
    lead = tuple(src.shape[:-2])
    if lead and shared and tuple(lists.shape[:-2]) == lead:
        return lead
    return None


def batch_rule(prim, args, dims, base_ranks: Sequence[int], **params):
    """vmap: the vmapped axis becomes the first batch dim of every batched operand.

    Operands that are not vmapped stay shared when they have no batch dims; otherwise
    they are broadcast over the new axis (the prefix convention). lists and counts move
    together.
    """
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    index_mapped = dims[2] is not None or dims[3] is not None
    out = []
    for i, (x, d, rank) in enumerate(zip(args, dims, base_ranks)):
        if d is not None:
            x = jnp.moveaxis(x, d, 0)
        elif (i >= 2 and index_mapped) or x.ndim > rank:
            x = jnp.broadcast_to(x, (size, *x.shape))
        out.append(x)
    if "out_batch" in params:
        params = dict(params, out_batch=params["out_batch"] + 1)
    return prim.bind(*out, **params), 0
