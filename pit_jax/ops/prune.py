"""`pit_jax.block_topk`: which blocks of a weight matrix block magnitude pruning keeps,
decided on the device inside jit (the mask a W-axis index is built from)."""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp

from pit_jax import config, reference
from pit_jax.pit_index import MicroTileSpec, normalize_micro_tile
from pit_jax.primitives._products import FLOATS
from pit_jax.primitives.block_topk import block_topk_p


class TopBlocks(NamedTuple):
    """`block_topk`'s results: `live` bool [..., tk, tn], `scores` float32 [..., tk, tn]
    (each block's L1 norm), `thresholds` float32 [...] (each matrix's cut)."""

    live: jax.Array
    scores: jax.Array
    thresholds: jax.Array


def block_topk(
    matrices: Union[jax.Array, Sequence[jax.Array]], micro_tile: MicroTileSpec, density
) -> TopBlocks:
    """The top `density` fraction of each matrix's (h, w) blocks by L1 norm.

    Each block scores sum(|w|) over its elements (edge blocks are partial), in float32.
    A matrix keeps keep = clip(round(density * blocks), 1, blocks) blocks: those whose
    score is at least its keep-th largest score (so ties at the cut keep a few more).
    That is `scores >= jnp.sort(scores)[blocks - keep]`, but found on the GPU by a
    radix select over the scores' bits instead of a sort: at 32 x 1 blocks of BERT-base
    a step's sorts took ~0.7 ms (H100).

    Args:
      matrices: one array [..., K, N] (leading dims: more matrices), or a list of
        arrays of one trailing shape and dtype, e.g. the same kernel of every layer
        (taken as they are: no stacked copy). float32, bfloat16 or float16.
      micro_tile: the block (h, w); None = whole extent, as for `pit_jax.index`; a
        block larger than the matrix covers all of it.
      density: the fraction of blocks to keep; a Python float or a traced float32
        scalar (a schedule changes it without recompiling).

    Returns:
      `TopBlocks(live, scores, thresholds)`: for one array, with its leading dims;
      for a list, stacked over the list ([len(list) * ..., tk, tn]). No gradient
      flows through them. Feed `live` to `pit_jax.index_from_tiles` for the W axis.
      Under `pit_jax.use_reference(ops=("index",))` the sort-based reference runs.

    The L1 norm adds up, so partly summed scores select the same blocks: each row's sum
    of |w| over a block's columns ([..., K, ceil(N / w)]) with micro_tile (h, 1). A
    training step can compute those sums in the optimizer update that writes the weights
    (XLA fuses the reduction there) and skip reading the weights again here
    (examples/pit_models/pruning.py, `partial_scores`).
    """
    single = not isinstance(matrices, (list, tuple))
    mats = [matrices] if single else list(matrices)
    if not mats:
        raise ValueError("pit_jax.block_topk: matrices must be an array or a non-empty list of arrays")
    mats = [m if hasattr(m, "shape") and hasattr(m, "dtype") else jnp.asarray(m) for m in mats]
    first = mats[0]
    for i, m in enumerate(mats):
        what = "matrices" if single else f"matrices[{i}]"
        if m.ndim < 2:
            raise ValueError(f"pit_jax.block_topk: {what} must have rank >= 2 ([..., K, N]), got shape {tuple(m.shape)}")
        if m.dtype not in FLOATS:
            raise TypeError(f"pit_jax.block_topk: {what} must be float32, bfloat16 or float16, got {m.dtype}")
        if m.shape[-2:] != first.shape[-2:] or m.dtype != first.dtype:
            raise ValueError(
                f"pit_jax.block_topk: {what} must match matrices[0]'s trailing shape {tuple(first.shape[-2:])} "
                f"and dtype {first.dtype}, got {tuple(m.shape[-2:])} {m.dtype}"
            )
    k, n = first.shape[-2:]
    if k < 1 or n < 1:
        raise ValueError(f"pit_jax.block_topk: the matrices must not be empty, got [..., {k}, {n}]")
    if isinstance(micro_tile, (tuple, list)) and len(micro_tile) == 2:
        # A block wider or taller than the matrix covers its whole extent (one partial
        # block), as jnp's padded block sums have it.
        micro_tile = tuple(min(v, d) if isinstance(v, int) and v >= 1 else v for v, d in zip(micro_tile, (k, n)))
    tile_h, tile_w = normalize_micro_tile(micro_tile, (k, n), "pit_jax.block_topk: micro_tile")
    grid = (math.ceil(k / tile_h), math.ceil(n / tile_w))
    if grid[0] * grid[1] > 2**30:
        raise ValueError("pit_jax.block_topk: at most 2^30 blocks per matrix are supported")
    density = jnp.asarray(density)
    if density.shape != () or not jnp.issubdtype(density.dtype, jnp.floating):
        raise TypeError(f"pit_jax.block_topk: density must be a float scalar, got {density.dtype}{list(density.shape)}")
    density = density.astype(jnp.float32)
    total = sum(math.prod(m.shape[:-2]) for m in mats)
    if total == 0:
        outs = (jnp.zeros((0, *grid), jnp.bool_), jnp.zeros((0, *grid), jnp.float32), jnp.zeros((0,), jnp.float32))
    elif config.reference_enabled("index"):
        outs = reference.block_topk(density, *mats, tile_h=tile_h, tile_w=tile_w)
    else:
        outs = block_topk_p.bind(density, *(jax.lax.stop_gradient(m) for m in mats), tile_h=tile_h, tile_w=tile_w)
    if single:
        lead = tuple(first.shape[:-2])
        outs = (outs[0].reshape(*lead, *grid), outs[1].reshape(*lead, *grid), outs[2].reshape(lead))
    return TopBlocks(*outs)
