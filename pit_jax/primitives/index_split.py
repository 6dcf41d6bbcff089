"""`pit_index_split`: `pit_index` of x [n, rows, cols] with each entry's lists and counts
in buffers of their own (`pit_jax.index_from_tiles(..., split=True)`). A consumer that
takes one entry of a batched build reads a slice of it, which XLA copies into a buffer of
its own (one copy per array per entry); here the kernel writes each entry where its
consumer reads it.

Operand x [n, rows, cols], 1 <= n <= MAX_SPLIT. Results: per entry, pit_index's six
(tiles [capacity], count [], row_tiles, row_count, col_tiles, col_count, without the
batch dim), then scratch [n]. Params: pit_index's.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives._index_rules import integer_outputs_jvp
from pit_jax.primitives._lowering import register_ffi_lowerings
from pit_jax.primitives._vma import Primitive
from pit_jax.primitives.index import pit_index_p

MAX_SPLIT = 16  # IndexParams::kMaxSplit: the entries' pointers travel in the kernel's parameters

pit_index_split_p = Primitive("pit_index_split")
pit_index_split_p.multiple_results = True


def _abstract_eval(x, **params):
    one = pit_index_p.abstract_eval(ShapedArray(x.shape[1:], x.dtype), **params)[0][:6]
    return tuple(one) * x.shape[0] + (ShapedArray((x.shape[0],), jnp.int32),)


def _batch_rule(args, dims, **params):
    # Under vmap the entries gain a batch dim, so they are slices of one batched build again.
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)  # [B, n, rows, cols]: both leading dims are pit_index's batch
    outs = pit_index_p.bind(x, **params)
    entries = [o[:, i] for i in range(x.shape[1]) for o in outs[:6]]
    return entries + [outs[6]], (0,) * (len(entries) + 1)


pit_index_split_p.def_impl(lambda *args, **params: xla.apply_primitive(pit_index_split_p, *args, **params))
pit_index_split_p.def_abstract_eval(_abstract_eval)
batching.primitive_batchers[pit_index_split_p] = _batch_rule
ad.primitive_jvps[pit_index_split_p] = integer_outputs_jvp(pit_index_split_p)
# No batch dims: x's leading dim is the split (every value's rank is its own).
register_ffi_lowerings(pit_index_split_p, "pit_index_split", ("tile_h", "tile_w", "group_rows", "group_cols"),
                       core=((3,), (3,) * (6 * MAX_SPLIT + 1)))
