"""Batching and reductions shared by the two grouped (MoE) product primitives.

Operands are (src, other, lists, counts); `other` is w [..., E, D, F] for
`grouped_matmul` and dy [..., A, F] for `grouped_wgrad`. Batch dims follow the prefix
convention of the native targets (docs/kernels.md): each operand's leading dims are a
prefix of one full batch shape, and an operand with fewer dims is shared by the
trailing entries.
"""

from __future__ import annotations

from typing import Sequence, Tuple

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
