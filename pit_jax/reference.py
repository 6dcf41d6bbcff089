"""Pure-JAX references of every pit_jax primitive.

They define what each primitive computes (the test oracle) and are what the kill
switch (`pit_jax.use_reference`) runs. They list tiles in row-major order; the
native paths may list them in any order.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def tile_liveness(x: jax.Array, tile_h: int, tile_w: int) -> jax.Array:
    """bool [..., tile_rows, tile_cols]: whether any element of each micro-tile is non-zero."""
    rows, cols = x.shape[-2:]
    nz = x if x.dtype == jnp.bool_ else x != 0  # -0 is zero, NaN is live
    tr, tc = math.ceil(rows / tile_h), math.ceil(cols / tile_w)
    pad = [(0, 0)] * (x.ndim - 2) + [(0, tr * tile_h - rows), (0, tc * tile_w - cols)]
    nz = jnp.pad(nz, pad)
    nz = nz.reshape(*x.shape[:-2], tr, tile_h, tc, tile_w)
    return nz.any(axis=(-3, -1))


def _list_live(live: jax.Array, size: int):
    """Row-major slots of the True entries of each row of `live` [n, m]: ([n, size], [n])."""

    def one(row):
        (ids,) = jnp.nonzero(row, size=size, fill_value=-1)
        return ids.astype(jnp.int32), row.sum(dtype=jnp.int32)

    if live.shape[0] == 0:
        return jnp.zeros((0, size), jnp.int32), jnp.zeros((0,), jnp.int32)
    return jax.vmap(one)(live)


def index(x: jax.Array, *, tile_h: int, tile_w: int, capacity: int, group_rows: bool, group_cols: bool):
    """Reference of the `pit_index` primitive (see pit_jax.primitives.index)."""
    lead = x.shape[:-2]
    live = tile_liveness(x, tile_h, tile_w)
    tr, tc = live.shape[-2:]
    batch = math.prod(lead)
    live = live.reshape(batch, tr, tc)
    tiles, count = _list_live(live.reshape(batch, tr * tc), capacity)
    out = [tiles.reshape(*lead, capacity), count.reshape(lead)]
    for wanted, groups in ((group_rows, live), (group_cols, jnp.swapaxes(live, -1, -2))):
        if wanted:
            g, n = groups.shape[1:]
            lists, counts = _list_live(groups.reshape(batch * g, n), n)
            out += [lists.reshape(*lead, g, n), counts.reshape(*lead, g)]
        else:
            out += [jnp.zeros((*lead, 0, 0), jnp.int32), jnp.zeros((*lead, 0), jnp.int32)]
    return tuple(out)
