"""Activations of the MoE expert FFN, by name (the ops and their references share them)."""

from __future__ import annotations

from typing import Callable, Union

import jax

ActivationSpec = Union[str, Callable[[jax.Array], jax.Array]]

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,  # tanh approximation, as jax.nn.gelu's default and flax's
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def resolve(activation: ActivationSpec, what: str = "activation") -> Callable[[jax.Array], jax.Array]:
    if callable(activation):
        return activation
    if isinstance(activation, str) and activation in ACTIVATIONS:
        return ACTIVATIONS[activation]
    raise ValueError(f"{what} must be a callable or one of {sorted(ACTIVATIONS)}, got {activation!r}")
