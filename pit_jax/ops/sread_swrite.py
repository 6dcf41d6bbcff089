"""`pit_jax.sread` / `pit_jax.swrite`: PIT's gather and scatter, for users composing ops.

    packed = pit_jax.sread(x, index)               # [..., capacity, h, w] live tiles
    y = pit_jax.swrite(f(packed), index)           # back in place, zeros elsewhere
    y = pit_jax.swrite(f(packed), index, out=x)    # ... or over x (accumulate=True adds)

Both are linear and differentiable (each is the other's transpose), vmap-able, and
run as native gather/scatter kernels.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from pit_jax import config, reference
from pit_jax.pit_index import PitIndex
from pit_jax.primitives import _products
from pit_jax.primitives.sread import sread as _sread
from pit_jax.primitives.swrite import swrite as _swrite


def flat_index(index: PitIndex, batch, what: str, data: str = "the data"):
    """The index's flat list (tiles, count) for data with leading dims `batch`: an index
    without batch dims is broadcast; other batch dims are an error naming `what`."""
    if not isinstance(index, PitIndex):
        raise TypeError(f"{what}: index must be a pit_jax.PitIndex, got {type(index).__name__}")
    tiles, count = index.tiles, index.count
    if index.batch_shape != tuple(batch):
        if index.batch_shape:
            raise ValueError(f"{what}: the index has batch dims {index.batch_shape}, {data} has {tuple(batch)}")
        tiles = jnp.broadcast_to(tiles, (*batch, *tiles.shape))
        count = jnp.broadcast_to(count, tuple(batch))
    return tiles, count


def _check_float(x, what, name):
    if jnp.dtype(x.dtype) not in _products.FLOATS:
        raise TypeError(f"{what}: {name} must be float32, bfloat16 or float16, got {x.dtype}")


def sread(x: jax.Array, index: PitIndex) -> jax.Array:
    """Gathers the live micro-tiles of x into [..., capacity, h, w] (slots past the count are 0)."""
    x = jnp.asarray(x)
    _check_float(x, "sread", "x")
    if x.ndim < 2 or tuple(x.shape[-2:]) != tuple(getattr(index, "shape", ())):
        raise ValueError(f"sread: the index was built for {getattr(index, 'shape', None)}, x is {tuple(x.shape)}")
    tiles, count = flat_index(index, x.shape[:-2], "sread", "x")
    if config.reference_enabled("sread"):
        return reference.sread(x, tiles, count, tile=index.micro_tile)
    return _sread(x, tiles, count, tile=index.micro_tile)


def swrite(packed: jax.Array, index: PitIndex, out: Optional[jax.Array] = None, *, accumulate: bool = False):
    """Scatters packed tiles [..., capacity, h, w] to their places.

    Untouched places are zero (or `out`'s values when given); with `accumulate` the
    tiles are added to `out` instead of replacing it.
    """
    packed = jnp.asarray(packed)
    _check_float(packed, "swrite", "packed")
    if not isinstance(index, PitIndex):
        raise TypeError(f"swrite: index must be a pit_jax.PitIndex, got {type(index).__name__}")
    if packed.ndim < 3 or tuple(packed.shape[-2:]) != tuple(index.micro_tile) or packed.shape[-3] != index.capacity:
        raise ValueError(
            f"swrite: packed must be [..., {index.capacity}, {index.micro_tile[0]}, {index.micro_tile[1]}] for this "
            f"index, got {tuple(packed.shape)}"
        )
    batch = packed.shape[:-3]
    if out is None:
        out = jnp.zeros((*batch, *index.shape), packed.dtype)
    else:
        out = jnp.asarray(out)
        if tuple(out.shape) != (*batch, *index.shape) or out.dtype != packed.dtype:
            raise ValueError(f"swrite: out must be {(*batch, *index.shape)} {packed.dtype}, got {out.shape} {out.dtype}")
    tiles, count = flat_index(index, batch, "swrite", "packed")
    if config.reference_enabled("swrite"):
        return reference.swrite(packed, tiles, count, out, accumulate=accumulate)
    return _swrite(packed, tiles, count, out, accumulate=accumulate)
