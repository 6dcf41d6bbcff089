"""Block magnitude pruning, recomputed every step inside the jitted step.

A kernel [K, N] is cut into micro-tiles (bk, bn) (PIT's weight blocks: 32x64, or the
finer 32x1 / 1x32); each block scores its L1 norm; the `density` fraction of blocks
with the highest scores stay live. `density` may be a traced scalar (a schedule), since
the threshold is read from the scores on the device, so changing it does not recompile.
The block masks (`live_blocks`: per kernel shape one batched sort, or one
`pit_jax.block_topk_groups` call for every shape) become PitIndexes (W axis) for the
PIT model directly (`weight_indexes`), or element masks that multiply the kernels for
the dense twin (`masks`, `apply_masks`): both compute x @ (w * mask).

The scores can be half-summed where the kernels are written: `ScoredState` carries,
next to the optimizer's state, each kernel's `partial_scores` of the updated weights,
a reduction XLA fuses into the update's own kernels (the weights are read once, by the
update), and `live_blocks_by_shape(..., partials=)` finishes the sums and selects on
the device. The mask is still the current weights' (the update's output is the next
step's input), without a pass over 85 M float32 weights to score them.
"""

from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple, Tuple

import jax
import jax.numpy as jnp
from flax import traverse_util

import pit_jax

TILES = {"32x64": (32, 64), "32x1": (32, 1), "1x32": (1, 32)}


def parse_tile(spec) -> Tuple[int, int]:
    if isinstance(spec, str):
        if spec in TILES:
            return TILES[spec]
        try:
            h, w = (int(v) for v in spec.lower().split("x"))
            return h, w
        except ValueError:
            raise ValueError(f"pruning tile must be 'HxW' (e.g. {sorted(TILES)}), got {spec!r}") from None
    return tuple(spec)


def block_scores(kernel, tile) -> jax.Array:
    """float32 [ceil(K / bk), ceil(N / bn)]: each block's L1 norm (edge blocks partial)."""
    k, n = kernel.shape
    bk, bn = tile
    tk, tn = math.ceil(k / bk), math.ceil(n / bn)
    a = jnp.abs(jax.lax.stop_gradient(kernel)).astype(jnp.float32)
    a = jnp.pad(a, ((0, tk * bk - k), (0, tn * bn - n)))
    return a.reshape(tk, bk, tn, bn).sum(axis=(1, 3))


def partial_scores(kernel, tile) -> jax.Array:
    """float32: the blocks' L1 norms summed along one side of the block only: [K,
    ceil(N / bn)] (each row's sum over a block's bn columns) for blocks wider than one
    column, else [ceil(K / bk), N] (each column's sum over a block's bk rows). A
    reduction along one axis is what XLA fuses into the kernel that writes `kernel`
    (adamw's update), where the whole block sum became a second kernel per matrix (and
    32x64's column sums first made the pruned BERT step 0.13-0.21 ms slower on the H200
    than its row sums).
    `pit_jax.block_topk(partials, partial_tile(tile), density)` finishes the sums: the
    same blocks as from the kernel itself (the sums in another order)."""
    k, n = kernel.shape
    bk, bn = tile
    a = jnp.abs(jax.lax.stop_gradient(kernel)).astype(jnp.float32)
    if bn > 1:
        tn = math.ceil(n / bn)
        return jnp.pad(a, ((0, 0), (0, tn * bn - n))).reshape(k, tn, bn).sum(-1)
    tk = math.ceil(k / bk)
    return jnp.pad(a, ((0, tk * bk - k), (0, 0))).reshape(tk, bk, n).sum(1)


def partial_tile(tile) -> Tuple[int, int]:
    """The block of `partial_scores`' array that one (bk, bn) weight block became."""
    return (tile[0], 1) if tile[1] > 1 else (1, 1)


class ScoredState(NamedTuple):
    """An optimizer's state and the `partial_scores` ({"layer_i/<linear>": array}) of
    some of the pruned kernels of the parameters it goes with (`scored_state`)."""

    opt: Any
    partials: Dict[str, jax.Array]


def scored_state(params, opt_state, tile, linears=None) -> ScoredState:
    """`opt_state` with the partial scores of `params`' pruned kernels (of the `linears`
    named, e.g. ("qkv", "ffn_in"); None: all): the state a pruned step takes and
    returns, computed right after the update so that the sums fuse into it."""
    return ScoredState(opt_state, {n: partial_scores(w, tile) for n, w in pruned_kernels(params).items()
                                   if linears is None or n.split("/", 1)[1] in linears})


def top_blocks(scores, density) -> jax.Array:
    """bool [..., tk, tn]: the top `density` of each matrix's blocks by score (at least
    one; ties may keep a few more). One sort for all leading dims."""
    *lead, tk, tn = scores.shape
    flat = jnp.sort(scores.reshape(*lead, tk * tn), axis=-1)
    keep = jnp.clip(jnp.round(density * flat.shape[-1]).astype(jnp.int32), 1, flat.shape[-1])
    threshold = jnp.take(flat, flat.shape[-1] - keep, axis=-1)
    return scores >= jnp.reshape(threshold, (*lead, 1, 1))


def expand_blocks(live, tile, shape) -> jax.Array:
    """bool [K, N] element mask of a block mask [tk, tn]."""
    bk, bn = tile
    full = jnp.repeat(jnp.repeat(live, bk, axis=0), bn, axis=1)
    return full[: shape[0], : shape[1]]


def block_mask(kernel, density, tile) -> jax.Array:
    """bool [K, N]: the elements of the live blocks (top `density` of blocks by L1 norm)."""
    return expand_blocks(top_blocks(block_scores(kernel, tile), density), tile, kernel.shape)


def pruned_kernels(params, prefix="params") -> Dict[str, jax.Array]:
    """{"layer_i/<linear>": kernel} of the encoder linears that sparse training prunes."""
    from pit_models.bert import LINEARS

    flat = traverse_util.flatten_dict(params[prefix] if prefix else params)
    out = {}
    for path, v in flat.items():
        if len(path) == 3 and path[0].startswith("layer_") and path[1] in LINEARS and path[2] == "kernel":
            out[f"{path[0]}/{path[1]}"] = v
    return out


def names_by_shape(shapes) -> Dict[tuple, list]:
    """{(K, N): [names]} of {name: (K, N)}, names in their given order: the kernels that
    share one batched sort or index build."""
    out: Dict[tuple, list] = {}
    for name, shape in shapes.items():
        out.setdefault(tuple(shape), []).append(name)
    return out


def live_blocks_by_shape(params, density, tile, *, impl="jax", partials=None) -> Dict[tuple, Tuple[list, jax.Array]]:
    """{(K, N): (names, bool [len(names), tk, tn])}: the live blocks of the pruned kernels
    of each shape (the same linear in every layer), decided together (not 48 times) and
    kept stacked for the consumers that take them that way (`weight_indexes`,
    `live_fraction`): a per-kernel slice they would stack again is one more kernel each.
    impl "jax": XLA's block sums and one batched sort per shape (what a JAX user writes);
    "pit": `pit_jax.block_topk_groups`, one call for all the shapes (the same blocks, by a
    radix select on the device, the kernels read once and not stacked, the selects one
    launch). `partials` ({name: `partial_scores`} of these params, e.g.
    `ScoredState.partials`): "pit" finishes their sums instead of reading the kernels,
    for each shape whose kernels all have them."""
    if impl not in ("jax", "pit"):
        raise ValueError(f"live_blocks: impl must be 'jax' or 'pit', got {impl!r}")
    if partials is not None and impl != "pit":
        raise ValueError("live_blocks: partials are read by impl='pit' only")
    kernels = pruned_kernels(params)
    by_shape = names_by_shape({n: w.shape for n, w in kernels.items()})
    if impl == "jax":
        return {shape: (names, top_blocks(jnp.stack([block_scores(kernels[n], tile) for n in names]), density))
                for shape, names in by_shape.items()}
    # One call for every shape: their selects run as one launch on the GPU.
    groups, tiles = [], []
    for names in by_shape.values():
        if partials is not None and all(n in partials for n in names):
            groups.append([partials[n] for n in names])
            tiles.append(partial_tile(tile))
        else:
            groups.append([kernels[n] for n in names])
            tiles.append(tile)
    tops = pit_jax.block_topk_groups(groups, tiles, density)
    return {shape: (names, top.live) for (shape, names), top in zip(by_shape.items(), tops)}


def live_blocks(params, density, tile, *, impl="jax") -> Dict[str, jax.Array]:
    """{"layer_i/<linear>": bool [tk, tn]}: each pruned kernel's live blocks
    (`live_blocks_by_shape`, one entry per kernel)."""
    return unstack(live_blocks_by_shape(params, density, tile, impl=impl))


def stack(blocks, shapes) -> Dict[tuple, Tuple[list, jax.Array]]:
    """{(K, N): (names, bool [n, tk, tn])} of {name: bool [tk, tn]} and {name: (K, N)}."""
    return {shape: (names, jnp.stack([blocks[n] for n in names]))
            for shape, names in names_by_shape({n: shapes[n] for n in blocks}).items()}


def unstack(by_shape) -> Dict[str, jax.Array]:
    """{name: bool [tk, tn]} of {(K, N): (names, bool [n, tk, tn])}."""
    return {n: live[i] for names, live in by_shape.values() for i, n in enumerate(names)}


def element_masks(blocks, tile, shapes) -> Dict[str, jax.Array]:
    """{name: bool [K, N]} of block masks ({name: bool [tk, tn]}, {name: (K, N)})."""
    return {n: expand_blocks(b, tile, shapes[n]) for n, b in blocks.items()}


def masks(params, density, tile) -> Dict[str, jax.Array]:
    """{"layer_i/<linear>": bool [K, N]}: the element masks (what the dense twin multiplies by)."""
    return element_masks(live_blocks(params, density, tile), tile, kernel_shapes(params))


def weight_indexes(blocks, tile, shapes=None, *, train=True):
    """PitIndexes (W axis) of the live blocks, column lists for the forward, row lists
    for dx, built from the block masks directly (`pit_jax.index_from_tiles`, no element
    mask), one build per kernel shape (4 a step for BERT, not 48). `blocks`:
    {(K, N): (names, bool [n, tk, tn])} (`live_blocks_by_shape`), or {name: bool [tk, tn]}
    with `shapes` {name: (K, N)} (stacked here). Each kernel's index is written to buffers
    of its own (`split=True`): a slice of one batched index is a copy per array in XLA
    (144 a step for BERT)."""
    if shapes is not None:
        blocks = stack(blocks, shapes)
    group_by = "both" if train else "col"
    out = {}
    for shape, (names, live) in blocks.items():
        out.update(zip(names, pit_jax.index_from_tiles(live, tile, shape, group_by=group_by, split=True)))
    return out


def kernel_shapes(params) -> Dict[str, tuple]:
    """{"layer_i/<linear>": (K, N)} of the pruned kernels."""
    return {n: tuple(w.shape) for n, w in pruned_kernels(params).items()}


def apply_masks(params, mask_dict):
    """params with every pruned kernel multiplied by its mask (the dense twin's input)."""
    flat = traverse_util.flatten_dict(params)
    for name, m in mask_dict.items():
        layer, lin = name.split("/")
        key = ("params", layer, lin, "kernel")
        flat[key] = flat[key] * m.astype(flat[key].dtype)
    return traverse_util.unflatten_dict(flat)


def masked_kernels(params, by_shape, tile, dtype):
    """params with the pruned kernels of `by_shape` ({(K, N): (names, bool [n, tk, tn])})
    masked and cast to `dtype` by `pit_jax.mask_blocks`, one call per shape: the same
    values as `apply_masks` then the model's cast, from the live blocks' weights only
    (the dense route's input in the pit step). Gradients flow to the float32 kernels."""
    flat = traverse_util.flatten_dict(params)
    for names, live in by_shape.values():
        keys = [("params", *n.split("/"), "kernel") for n in names]
        flat.update(zip(keys, pit_jax.mask_blocks([flat[k] for k in keys], live, tile, dtype)))
    return traverse_util.unflatten_dict(flat)


def live_fraction(mask_dict, tile=None, shapes=None) -> jax.Array:
    """Live fraction of the pruned weights: of element masks ({name: bool [K, N]}), or of
    block masks with the blocks' areas (edge blocks are partial): {name: bool [tk, tn]}
    with `tile` and `shapes` {name: (K, N)}, or {(K, N): (names, bool [n, tk, tn])}
    (`live_blocks_by_shape`) with `tile`, one sum per shape."""
    if tile is None:
        total = sum(m.size for m in mask_dict.values())
        return sum(jnp.sum(m) for m in mask_dict.values()) / total
    if shapes is not None:
        mask_dict = stack(mask_dict, shapes)
    live, total = 0.0, 0
    for (k, n), (names, b) in mask_dict.items():
        bk, bn = tile
        h = jnp.minimum(bk, k - bk * jnp.arange(b.shape[-2]))
        w = jnp.minimum(bn, n - bn * jnp.arange(b.shape[-1]))
        live = live + jnp.sum(jnp.where(b, h[:, None] * w[None, :], 0))
        total += k * n * len(names)
    return live / total
