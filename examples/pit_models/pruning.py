"""Block magnitude pruning, recomputed every step inside the jitted step.

A kernel [K, N] is cut into micro-tiles (bk, bn) (PIT's weight blocks: 32x64, or the
finer 32x1 / 1x32); each block scores its L1 norm; the `density` fraction of blocks
with the highest scores stay live. `density` may be a traced scalar (a schedule), since
the threshold is read from the sorted scores, so changing it does not recompile. The
masks become PitIndexes (W axis) for the PIT model, or multiply the kernels for the
dense twin (`apply_masks`): both compute x @ (w * mask).
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

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


def block_mask(kernel, density, tile) -> jax.Array:
    """bool [K, N]: the elements of the live blocks (top `density` of blocks by L1 norm)."""
    k, n = kernel.shape
    bk, bn = tile
    tk, tn = math.ceil(k / bk), math.ceil(n / bn)
    a = jnp.abs(jax.lax.stop_gradient(kernel)).astype(jnp.float32)
    a = jnp.pad(a, ((0, tk * bk - k), (0, tn * bn - n)))
    scores = a.reshape(tk, bk, tn, bn).sum(axis=(1, 3))
    flat = jnp.sort(scores.reshape(-1))
    keep = jnp.clip(jnp.round(density * flat.shape[0]).astype(jnp.int32), 1, flat.shape[0])
    live = scores >= flat[flat.shape[0] - keep]  # ties may keep a few more
    full = jnp.repeat(jnp.repeat(live, bk, axis=0), bn, axis=1)
    return full[:k, :n]


def pruned_kernels(params, prefix="params") -> Dict[str, jax.Array]:
    """{"layer_i/<linear>": kernel} of the encoder linears that sparse training prunes."""
    from pit_models.bert import LINEARS

    flat = traverse_util.flatten_dict(params[prefix] if prefix else params)
    out = {}
    for path, v in flat.items():
        if len(path) == 3 and path[0].startswith("layer_") and path[1] in LINEARS and path[2] == "kernel":
            out[f"{path[0]}/{path[1]}"] = v
    return out


def masks(params, density, tile) -> Dict[str, jax.Array]:
    return {name: block_mask(w, density, tile) for name, w in pruned_kernels(params).items()}


def weight_indexes(mask_dict, tile, *, train=True):
    """PitIndexes (W axis) of the masks: column lists feed the forward, row lists dx."""
    return {name: pit_jax.index(m, tile, group_by="both" if train else "col") for name, m in mask_dict.items()}


def apply_masks(params, mask_dict):
    """params with every pruned kernel multiplied by its mask (the dense twin's input)."""
    flat = traverse_util.flatten_dict(params)
    for name, m in mask_dict.items():
        layer, lin = name.split("/")
        key = ("params", layer, lin, "kernel")
        flat[key] = flat[key] * m.astype(flat[key].dtype)
    return traverse_util.unflatten_dict(flat)


def live_fraction(mask_dict) -> jax.Array:
    total = sum(m.size for m in mask_dict.values())
    return sum(jnp.sum(m) for m in mask_dict.values()) / total
