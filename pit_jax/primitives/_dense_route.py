"""Masked products through XLA's dot (cuBLAS), for the PIT products whose micro-tiles
are too thin for the gathering kernels to pay off on CUDA.

The generic STile kernel computes a 64-wide output tile per group and gathers K in
16-byte vectors: a group 1 wide (a 32x1 weight strip reduced over its rows) or a K
extent of 1 element wastes most of every tile and every load, and the generic SDD
kernel gives each live tile one block that walks the whole reduction serially (the
weight gradient reduces over every token). Measured on an H100 (BERT-base pruning
step, docs/kernels.md): 0.1-2 ms per call where cuBLAS's dense product takes about
0.03 ms. There the right STile is the dense one: the same masked product, computed
densely with float32 accumulation and rounded once, exactly what the kernels return.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from pit_jax import reference


def _precision(dtype, allow_tf32):
    if dtype == jnp.float32 and not allow_tf32:
        return jax.lax.Precision.HIGHEST
    return jax.lax.Precision.DEFAULT


def product(a, b, *, trans_a, trans_b, trans_c, allow_tf32, out_batch):
    """op_a(a) @ op_b(b) in the operands' own dtype with float32 accumulation (cuBLAS), the
    result in that dtype too where no batch is summed: as XLA's own dot gives it, without a
    float32 result written and read again (the pruned BERT step's W-axis weight gradients:
    36 float32 [768, 3072]-sized results a step)."""
    return reference.product(a, b, trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, out_batch=out_batch,
                             precision=_precision(a.dtype, allow_tf32), upcast=False, out_dtype=a.dtype)


def sdd(a, b, tiles, count, *, tile, trans_a, trans_b, allow_tf32, out_batch):
    """`sdd_matmul`: the dense product kept on the listed tiles of the result."""
    out = product(a, b, trans_a=trans_a, trans_b=trans_b, trans_c=False, allow_tf32=allow_tf32, out_batch=out_batch)
    m, n = out.shape[-2:]
    tmask = reference.tile_mask_from_flat(tiles, count, math.ceil(m / tile[0]), math.ceil(n / tile[1]))
    return jnp.where(reference.element_mask(tmask, tile, (m, n)), out, 0.0).astype(a.dtype)


def stile(a, b, tmask, *, sparse, tile, trans_a, trans_b, trans_c, allow_tf32, out_batch):
    """`stile_matmul`: the masked operand zeroed off its live tiles (`tmask`, bool
    [..., tile_rows, tile_cols] on its stored layout), then the dense product. Where the
    tiles span the masked operand's whole non-reduction extent (an M-axis row list, as in a
    weight gradient x^T dz), the other operand's dead reduction slices are zeroed too: the
    kernels never read them, so they may hold anything (row_activation_bwd leaves them
    unwritten), and 0 * NaN would reach the product."""
    s = a if sparse == "a" else b
    emask = reference.element_mask(tmask, tile, s.shape[-2:])
    s = jnp.where(emask, s, jnp.zeros((), s.dtype))
    # The masked operand's reduction axis (stored layout) and the other operand's.
    s_red = (-2 if trans_a else -1) if sparse == "a" else (-1 if trans_b else -2)
    o_red = (-1 if trans_b else -2) if sparse == "a" else (-2 if trans_a else -1)
    o = b if sparse == "a" else a
    span = tmask.shape[-1 if s_red == -2 else -2] == 1  # one tile across the non-reduction extent
    if span and tuple(tmask.shape[:-2]) == tuple(o.shape[:-2]):
        # One line of the element mask along the reduction axis, oriented as o's.
        live = emask[..., :, :1] if s_red == -2 else emask[..., :1, :]
        if (s_red == -2) != (o_red == -2):
            live = jnp.swapaxes(live, -1, -2)
        o = jnp.where(live, o, jnp.zeros((), o.dtype))
    a, b = (s, o) if sparse == "a" else (o, s)
    out = product(a, b, trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, allow_tf32=allow_tf32, out_batch=out_batch)
    return out.astype(s.dtype)
