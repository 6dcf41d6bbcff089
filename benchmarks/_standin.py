"""A pure-JAX stand-in for `pit_jax.sparse_dense`, for exercising the benchmark only.

`python -m benchmarks.bench_sparse_dense --stand-in` installs it when the library has
no `sparse_dense` yet, so that every pit_jax code path of the suite (index inside the
jit, precomputed index, mask index, backward, targets) runs on the CPU. Its timings
mean nothing: it is a masked DENSE product (`where(mask, x, 0) @ w`), with the index
built by the real `pit_jax.index`. Rows measured with it are flagged in the JSON.
"""

from __future__ import annotations

import jax.numpy as jnp

import pit_jax

# which grouped lists each axis consumes (docs/kernels.md, pit_stile_matmul)
_GROUP = {"m": None, "k": "row", "w": "col"}


def sparse_dense(x, w, index=None, *, axis="m", micro_tile=None, precision=None):
    if axis not in _GROUP:
        raise ValueError(f"axis must be 'm', 'k' or 'w', got {axis!r}")
    masked_is_w = axis == "w"
    src = w if masked_is_w else x
    if index is None:
        if micro_tile is None:
            if axis != "m":
                raise ValueError(f"axis={axis!r} needs micro_tile (or an index)")
            micro_tile = "row"
        index = pit_jax.index(src, micro_tile, group_by=_GROUP[axis])
    if axis == "m" and tuple(index.shape) not in ((x.shape[0], x.shape[1]), (x.shape[0], 1)):
        raise ValueError(f"index shape {index.shape} does not cover x {x.shape}")
    mask = index.mask()  # [rows, cols] or [M, 1] (a row mask), broadcasts
    if masked_is_w:
        return jnp.matmul(x, jnp.where(mask, w, 0).astype(w.dtype), precision=precision)
    return jnp.matmul(jnp.where(mask, x, 0).astype(x.dtype), w, precision=precision)
