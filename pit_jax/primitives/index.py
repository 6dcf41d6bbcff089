"""`pit_index`: online construction of a sparsity index (see `pit_jax.pit_index`).

Operand x [..., rows, cols] (float32/bfloat16/float16 values or a bool mask).
Results (all int32), with R = tile rows and C = tile columns:
tiles [..., capacity], count [...], row_tiles [..., R, C], row_count [..., R],
col_tiles [..., C, R], col_count [..., C]; a grouping not asked for gives empty
arrays ([..., 0, 0] and [..., 0]); and scratch [...] (the kernel's count of dead
tiles placed, not part of the index). At full capacity the flat list's slots past the
count hold the dead tiles as -1 - id; otherwise, and in grouped lists, -1.
Params: tile_h, tile_w, capacity, group_rows, group_cols.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives._index_rules import integer_outputs_jvp
from pit_jax.primitives._lowering import register_ffi_lowerings
from pit_jax.primitives._vma import Primitive

pit_index_p = Primitive("pit_index")
pit_index_p.multiple_results = True


def _abstract_eval(x, *, tile_h, tile_w, capacity, group_rows, group_cols):
    lead = tuple(x.shape[:-2])
    tr, tc = math.ceil(x.shape[-2] / tile_h), math.ceil(x.shape[-1] / tile_w)
    i32 = jnp.int32
    rows = (tr, tc) if group_rows else (0, 0)
    cols = (tc, tr) if group_cols else (0, 0)
    return (
        ShapedArray(lead + (capacity,), i32),
        ShapedArray(lead, i32),
        ShapedArray(lead + rows, i32),
        ShapedArray(lead + rows[:1], i32),
        ShapedArray(lead + cols, i32),
        ShapedArray(lead + cols[:1], i32),
        ShapedArray(lead, i32),
    )


def _batch_rule(args, dims, **params):
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)  # leading dims are batch dims already
    return pit_index_p.bind(x, **params), (0,) * 7


pit_index_p.def_impl(lambda *args, **params: xla.apply_primitive(pit_index_p, *args, **params))
pit_index_p.def_abstract_eval(_abstract_eval)
batching.primitive_batchers[pit_index_p] = _batch_rule
ad.primitive_jvps[pit_index_p] = integer_outputs_jvp(pit_index_p)
register_ffi_lowerings(pit_index_p, "pit_index", ("tile_h", "tile_w", "group_rows", "group_cols"),
                       core=((2,), (1, 0, 2, 1, 2, 1, 0)))
