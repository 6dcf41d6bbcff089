"""`PitIndex`: the online sparsity index of one matrix (or a batch of them).

A matrix [rows, cols] is covered by micro-tiles of `micro_tile = (h, w)`; edge tiles
may be partial (rows or cols need not be multiples of h or w). A micro-tile is live
when any element is non-zero. The index lists the live tiles, in ANY order (the GPU
takes slots with atomics; PIT's point is that order does not matter):

- `tiles[..., slot]`: linear tile id `tile_row * tile_cols + tile_col`, for
  `slot < min(count, capacity)`. After that the slots are negative: at full capacity
  (the default) they hold the DEAD tiles as `-1 - id` (the list is a permutation of
  all tiles, live first), which lets a product zero its dead outputs in the same
  launch; with a smaller capacity, -1.
- `count[...]`: number of live tiles. It counts every live tile, also those past a
  user-chosen `capacity` (those are dropped: `overflowed()` tells).
- Optional grouped lists, built in the same pass (`group_by`):
  "row": `row_tiles[..., tile_row, slot]` = live tile columns of that tile row,
  `row_count[..., tile_row]` (what a K-axis product of `x` consumes);
  "col": `col_tiles[..., tile_col, slot]` = live tile rows of that tile column,
  `col_count[..., tile_col]` (what a weight-block product consumes);
  "both": both (what the backward passes need). Absent lists are empty arrays
  ([..., 0, 0] and [..., 0]). Slots past a count hold -1.

Arrays are leaves (they may be batched, traced, vmapped); shape, micro-tile and
grouping are static metadata.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

MicroTileSpec = Union[str, Sequence[Optional[int]]]

# group_by -> (row lists, column lists)
GROUPS = {None: (False, False), "row": (True, False), "col": (False, True), "both": (True, True)}

INDEX_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.bool_)


def _static_int(value: Any, what: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be a Python int, got the bool {value!r}")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, jax.Array) or hasattr(value, "aval"):
        raise TypeError(
            f"{what} must be a static Python int, got a traced or device value {type(value).__name__}; "
            f"micro-tiles, capacities and shapes are compile-time constants (mark the argument static "
            f"in jax.jit, e.g. static_argnames)"
        )
    raise TypeError(f"{what} must be a Python int, got {type(value).__name__} {value!r}")


def normalize_micro_tile(micro_tile: MicroTileSpec, shape: Tuple[int, int], what: str = "micro_tile") -> Tuple[int, int]:
    """Resolves `micro_tile` against a [rows, cols] matrix to concrete (h, w).

    Accepts (h, w) with None meaning the whole extent, or "row" for (1, cols).
    """
    rows, cols = shape
    if isinstance(micro_tile, str):
        if micro_tile not in ("row", "rows"):
            raise ValueError(f"{what} must be (h, w) or 'row', got {micro_tile!r}")
        micro_tile = (1, None)
    if not isinstance(micro_tile, (tuple, list)) or len(micro_tile) != 2:
        raise TypeError(f"{what} must be a pair (h, w) of ints (None = whole extent) or 'row', got {micro_tile!r}")
    h = rows if micro_tile[0] is None else _static_int(micro_tile[0], f"{what}[0]")
    w = cols if micro_tile[1] is None else _static_int(micro_tile[1], f"{what}[1]")
    if h < 1 or w < 1:
        raise ValueError(f"{what} must be positive, got ({h}, {w})")
    if h > rows or w > cols:
        raise ValueError(
            f"{what} ({h}, {w}) is larger than the matrix it tiles ({rows}, {cols}); "
            f"expected h <= {rows} and w <= {cols}"
        )
    return h, w


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class PitIndex:
    """Live micro-tiles of a [..., rows, cols] matrix. Build it with `pit_jax.index`."""

    tiles: jax.Array
    count: jax.Array
    row_tiles: jax.Array
    row_count: jax.Array
    col_tiles: jax.Array
    col_count: jax.Array
    shape: Tuple[int, int]
    micro_tile: Tuple[int, int]
    group_by: Optional[str] = None

    # -- pytree -------------------------------------------------------------------
    def tree_flatten(self):
        return self.arrays, (self.shape, self.micro_tile, self.group_by)

    @property
    def arrays(self) -> Tuple[jax.Array, ...]:
        """The six device arrays, in the order the primitives take them."""
        return (self.tiles, self.count, self.row_tiles, self.row_count, self.col_tiles, self.col_count)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)

    # -- static geometry ----------------------------------------------------------
    @property
    def tile_rows(self) -> int:
        return math.ceil(self.shape[0] / self.micro_tile[0])

    @property
    def tile_cols(self) -> int:
        return math.ceil(self.shape[1] / self.micro_tile[1])

    @property
    def num_tiles(self) -> int:
        return self.tile_rows * self.tile_cols

    @property
    def capacity(self) -> int:
        return self.tiles.shape[-1]

    @property
    def batch_shape(self) -> Tuple[int, ...]:
        return tuple(self.count.shape)

    @property
    def has_rows(self) -> bool:
        return GROUPS[self.group_by][0]

    @property
    def has_cols(self) -> bool:
        return GROUPS[self.group_by][1]

    def __repr__(self) -> str:
        return (
            f"PitIndex(shape={self.shape}, micro_tile={self.micro_tile}, capacity={self.capacity}, "
            f"group_by={self.group_by!r}, batch_shape={self.batch_shape})"
        )

    # -- derived views (pure JAX; for references, tests and debugging) -------------
    def overflowed(self) -> jax.Array:
        """True where more tiles were live than `capacity` slots (the excess was dropped)."""
        return self.count > self.capacity

    def tile_mask(self) -> jax.Array:
        """bool [..., tile_rows, tile_cols]: the tiles the index lists."""
        flat = self.tiles.reshape(-1, self.capacity)
        n = self.num_tiles

        def one(tiles):
            valid = tiles >= 0
            return jnp.zeros((n,), jnp.bool_).at[jnp.where(valid, tiles, n)].set(True, mode="drop")

        mask = jax.vmap(one)(flat) if flat.shape[0] else jnp.zeros((0, n), jnp.bool_)
        return mask.reshape(*self.batch_shape, self.tile_rows, self.tile_cols)

    def mask(self) -> jax.Array:
        """bool [..., rows, cols]: elements covered by a listed tile."""
        h, w = self.micro_tile
        m = jnp.repeat(jnp.repeat(self.tile_mask(), h, axis=-2), w, axis=-1)
        return m[..., : self.shape[0], : self.shape[1]]
