"""pit_jax.cast_matrices: a parameter tree's weight matrices cast in a few launches.

Flax's mixed precision (float32 parameters, `dtype=bfloat16` layers) casts each kernel
where its layer reads it: one XLA convert kernel per matrix per call, which XLA does not
fuse even when the converts are issued together (BERT-base: 48 launches, ~0.26 ms of a
~1.3 ms PIT inference call on an H200). Cast up front with this function, the model's
own casts become no-ops, and every group of same-shaped matrices is cast by one
`pit_mask_blocks` launch with all of its blocks live (one block a matrix).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from pit_jax.ops.prune import mask_blocks
from pit_jax.primitives._products import FLOATS


def _is_flax_kernel(path, leaf) -> bool:
    """The leaf is a Flax layer's "kernel": linen's params["kernel"], or nnx's State
    entry "kernel" (whose path ends in the Variable's `.value`)."""
    if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "value":
        path = path[:-1]
    return bool(path) and getattr(path[-1], "key", getattr(path[-1], "name", None)) == "kernel"


def cast_matrices(tree: Any, dtype, include: Optional[Callable[[tuple, jax.Array], bool]] = None) -> Any:
    """`tree` with its weight matrices cast to `dtype`, same-shaped ones in one launch.

    The result equals `jax.tree.map(lambda a: a.astype(dtype), ...)` on the chosen leaves
    (round to nearest even; NaN and inf kept) and leaves every other leaf as it is.
    Differentiable: the gradient of a cast matrix is its cotangent cast back, as for
    `astype`.

    Args:
      tree: a pytree (e.g. Flax `params`).
      dtype: float32, bfloat16 or float16.
      include: `include(path, leaf) -> bool` picks the leaves to cast (path as
        `jax.tree_util.tree_flatten_with_path` gives it); only floating leaves of rank
        >= 2 not already in `dtype` are cast. Default: the leaves named "kernel" (the
        weights of Flax's Dense, DenseGeneral and nnx.Linear, in linen's params or an
        nnx.State), so embedding tables, which a model gathers from before it casts,
        stay as they are.
    """
    fn = "pit_jax.cast_matrices"
    dtype = jnp.dtype(dtype)
    if dtype not in FLOATS:
        raise TypeError(f"{fn}: dtype must be float32, bfloat16 or float16, got {dtype}")
    include = _is_flax_kernel if include is None else include
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [leaf for _, leaf in flat]
    groups: dict = {}  # (trailing shape, dtype) -> leaf positions, in tree order
    for i, (path, leaf) in enumerate(flat):
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            continue
        if leaf.ndim < 2 or leaf.dtype not in FLOATS or leaf.dtype == dtype or leaf.size == 0:
            continue
        if include(path, leaf):
            groups.setdefault((tuple(leaf.shape[-2:]), jnp.dtype(leaf.dtype)), []).append(i)
    for (shape, _), where in groups.items():
        mats = [leaves[i] for i in where]
        count = sum(math.prod(m.shape[:-2]) for m in mats)
        live = jnp.ones((count, 1, 1), jnp.bool_)  # one block covering each whole matrix
        for i, out in zip(where, mask_blocks(mats, live, shape, dtype)):
            leaves[i] = out
    return jax.tree_util.tree_unflatten(treedef, leaves)
