"""pit_jax: PIT (Permutation Invariant Transformation) dynamic sparsity for JAX on GPUs.

A dynamically sparse tensor is covered by micro-tiles; the live ones are listed by an
index built on the device inside jit (`index`), gathered into dense tiles (SRead),
computed on tensor cores and scattered back (SWrite).
"""

from pit_jax import _native  # noqa: F401  (registers the FFI targets)
from pit_jax._native import export_checks
from pit_jax import checkpoint_policies, reference
from pit_jax.config import reference_enabled, use_reference
from pit_jax.moe_index import MoeIndex
from pit_jax.ops.attention import packed_attention, varlen_attention
from pit_jax.ops.cast import cast_matrices
from pit_jax.ops.index import index, index_from_tiles
from pit_jax.ops.layer_norm import layer_norm
from pit_jax.ops.moe import grouped_matmul, moe_ffn, moe_index
from pit_jax.ops.prune import TopBlocks, block_topk, block_topk_groups, mask_blocks
from pit_jax.ops.sparse_dense import sparse_dense
from pit_jax.ops.sread_swrite import sread, swrite
from pit_jax.optimizer import Plan, plan
from pit_jax.pit_index import PitIndex

__version__ = "0.1.0"

__all__ = [
    "MoeIndex",
    "PitIndex",
    "Plan",
    "TopBlocks",
    "block_topk",
    "block_topk_groups",
    "cast_matrices",
    "mask_blocks",
    "checkpoint_policies",
    "export_checks",
    "grouped_matmul",
    "index",
    "index_from_tiles",
    "layer_norm",
    "moe_ffn",
    "moe_index",
    "packed_attention",
    "plan",
    "reference",
    "reference_enabled",
    "sparse_dense",
    "sread",
    "swrite",
    "use_reference",
    "varlen_attention",
]
