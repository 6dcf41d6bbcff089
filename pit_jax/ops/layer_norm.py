"""`pit_jax.layer_norm`: a layer norm (with its residual add) on the live rows only.

    y = pit_jax.layer_norm(x, scale, offset, index, residual=r, bias=b)
      = LN(x + r + b) * scale + offset  on the rows the index lists, 0 on the others

The padded-model companion of `sparse_dense(axis="m")`: with one row index of the valid
tokens, the products skip the padding, and so do the residual adds and layer norms
between them (XLA would run those over every row). `index=None` normalizes every row.
Statistics in float32 with Flax's default variance (E[h^2] - E[h]^2), one rounding to
x's dtype; `flax.linen.LayerNorm(epsilon=...)` gives the same value on live rows.
Differentiable (the gradient runs `pit_row_layer_norm_bwd` on the same rows; forward mode
and second order the jnp expression over all rows) and vmap-able. `dead_rows="unspecified"`
leaves the other rows unwritten (same gradients as "zeros").

A result with two consumers (a residual stream's: the next product reads it, and so does
the next norm as its residual) can be taken as `copies=2`, one reference per consumer:
the backward kernel then adds the two cotangents on the live rows, where JAX would add
them over every row before it.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from pit_jax import config
from pit_jax.ops.sread_swrite import flat_index
from pit_jax.pit_index import PitIndex
from pit_jax.primitives import _products
from pit_jax.primitives.row_layer_norm import reference as _reference
from pit_jax.primitives.row_layer_norm import row_layer_norm as _row_layer_norm

LAYER_NORM_DEAD_ROWS = ("zeros", "unspecified")  # layer_norm(dead_rows=...)


def _vector(v, h, name):
    v = jnp.asarray(v)
    if v.shape != (h,):
        raise ValueError(f"layer_norm: {name} must be [H] = [{h}] (x's last dim), got {tuple(v.shape)}")
    if not jnp.issubdtype(v.dtype, jnp.floating):
        raise TypeError(f"layer_norm: {name} must be a float array, got {v.dtype}")
    return v.astype(jnp.float32)


def layer_norm(
    x: jax.Array,
    scale: jax.Array,
    offset: jax.Array,
    index: Optional[PitIndex] = None,
    *,
    residual: Optional[jax.Array] = None,
    bias: Optional[jax.Array] = None,
    epsilon: float = 1e-6,
    dead_rows: str = "zeros",
    copies: int = 1,
) -> jax.Array | tuple[jax.Array, ...]:
    """Layer norm of `x + residual + bias` over the last axis, on the index's live rows.

    Args:
      x: [..., M, H] float32, bfloat16 or float16.
      scale, offset: [H] (any float dtype; used in float32).
      index: an M-axis `PitIndex` of x's rows (micro-tile (h, H), or a row mask's index
        built from [M, 1]), with x's batch dims or none; None = every row.
      residual: None or x's shape (cast to x's dtype).
      bias: None or [H], added before the statistics (e.g. the preceding product's bias).
      epsilon: added to the variance.
      dead_rows: what the rows the index does not list hold: "zeros" (the default) or
        "unspecified": left unwritten, for a model that never reads them (the GPU
        kernel then skips their writes; the CPU and the jnp reference write NaN there).
        Differentiable as "zeros" is: those rows carry no gradient.
      copies: 1 returns the array; n > 1 a tuple of n references to it (the same buffer),
        one for each consumer, so that the backward adds their cotangents on the live rows
        inside its kernel (the first two; a third and more are added by XLA).

    Returns:
      [..., M, H] in x's dtype: normalized live rows, zeros (or unspecified values) on the
      other rows; with copies > 1, a tuple of that many.
    """
    if dead_rows not in LAYER_NORM_DEAD_ROWS:
        raise ValueError(f"layer_norm: dead_rows must be one of {LAYER_NORM_DEAD_ROWS}, got {dead_rows!r}")
    skip_dead = dead_rows == "unspecified"
    if not _products.is_count(copies):
        raise ValueError(f"layer_norm: copies must be an int >= 1, got {copies!r}")
    copies = int(copies)
    x = jnp.asarray(x)
    if x.dtype not in _products.FLOATS:
        raise TypeError(f"layer_norm: x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"layer_norm: x must be [..., M, H], got shape {tuple(x.shape)}")
    m, h = x.shape[-2:]
    scale, offset = _vector(scale, h, "scale"), _vector(offset, h, "offset")
    bias = None if bias is None else _vector(bias, h, "bias")
    if residual is not None:
        residual = jnp.asarray(residual)
        if tuple(residual.shape) != tuple(x.shape):
            raise ValueError(f"layer_norm: residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
        residual = residual.astype(x.dtype)
    epsilon = float(epsilon)
    if not epsilon >= 0.0:
        raise ValueError(f"layer_norm: epsilon must be >= 0, got {epsilon}")
    batch = tuple(x.shape[:-2])
    if index is None:
        # Every row live: each row its own listed block (a warp per row in the kernel).
        tiles = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), (*batch, m))
        count = jnp.full(batch, m, jnp.int32)
        tile_h = 1
    else:
        tiles, count = flat_index(index, batch, "layer_norm", "x")
        if index.shape[0] != m or index.tile_cols != 1:
            raise ValueError(f"layer_norm: the index must list row blocks of x's {m} rows (micro-tile (h, {h}) of x, "
                             f"or 'row' of an [M, 1] mask), got shape {index.shape}, micro_tile {index.micro_tile}")
        tile_h = index.micro_tile[0]
    args = (x, residual if residual is not None else jnp.zeros((0,), x.dtype),
            bias if bias is not None else jnp.zeros((0,), jnp.float32), scale, offset, tiles, count)
    if config.reference_enabled("layer_norm"):
        y = _reference(*args, tile_h=tile_h, epsilon=epsilon, skip_dead=skip_dead)
        return y if copies == 1 else (y,) * copies
    return _row_layer_norm(*args, tile_h=tile_h, epsilon=epsilon, skip_dead=skip_dead, copies=copies)
