"""pit_jax's primitives inside `jax.shard_map`: how their values vary over manual mesh axes.

With `check_vma` (shard_map's default) every aval records the manual axes its value
varies over, and JAX relies on it: the gradient of a replicated operand (weights, P())
is the transpose of an implicit `pvary`, a psum, so `jax.grad` inside shard_map returns
the whole batch's weight gradient. A primitive whose outputs claim to vary over nothing
breaks that silently: a replicated operand multiplied with per-device rows gets no psum
in its gradient, and an out_spec of P() then returns one device's partial result.

So every pit_jax primitive is a `Primitive` from here: `bind` first marks all operands as
varying over the axes any of them varies over (`auto_insert_reshard`, what lax's own ops
do), and the abstract eval stamps that set on every output. Outside shard_map both are
no-ops. JAX has no public API for this yet (jax 0.10-0.11): the internals used are
`core.auto_insert_reshard`, `core.standard_vma_rule` and `ManualAxisType`.

The same abstract eval types a result that keeps the batch with the batch's sharding
under Explicit mesh axes (`_partition.typed_batch_specs`), and `typed_cotangents` gives
each cotangent its primal's type there.
"""

from __future__ import annotations

import functools

import jax
from jax._src import core as _core
from jax.extend.core import Primitive as _Primitive
from jax.interpreters import ad
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pit_jax.primitives import _partition


def _unify(args):
    """The operands, each varying over every manual axis some operand varies over."""
    return tuple(_core.auto_insert_reshard(*args)) if args else args


def _stamp(aval, mesh, varying, lead=None):
    """`aval` (a ShapedArray built from shapes alone) on `mesh`, varying over `varying`,
    its first dim split over the mesh axes `lead` (a typed batch sharding) or none."""
    if not isinstance(aval, _core.ShapedArray):
        return aval
    return aval.update(sharding=NamedSharding(mesh, P(lead, *(None,) * (aval.ndim - 1)) if aval.ndim else P()),
                       manual_axis_type=_core.ManualAxisType(varying=frozenset(varying)))


def _varying_outputs(prim, rule):
    """Wraps an abstract-eval rule: its outputs vary as its operands do (which `bind`
    has made equal; operands that still differ raise JAX's own error), and with Explicit
    mesh axes a result keeping the batch is typed with the batch's sharding (`_partition`)."""

    @functools.wraps(rule)
    def abstract_eval(*avals, **params):
        out = rule(*avals, **params)
        shaped = [a for a in avals if isinstance(a, _core.ShapedArray)]
        mesh = next((a.sharding.mesh for a in shaped if a.sharding is not None and not a.sharding.mesh.empty), None)
        if mesh is None:  # not inside a mesh: nothing to carry
            return out
        varying = _core.standard_vma_rule(prim.name, *shaped)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        leads = _partition.typed_batch_specs(prim, avals, outs, params)
        stamped = [_stamp(o, mesh, varying, lead) for o, lead in zip(outs, leads)]
        return type(out)(stamped) if isinstance(out, (list, tuple)) else stamped[0]

    return abstract_eval


class Primitive(_Primitive):
    """`jax.extend.core.Primitive` whose operands and outputs carry shard_map's manual-axis
    variance (module docstring)."""

    def bind(self, *args, **params):
        return super().bind(*_unify(args), **params)

    def def_abstract_eval(self, abstract_eval):
        super().def_abstract_eval(_varying_outputs(self, abstract_eval))
        return abstract_eval


def zero_tangent(primal):
    """A symbolic zero tangent for `primal` (its aval's tangent type: float0 for integer
    outputs, and the same manual-axis variance)."""
    return ad.Zero(jax.typeof(primal).to_tangent_aval())


def typed_cotangents(rule):
    """Wraps a transpose rule: with Explicit mesh axes each cotangent is typed as its
    primal. An op on whole operands types its results replicated, so a split operand's
    cotangent from it would come back replicated, which JAX refuses; it is resharded."""

    @functools.wraps(rule)
    def transpose(ct, *args, **params):
        cts = list(rule(ct, *args, **params))
        for i, (c, a) in enumerate(zip(cts, args)):
            if c is None or isinstance(c, ad.Zero) or not ad.is_undefined_primal(a):
                continue
            want, have = getattr(a.aval, "sharding", None), getattr(jax.typeof(c), "sharding", None)
            if (isinstance(want, NamedSharding) and isinstance(have, NamedSharding) and want.mesh.explicit_axes
                    and want.spec != have.spec):
                cts[i] = jax.sharding.reshard(c, want)  # a NamedSharding: no jax.set_mesh needed
        return cts

    return transpose

