"""`pit_moe_index`: the routing index of a MoE layer, built on the device in one pass.

Operand expert_ids [..., T, k] (int32). Results (int32): lists [..., E+1, T*k] (group e
< E: the assignments a = t*k + j routed to expert e, in any order; group E: the dropped
ones, expert id out of range; -1 past each count) and counts [..., E+1].
Param: num_experts. See `pit_jax.moe_index` and docs/kernels.md ("MoE").
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.core import ShapedArray
from jax.interpreters import ad, batching, xla

from pit_jax.primitives._index_rules import integer_outputs_jvp
from pit_jax.primitives._lowering import register_ffi_lowerings
from pit_jax.primitives._vma import Primitive

moe_index_p = Primitive("pit_moe_index")
moe_index_p.multiple_results = True


def _abstract_eval(expert_ids, *, num_experts):
    if expert_ids.dtype != jnp.int32 or expert_ids.ndim < 2:
        raise TypeError(f"pit_moe_index: expert_ids must be int32 [..., T, k], got {expert_ids.str_short()}")
    lead = tuple(expert_ids.shape[:-2])
    a = expert_ids.shape[-2] * expert_ids.shape[-1]
    return (
        ShapedArray(lead + (num_experts + 1, a), jnp.int32),
        ShapedArray(lead + (num_experts + 1,), jnp.int32),
    )


def _batch_rule(args, dims, *, num_experts):
    (ids,), (d,) = args, dims
    return moe_index_p.bind(jnp.moveaxis(ids, d, 0), num_experts=num_experts), (0, 0)


moe_index_p.def_impl(lambda *args, **params: xla.apply_primitive(moe_index_p, *args, **params))
moe_index_p.def_abstract_eval(_abstract_eval)
batching.primitive_batchers[moe_index_p] = _batch_rule
ad.primitive_jvps[moe_index_p] = integer_outputs_jvp(moe_index_p)
register_ffi_lowerings(moe_index_p, "pit_moe_index", ("num_experts",), core=((2,), (2, 1)))
