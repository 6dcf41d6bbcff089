"""Rules shared by the primitives that build an index (pit_index, pit_moe_index)."""

from __future__ import annotations

from pit_jax.primitives._vma import Primitive, zero_tangent


def integer_outputs_jvp(prim: Primitive):
    """JVP rule of a primitive whose outputs are all integer: their tangents are symbolic zeros."""

    def jvp(primals, tangents, **params):
        outs = prim.bind(*primals, **params)
        return outs, [zero_tangent(o) for o in outs]

    return jvp
