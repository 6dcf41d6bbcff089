"""Flax layers built on pit_jax's sparse ops (needs `flax`).

    from pit_jax.flax import SparseDense          # flax.linen, drop-in for nn.Dense
    from pit_jax.flax.nnx import SparseDense      # flax.nnx, drop-in for nnx.Linear
    from pit_jax.flax import MoE                  # dropless mixture-of-experts (nnx: pit_jax.flax.nnx.MoE)
    from pit_jax.flax import LayerNorm            # nn.LayerNorm on the live rows (nnx: pit_jax.flax.nnx.LayerNorm)
    from pit_jax.flax import VarlenSelfAttention  # self-attention on the valid tokens (nnx: the same name)
"""

from pit_jax.flax.linen import LayerNorm, SparseDense, VarlenSelfAttention
from pit_jax.flax.linen_moe import MoE

__all__ = ["LayerNorm", "MoE", "SparseDense", "VarlenSelfAttention"]
