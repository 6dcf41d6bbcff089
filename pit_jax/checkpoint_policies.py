"""Remat (`jax.checkpoint`) policies that know pit_jax's primitives.

JAX's own policies name lax primitives (`dots_saveable` saves `dot_general` results), so
under them pit_jax's products, which are custom primitives, are recomputed in the
backward pass like any elementwise op. These policies save them:

    jax.checkpoint(block, policy=pit_jax.checkpoint_policies.products_saveable)
    jax.checkpoint(block, policy=pit_jax.checkpoint_policies.plus_pit(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable))

A policy is called with each primitive (and its operand avals and params) while JAX
partially evaluates the checkpointed function, and says whether to keep its result.
"""

from __future__ import annotations

from typing import Callable

from pit_jax.primitives.grouped_matmul import grouped_matmul_p
from pit_jax.primitives.index import pit_index_p
from pit_jax.primitives.moe_index import moe_index_p
from pit_jax.primitives.row_layer_norm import row_layer_norm_p
from pit_jax.primitives.row_linear import row_linear_p, row_linear_pre_p
from pit_jax.primitives.row_linear_parts import row_linear_parts_p
from pit_jax.primitives.sdd_matmul import sdd_matmul_p
from pit_jax.primitives.stile_matmul import stile_matmul_p
from pit_jax.primitives.varlen_attention import varlen_attention_p

# The products: what a forward pass spends its time on and a backward pass needs again
# (the attention's (out, lse) too: its backward kernel reads both).
PRODUCTS = frozenset({row_linear_p, row_linear_pre_p, row_linear_parts_p, stile_matmul_p, sdd_matmul_p,
                      grouped_matmul_p, varlen_attention_p})
# The indexes: small results, but building one reads its whole operand (x or w).
INDEXES = frozenset({pit_index_p, moe_index_p})


def products_saveable(prim, *_, **__) -> bool:
    """Saves the results of pit_jax's sparse products (sparse_dense on every axis, the
    MoE's grouped products, varlen_attention); everything else is recomputed."""
    return prim in PRODUCTS


def products_and_indexes_saveable(prim, *_, **__) -> bool:
    """As `products_saveable`, and the indexes (PitIndex, MoeIndex) too: the backward
    then reads the index the forward built instead of building it again."""
    return prim in PRODUCTS or prim in INDEXES


def everything_pit_saveable(prim, *_, **__) -> bool:
    """Every pit_jax result: products, indexes and the live-row layer norms."""
    return prim in PRODUCTS or prim in INDEXES or prim is row_layer_norm_p


def plus_pit(policy: Callable, *, indexes: bool = True) -> Callable:
    """`policy` (e.g. one of `jax.checkpoint_policies`) that also saves pit_jax's products
    (and, with `indexes`, its indexes)."""
    ours = products_and_indexes_saveable if indexes else products_saveable

    def combined(prim, *avals, **params):
        return ours(prim) or policy(prim, *avals, **params)

    return combined
