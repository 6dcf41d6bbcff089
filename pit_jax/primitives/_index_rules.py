"""Rules shared by the primitives that build an index (pit_index, pit_moe_index)."""

from __future__ import annotations

import jax
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad


def integer_outputs_jvp(prim: Primitive):
    """JVP rule of a primitive whose outputs are all integer: their tangents are symbolic zeros."""

    def jvp(primals, tangents, **params):
        outs = prim.bind(*primals, **params)
        return outs, [ad.Zero(ShapedArray(o.shape, jax.dtypes.float0)) for o in outs]

    return jvp
