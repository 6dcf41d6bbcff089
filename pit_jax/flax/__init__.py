"""Flax layers built on pit_jax's sparse ops (needs `flax`).

    from pit_jax.flax import SparseDense          # flax.linen, drop-in for nn.Dense
    from pit_jax.flax.nnx import SparseDense      # flax.nnx, drop-in for nnx.Linear
"""

from pit_jax.flax.linen import SparseDense

__all__ = ["SparseDense"]
