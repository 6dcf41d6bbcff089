"""What the linen and nnx layers share: the sparse product over the last dim of x."""

from __future__ import annotations

import jax.numpy as jnp

import pit_jax


def sparse_matmul_last_dim(inputs, kernel, *, axis, micro_tile, precision, index=None):
    """`inputs @ kernel` over the last dim of inputs ([..., K]), skipping dead micro-tiles.

    Without an index, all leading dims are folded into the rows, so one index covers
    the whole batch (the forward is exact whatever the tiling: the mask comes from
    inputs itself). A given index is used as is (it must match `inputs`).
    """
    if index is not None:
        return pit_jax.sparse_dense(inputs, kernel, index, axis=axis, micro_tile=micro_tile, precision=precision)
    lead = inputs.shape[:-1]
    x2 = jnp.reshape(inputs, (-1, inputs.shape[-1]))
    owner = kernel.shape if axis == "w" else x2.shape  # the matrix the index tiles
    y = pit_jax.sparse_dense(x2, kernel, axis=axis, micro_tile=_fit(micro_tile, axis, owner), precision=precision)
    return jnp.reshape(y, (*lead, kernel.shape[-1]))


def _fit(micro_tile, axis, shape):
    """Defaults clipped to small inputs, so a layer works on any batch size."""
    if micro_tile is not None:
        return micro_tile
    h, w = pit_jax.ops.sparse_dense.DEFAULT_MICRO_TILES[axis]
    return (min(h, shape[0]) if h is not None else None, min(w, shape[1]) if w is not None else None)
