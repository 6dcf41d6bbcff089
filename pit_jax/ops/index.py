"""`pit_jax.index`: build the sparsity index of an array inside jit, on the device."""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp

from pit_jax import config, reference
from pit_jax.pit_index import GROUPS, INDEX_DTYPES, MicroTileSpec, PitIndex, _static_int, normalize_micro_tile
from pit_jax.primitives.index import pit_index_p
from pit_jax.primitives.index_split import MAX_SPLIT, pit_index_split_p

_MAX_TILES = 2**31 - 1
_MAX_DIM = 2**31 - 1  # the CUDA kernel's row / column offsets inside an item are 32-bit


def index(
    x: jax.Array,
    micro_tile: MicroTileSpec,
    *,
    capacity: Optional[int] = None,
    group_by: Optional[str] = None,
) -> PitIndex:
    """Lists the live micro-tiles of `x` in one pass, on the device, without a host sync.

    Args:
      x: [..., rows, cols] float32 / bfloat16 / float16 values (a micro-tile is live
        when any element is non-zero) or a bool mask (live when any element is True).
        Leading dims are batch dims: one index per matrix.
      micro_tile: (h, w); None means the whole extent, e.g. (1, None) or "row" for
        token rows, (32, 1) for column strips, (32, 64) for blocks. rows and cols need
        not be multiples of h and w: edge tiles are partial.
      capacity: static number of slots (default: every tile, so nothing is dropped).
        With fewer, tiles past the capacity are dropped and `overflowed()` says so.
      group_by: also list the live tiles per tile row ("row": what a K-axis product
        of x consumes), per tile column ("col": what a weight-block product
        consumes), or both ("both": what their backward passes need). The flat
        list is always built; all lists come from the same single pass.

    Returns:
      A `PitIndex`. Order within each list is unspecified.
    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        x = jnp.asarray(x)
    rows, cols, params = _params(x, micro_tile, capacity, group_by, "pit_jax.index")
    tile_h, tile_w = params["tile_h"], params["tile_w"]
    if config.reference_enabled("index"):
        outs = reference.index(x, **params)
    else:
        outs = pit_index_p.bind(x, **params)
    return PitIndex(*outs[:6], shape=(rows, cols), micro_tile=(tile_h, tile_w), group_by=group_by)


def index_from_tiles(
    live_tiles: jax.Array,
    micro_tile: MicroTileSpec,
    shape,
    *,
    capacity: Optional[int] = None,
    group_by: Optional[str] = None,
    split: bool = False,
) -> Union[PitIndex, Tuple[PitIndex, ...]]:
    """The index of a [..., rows, cols] matrix given which of its micro-tiles are live.

    `index(x, micro_tile)` reduces every element of x to find the live micro-tiles; when
    the caller has already decided per micro-tile (block magnitude pruning scores each
    block), this lists `live_tiles` [..., ceil(rows / h), ceil(cols / w)] directly: one
    pass over the tile mask instead of the matrix, and no element mask to build. The
    result is the index `index(x, micro_tile, ...)` returns for any x whose micro-tiles
    are live exactly where `live_tiles` is (bool, or float32 / bfloat16 / float16: live
    where non-zero).

    Args:
      live_tiles: the tile mask; leading dims are batch dims (one index per matrix).
      micro_tile: (h, w) on the matrix, None = whole extent, as for `index`.
      shape: (rows, cols) of the matrix the index describes.
      capacity, group_by: as for `index`.
      split: live_tiles is [n, tile rows, tile cols] and the result is a tuple of n
        indexes, entry i's arrays in buffers of their own: built in one pass (one per 16
        entries: the kernel takes the entries' buffers as parameters), and a consumer of
        entry i reads it in place, where slicing entry i out of the batched index makes
        XLA copy it (one copy per array). For stacks of kernels that are then used one
        by one (a model's layers).
    """
    if not hasattr(live_tiles, "shape") or not hasattr(live_tiles, "dtype"):
        live_tiles = jnp.asarray(live_tiles)
    if not isinstance(shape, (tuple, list)) or len(shape) != 2:
        raise TypeError(f"pit_jax.index_from_tiles: shape must be (rows, cols), got {shape!r}")
    rows, cols = (_static_int(v, "shape") for v in shape)
    if rows < 1 or cols < 1:
        raise ValueError(f"pit_jax.index_from_tiles: shape must be positive, got {(rows, cols)}")
    tile_h, tile_w = normalize_micro_tile(micro_tile, (rows, cols))
    grid = (math.ceil(rows / tile_h), math.ceil(cols / tile_w))
    if live_tiles.ndim < 2 or tuple(live_tiles.shape[-2:]) != grid:
        raise ValueError(
            f"pit_jax.index_from_tiles: live_tiles must be [..., {grid[0]}, {grid[1]}] (the {tile_h}x{tile_w} "
            f"micro-tiles of a {rows}x{cols} matrix), got shape {tuple(live_tiles.shape)}"
        )
    # The lists name tiles by their place in the tile grid only, so the index of the
    # tile mask with 1x1 micro-tiles is the matrix's index; only the geometry differs.
    geometry = dict(shape=(rows, cols), micro_tile=(tile_h, tile_w), group_by=group_by)
    if not split:
        idx = index(live_tiles, (1, 1), capacity=capacity, group_by=group_by)
        return PitIndex(*idx.arrays, **geometry)
    if live_tiles.ndim != 3 or live_tiles.shape[0] < 1:
        raise ValueError(
            f"pit_jax.index_from_tiles: with split=True, live_tiles must be [n, {grid[0]}, {grid[1]}] with "
            f"n >= 1, got shape {tuple(live_tiles.shape)}"
        )
    params = _params(live_tiles, (1, 1), capacity, group_by, "pit_jax.index_from_tiles", "live_tiles")[2]
    n = live_tiles.shape[0]
    if config.reference_enabled("index"):
        outs = reference.index(live_tiles, **params)
        entries = [[o[i] for o in outs[:6]] for i in range(n)]
    else:
        entries = []
        for start in range(0, n, MAX_SPLIT):  # one build per MAX_SPLIT entries
            part = live_tiles if n <= MAX_SPLIT else live_tiles[start:start + MAX_SPLIT]
            outs = pit_index_split_p.bind(part, **params)
            entries += [outs[6 * i: 6 * i + 6] for i in range(part.shape[0])]
    return tuple(PitIndex(*e, **geometry) for e in entries)


def _params(x, micro_tile, capacity, group_by, op, arg="x"):
    """(rows, cols, pit_index's params) of an index of x, checked; `op` and `arg` name the
    caller and x in the errors."""
    if x.ndim < 2:
        raise ValueError(f"{op}: {arg} must have rank >= 2 ([..., rows, cols]), got shape {tuple(x.shape)}")
    if x.dtype not in [jnp.dtype(d) for d in INDEX_DTYPES]:
        raise TypeError(f"{op}: {arg} must be float32, bfloat16, float16 or bool, got {x.dtype}")
    rows, cols = x.shape[-2:]
    if rows > _MAX_DIM or cols > _MAX_DIM:
        raise ValueError(f"{op}: {arg}'s last two dimensions must be below 2^31, got {(rows, cols)}")
    tile_h, tile_w = normalize_micro_tile(micro_tile, (rows, cols))
    tile_rows, tile_cols = math.ceil(rows / tile_h), math.ceil(cols / tile_w)
    num_tiles = tile_rows * tile_cols
    if num_tiles > _MAX_TILES:
        raise ValueError(f"{op}: {num_tiles} micro-tiles per matrix; at most {_MAX_TILES} are supported")
    if capacity is None:
        capacity = num_tiles
    else:
        capacity = _static_int(capacity, "capacity")
        if not 1 <= capacity <= num_tiles:
            raise ValueError(f"{op}: capacity must be in [1, {num_tiles}] (the number of tiles), got {capacity}")
    if group_by not in GROUPS:
        raise ValueError(f"{op}: group_by must be None, 'row', 'col' or 'both', got {group_by!r}")
    group_rows, group_cols = GROUPS[group_by]
    params = dict(tile_h=tile_h, tile_w=tile_w, capacity=capacity, group_rows=group_rows, group_cols=group_cols)
    return rows, cols, params
