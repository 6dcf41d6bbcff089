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
    """float32 op_a(a) @ op_b(b) in the operands' own dtype on the tensor cores (prefix
    batch broadcasting, leading batch dims past out_batch summed in float32)."""
    full = max(a.shape[:-2], b.shape[:-2], key=len)
    opa = jnp.swapaxes(a, -1, -2) if trans_a else a
    opb = jnp.swapaxes(b, -1, -2) if trans_b else b
    pad = lambda x: x.reshape(*x.shape[:-2], *([1] * (len(full) - (x.ndim - 2))), *x.shape[-2:])  # noqa: E731
    p = jnp.matmul(pad(opa), pad(opb), precision=_precision(a.dtype, allow_tf32), preferred_element_type=jnp.float32)
    p = jnp.broadcast_to(p, (*full, *p.shape[-2:]))
    p = p.sum(axis=tuple(range(out_batch, len(full))))
    return jnp.swapaxes(p, -1, -2) if trans_c else p


def sdd(a, b, tiles, count, *, tile, trans_a, trans_b, allow_tf32, out_batch):
    """`sdd_matmul`: the dense product kept on the listed tiles of the result."""
    out = product(a, b, trans_a=trans_a, trans_b=trans_b, trans_c=False, allow_tf32=allow_tf32, out_batch=out_batch)
    m, n = out.shape[-2:]
    tmask = reference.tile_mask_from_flat(tiles, count, math.ceil(m / tile[0]), math.ceil(n / tile[1]))
    return jnp.where(reference.element_mask(tmask, tile, (m, n)), out, 0.0).astype(a.dtype)


def stile(a, b, tmask, *, sparse, tile, trans_a, trans_b, trans_c, allow_tf32, out_batch):
    """`stile_matmul`: the masked operand zeroed off its live tiles (`tmask`, bool
    [..., tile_rows, tile_cols] on its stored layout), then the dense product."""
    s = a if sparse == "a" else b
    s = jnp.where(reference.element_mask(tmask, tile, s.shape[-2:]), s, jnp.zeros((), s.dtype))
    a, b = (s, b) if sparse == "a" else (a, s)
    out = product(a, b, trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, allow_tf32=allow_tf32, out_batch=out_batch)
    return out.astype(s.dtype)
