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


def _list_live(live: jax.Array, size: int, dead_tail: bool = False):
    """Row-major slots of the True entries of each row of `live` [n, m]: ([n, size], [n]).

    Slots past the count are -1, except with `dead_tail` at full capacity (size == m),
    where they hold the dead entries as -1 - id, from the back (as the native kernels
    do for the flat list).
    """

    def one(row):
        (ids,) = jnp.nonzero(row, size=size, fill_value=-1)
        if dead_tail and size == row.shape[0]:
            (dead,) = jnp.nonzero(~row, size=size, fill_value=0)  # ascending dead ids
            slot = jnp.arange(size)
            ids = jnp.where(slot >= row.sum(), -1 - dead[size - 1 - slot], ids)
        return ids.astype(jnp.int32), row.sum(dtype=jnp.int32)

    if live.shape[0] == 0:
        return jnp.zeros((0, size), jnp.int32), jnp.zeros((0,), jnp.int32)
    return jax.vmap(one)(live)


def index(x: jax.Array, *, tile_h: int, tile_w: int, capacity: int, group_rows: bool, group_cols: bool):
    """Reference of the `pit_index` primitive (see pit_jax.primitives.index): 7 arrays."""
    lead = x.shape[:-2]
    live = tile_liveness(x, tile_h, tile_w)
    tr, tc = live.shape[-2:]
    batch = math.prod(lead)
    live = live.reshape(batch, tr, tc)
    tiles, count = _list_live(live.reshape(batch, tr * tc), capacity, dead_tail=True)
    out = [tiles.reshape(*lead, capacity), count.reshape(lead)]
    dead = (tr * tc - count) if capacity == tr * tc else jnp.zeros_like(count)
    for wanted, groups in ((group_rows, live), (group_cols, jnp.swapaxes(live, -1, -2))):
        if wanted:
            g, n = groups.shape[1:]
            lists, counts = _list_live(groups.reshape(batch * g, n), n)
            out += [lists.reshape(*lead, g, n), counts.reshape(*lead, g)]
        else:
            out += [jnp.zeros((*lead, 0, 0), jnp.int32), jnp.zeros((*lead, 0), jnp.int32)]
    return (*out, dead.reshape(lead))


# -- masks from index lists -------------------------------------------------------------


def _valid_slots(lists, counts):
    cap = lists.shape[-1]
    return (jnp.arange(cap) < jnp.minimum(counts, cap)[..., None]) & (lists >= 0)


def _scatter_true(ids, valid, size):
    """bool [..., size] with True at the valid ids (per leading entry)."""
    lead = ids.shape[:-1]
    flat_ids = jnp.where(valid, ids, size).reshape(-1, ids.shape[-1])
    out = jax.vmap(lambda i: jnp.zeros((size,), jnp.bool_).at[i].set(True, mode="drop"))(flat_ids)
    return out.reshape(*lead, size)


def tile_mask_from_flat(tiles, count, tile_rows, tile_cols):
    """bool [..., tile_rows, tile_cols] of the tiles a flat list names."""
    m = _scatter_true(tiles, _valid_slots(tiles, count), tile_rows * tile_cols)
    return m.reshape(*count.shape, tile_rows, tile_cols)


def tile_mask_from_groups(lists, counts, tile_rows, tile_cols, rows: bool):
    """Same from grouped lists: per tile row (`rows`) or per tile column."""
    m = _scatter_true(lists, _valid_slots(lists, counts), tile_cols if rows else tile_rows)
    return m if rows else jnp.swapaxes(m, -1, -2)


def element_mask(tile_mask, tile, shape):
    h, w = tile
    m = jnp.repeat(jnp.repeat(tile_mask, h, axis=-2), w, axis=-1)
    return m[..., : shape[0], : shape[1]]


def _tiled(x, tile):
    """[..., R, C] -> [..., tile_rows * tile_cols, h, w] (zero-padded edge tiles)."""
    rows, cols = x.shape[-2:]
    h, w = tile
    tr, tc = math.ceil(rows / h), math.ceil(cols / w)
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, tr * h - rows), (0, tc * w - cols)])
    x = x.reshape(*x.shape[:-2], tr, h, tc, w)
    return jnp.swapaxes(x, -3, -2).reshape(*x.shape[:-4], tr * tc, h, w)


def _untiled(t, tile, shape):
    """Inverse of `_tiled`, cropped to `shape` = (R, C)."""
    rows, cols = shape
    h, w = tile
    tr, tc = math.ceil(rows / h), math.ceil(cols / w)
    t = t.reshape(*t.shape[:-3], tr, tc, h, w)
    t = jnp.swapaxes(t, -3, -2).reshape(*t.shape[:-4], tr * h, tc * w)
    return t[..., :rows, :cols]


# -- sread / swrite ------------------------------------------------------------------------


def sread(x, tiles, count, *, tile):
    """Reference of `pit_sread`: packed [..., capacity, h, w]."""
    valid = _valid_slots(tiles, count)
    all_tiles = _tiled(x, tile)
    ids = jnp.where(valid, tiles, 0)
    packed = jnp.take_along_axis(all_tiles, ids[..., None, None], axis=-3)
    return jnp.where(valid[..., None, None], packed, jnp.zeros((), x.dtype))


def swrite(packed, tiles, count, base, *, accumulate):
    """Reference of `pit_swrite`: base with the listed tiles overwritten or added to."""
    n = math.prod(math.ceil(s / t) for s, t in zip(base.shape[-2:], packed.shape[-2:]))
    valid = _valid_slots(tiles, count)
    ids = jnp.where(valid, tiles, n).reshape(-1, tiles.shape[-1])
    flat_packed = packed.reshape(-1, *packed.shape[-3:]).astype(jnp.float32)
    contrib = jax.vmap(
        lambda i, p: jnp.zeros((n, *p.shape[-2:]), jnp.float32).at[i].set(p, mode="drop")
    )(ids, flat_packed).reshape(*base.shape[:-2], n, *packed.shape[-2:])
    listed = _scatter_true(tiles, valid, n)[..., None, None] & jnp.ones(packed.shape[-2:], bool)
    contrib = _untiled(contrib, packed.shape[-2:], base.shape[-2:])
    listed = _untiled(listed, packed.shape[-2:], base.shape[-2:])
    base32 = base.astype(jnp.float32)
    out = base32 + contrib if accumulate else jnp.where(listed, contrib, base32)
    return out.astype(base.dtype)


# -- sparse products --------------------------------------------------------------------


def _product(a, b, *, trans_a, trans_b, trans_c, out_batch):
    """float32 op_a(a) @ op_b(b) with pit_jax's prefix batch convention, summed to out_batch."""
    full = max(a.shape[:-2], b.shape[:-2], key=len)
    opa = jnp.swapaxes(a, -1, -2) if trans_a else a
    opb = jnp.swapaxes(b, -1, -2) if trans_b else b
    pad = lambda x: x.reshape(*x.shape[:-2], *([1] * (len(full) - (x.ndim - 2))), *x.shape[-2:])  # noqa: E731
    p = jnp.matmul(pad(opa).astype(jnp.float32), pad(opb).astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    p = jnp.broadcast_to(p, (*full, *p.shape[-2:]))
    p = p.sum(axis=tuple(range(out_batch, len(full))))
    return jnp.swapaxes(p, -1, -2) if trans_c else p


def stile_matmul(a, b, *idx, sparse, tile, trans_a, trans_b, trans_c, allow_tf32, out_batch):
    """Reference of `stile_matmul`: the masked operand is multiplied by its tile mask.

    The mask comes from the same list the native path uses (`plan`), so the two agree
    also when a small flat-list capacity dropped tiles.
    """
    from pit_jax.primitives.stile_matmul import plan

    p = plan(a, b, idx, sparse=sparse, tile=tile, trans_a=trans_a, trans_b=trans_b, trans_c=trans_c,
             out_batch=out_batch)
    s = a if sparse == "a" else b
    if p.lists in ("rows", "cols"):
        lists, counts = (idx[2], idx[3]) if p.lists == "rows" else (idx[4], idx[5])
        tmask = tile_mask_from_groups(lists, counts, p.tile_rows, p.tile_cols, rows=p.lists == "rows")
    else:
        tmask = tile_mask_from_flat(idx[0], idx[1], p.tile_rows, p.tile_cols)
    masked = jnp.where(element_mask(tmask, tile, s.shape[-2:]), s.astype(jnp.float32), 0.0)
    if sparse == "a":
        a = masked
    else:
        b = masked
    out = _product(a, b, trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, out_batch=out_batch)
    return out.astype(s.dtype)


def sdd_matmul(a, b, *idx, tile, trans_a, trans_b, allow_tf32, out_batch):
    """Reference of `sdd_matmul`: the product kept on the listed tiles of the result only."""
    out = _product(a, b, trans_a=trans_a, trans_b=trans_b, trans_c=False, out_batch=out_batch)
    m, n = out.shape[-2:]
    tmask = tile_mask_from_flat(idx[0], idx[1], math.ceil(m / tile[0]), math.ceil(n / tile[1]))
    return jnp.where(element_mask(tmask, tile, (m, n)), out, 0.0).astype(a.dtype)
