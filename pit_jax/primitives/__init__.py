"""pit_jax's JAX primitives, one per module: abstract eval, lowerings, batching, AD."""
