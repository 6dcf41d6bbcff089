"""`pit_jax.block_topk`: which blocks of a weight matrix block magnitude pruning keeps,
decided on the device inside jit (the mask a W-axis index is built from)."""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from pit_jax import config, reference
from pit_jax.pit_index import MicroTileSpec, normalize_micro_tile
from pit_jax.primitives._products import FLOATS
from pit_jax.primitives.block_topk import block_topk_p, reference_groups
from pit_jax.primitives.mask_blocks import mask_blocks_p


# Groups one pit_block_topk call takes (cuda/common/block_topk_params.h, kTopkMaxGroups).
MAX_GROUPS = 16


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
        scalar (a schedule changes it without recompiling). A known value outside
        [0, 1] is an error; a traced one keeps between 1 block and all of them.

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
    return _block_topk_groups("pit_jax.block_topk", ["matrices"], [matrices], [micro_tile], density)[0]


def block_topk_groups(
    groups: Sequence[Union[jax.Array, Sequence[jax.Array]]],
    micro_tiles: Union[MicroTileSpec, Sequence[MicroTileSpec]],
    density,
) -> list:
    """`block_topk` of several groups of matrices in one call: a model's kernels of every
    shape, say, each group what `block_topk` takes (an array, or a list of arrays of one
    trailing shape and dtype). The groups may differ in shape, dtype and block; the
    density is shared. On the GPU each group's scores run as before and the selects of
    all of them as one launch (the select is latency-bound: BERT-base's four kernel
    shapes cost ~22 us a step as four launches, docs/workloads.md).

    Args:
      groups: a non-empty sequence of at most 16 groups.
      micro_tiles: one block (h, w) for every group, or a sequence of one per group.
      density: as for `block_topk`.

    Returns:
      A list of `TopBlocks`, one per group: exactly what `block_topk(groups[g],
      micro_tiles[g], density)` returns.
    """
    if not isinstance(groups, (list, tuple)) or not groups:
        raise ValueError("pit_jax.block_topk_groups: groups must be a non-empty list of arrays or lists of arrays")
    if len(groups) > MAX_GROUPS:
        raise ValueError(f"pit_jax.block_topk_groups: at most {MAX_GROUPS} groups, got {len(groups)}")
    per_group = not _is_tile_spec(micro_tiles)
    if per_group and (not isinstance(micro_tiles, (list, tuple)) or len(micro_tiles) != len(groups)):
        raise ValueError(
            f"pit_jax.block_topk_groups: micro_tiles must be one block (h, w) or a list of one per group "
            f"({len(groups)}), got {micro_tiles!r}"
        )
    tiles = list(micro_tiles) if per_group else [micro_tiles] * len(groups)
    names = [f"groups[{g}]" for g in range(len(groups))]
    return _block_topk_groups("pit_jax.block_topk_groups", names, list(groups), tiles, density)


def _is_tile_spec(t) -> bool:
    """Whether `t` is one micro-tile spec (None, a name, or (h, w) of ints / None)."""
    return t is None or isinstance(t, str) or (
        isinstance(t, (tuple, list)) and len(t) == 2 and all(v is None or isinstance(v, int) for v in t)
    )


def _group(fn, name, matrices, micro_tile):
    """(single, mats, (tile_h, tile_w), grid) of one group, validated; `name` names it."""
    single = not isinstance(matrices, (list, tuple))
    mats = [matrices] if single else list(matrices)
    if not mats:
        raise ValueError(f"{fn}: {name} must be an array or a non-empty list of arrays")
    mats = [m if hasattr(m, "shape") and hasattr(m, "dtype") else jnp.asarray(m) for m in mats]
    first = mats[0]
    for i, m in enumerate(mats):
        what = name if single else f"{name}[{i}]"
        if m.ndim < 2:
            raise ValueError(f"{fn}: {what} must have rank >= 2 ([..., K, N]), got shape {tuple(m.shape)}")
        if m.dtype not in FLOATS:
            raise TypeError(f"{fn}: {what} must be float32, bfloat16 or float16, got {m.dtype}")
        if m.shape[-2:] != first.shape[-2:] or m.dtype != first.dtype:
            raise ValueError(
                f"{fn}: {what} must match {name}[0]'s trailing shape {tuple(first.shape[-2:])} "
                f"and dtype {first.dtype}, got {tuple(m.shape[-2:])} {m.dtype}"
            )
    k, n = first.shape[-2:]
    if k < 1 or n < 1:
        raise ValueError(f"{fn}: the matrices must not be empty, got [..., {k}, {n}]")
    if isinstance(micro_tile, (tuple, list)) and len(micro_tile) == 2:
        # A block wider or taller than the matrix covers its whole extent (one partial
        # block), as jnp's padded block sums have it.
        micro_tile = tuple(min(v, d) if isinstance(v, int) and v >= 1 else v for v, d in zip(micro_tile, (k, n)))
    tile_h, tile_w = normalize_micro_tile(micro_tile, (k, n), f"{fn}: micro_tile")
    grid = (math.ceil(k / tile_h), math.ceil(n / tile_w))
    if grid[0] * grid[1] > 2**30:
        raise ValueError(f"{fn}: at most 2^30 blocks per matrix are supported")
    return single, mats, (tile_h, tile_w), grid


def _block_topk_groups(fn, names, groups, micro_tiles, density) -> list:
    parts = [_group(fn, name, m, t) for name, m, t in zip(names, groups, micro_tiles)]
    if isinstance(density, (int, float, np.integer, np.floating)) and not isinstance(density, (bool, np.bool_)):
        # A Python or NumPy number (0 and 1 too) is known even under jit, where
        # jnp.asarray would make it a tracer and skip the range check.
        known = float(density)
    else:
        density = jnp.asarray(density)
        if density.shape != () or not jnp.issubdtype(density.dtype, jnp.floating):
            raise TypeError(f"{fn}: density must be a float scalar, got {density.dtype}{list(density.shape)}")
        try:
            known = float(density)
        except jax.errors.ConcretizationTypeError:  # traced: the op clips it
            known = None
    if known is not None and not 0.0 <= known <= 1.0:  # NaN fails too
        raise ValueError(f"{fn}: density must be a fraction in [0, 1], got {known}")
    density = jnp.asarray(density, jnp.float32)
    # Groups without matrices (a leading dim of 0) get empty results and stay out of the call.
    live_groups = [g for g, (_, mats, _, _) in enumerate(parts) if sum(math.prod(m.shape[:-2]) for m in mats) > 0]
    outs = {}
    if live_groups:
        mats = [m for g in live_groups for m in parts[g][1]]
        tiles = tuple(parts[g][2] for g in live_groups)
        sizes = tuple(len(parts[g][1]) for g in live_groups)
        if config.reference_enabled("index"):
            flat = reference_groups(density, *mats, tiles=tiles, groups=sizes)
        else:
            flat = block_topk_p.bind(density, *(jax.lax.stop_gradient(m) for m in mats), tiles=tiles, groups=sizes)
        outs = {g: tuple(flat[3 * i:3 * i + 3]) for i, g in enumerate(live_groups)}
    results = []
    for g, (single, mats, _, grid) in enumerate(parts):
        out = outs.get(g) or (jnp.zeros((0, *grid), jnp.bool_), jnp.zeros((0, *grid), jnp.float32),
                              jnp.zeros((0,), jnp.float32))
        if single:
            lead = tuple(mats[0].shape[:-2])
            out = (out[0].reshape(*lead, *grid), out[1].reshape(*lead, *grid), out[2].reshape(lead))
        results.append(TopBlocks(*out))
    return results


def mask_blocks(
    matrices: Union[jax.Array, Sequence[jax.Array]], live: jax.Array, micro_tile: MicroTileSpec, dtype=None
):
    """Each matrix with its dead blocks set to 0 and its live ones cast to `dtype`: what
    block-pruned training computes for its products, `jnp.where(mask, w, 0).astype(dtype)`
    with `mask` the blocks of `live` spread over their elements.

    On the GPU one kernel does it for all the matrices, reading only the live blocks
    (XLA's masked cast reads every weight, one launch per matrix): at 50 % density it
    moves half the float32 weights. Differentiable in the matrices: the gradient is the
    cotangent masked the same way, cast back (jnp ops, which XLA fuses into the
    gradient's consumer). A dead block gives 0 even where it holds NaN or inf.

    Args:
      matrices: one array [..., K, N], or a list of arrays of one trailing shape and
        dtype (float32, bfloat16 or float16), as `block_topk` takes them.
      live: bool, the blocks as `block_topk` returns them: for one array [..., tk, tn]
        with its leading dims, for a list [M, tk, tn] stacked over the list (M counts
        every matrix, leading dims flattened); (tk, tn) = (ceil(K / h), ceil(N / w)).
      micro_tile: the block (h, w), as for `block_topk`.
      dtype: the results' dtype (float32, bfloat16 or float16); None keeps the matrices'.

    Returns:
      An array for one array, a list for a list: each matrix's shape, in `dtype`.
      Under `pit_jax.use_reference(ops=("index",))` the jnp version runs.
    """
    fn = "pit_jax.mask_blocks"
    single, mats, (tile_h, tile_w), grid = _group(fn, "matrices", matrices, micro_tile)
    dtype = jnp.dtype(mats[0].dtype if dtype is None else dtype)
    if dtype not in FLOATS:
        raise TypeError(f"{fn}: dtype must be float32, bfloat16 or float16, got {dtype}")
    live = live if hasattr(live, "shape") and hasattr(live, "dtype") else jnp.asarray(live)
    count = sum(math.prod(m.shape[:-2]) for m in mats)
    want = (*mats[0].shape[:-2], *grid) if single else (count, *grid)
    if live.dtype != jnp.bool_ or tuple(live.shape) != want:
        whose = "each matrix" if single else "every matrix, stacked"
        raise ValueError(f"{fn}: live must be bool {list(want)} (the blocks of {whose}), "
                         f"got {live.dtype}{list(live.shape)}")
    flat = jnp.reshape(live, (count, *grid))
    if count == 0:
        outs = [jnp.zeros(m.shape, dtype) for m in mats]
    elif config.reference_enabled("index"):
        outs = reference.mask_blocks(flat, *mats, tile_h=tile_h, tile_w=tile_w, dtype=dtype)
    else:
        outs = mask_blocks_p.bind(flat, *mats, tile=(tile_h, tile_w), dtype=dtype)
    return outs[0] if single else list(outs)
