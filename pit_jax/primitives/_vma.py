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
"""

from __future__ import annotations

import functools

import jax
from jax._src import core as _core
from jax.extend.core import Primitive as _Primitive
from jax.interpreters import ad
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def _unify(args):
    """The operands, each varying over every manual axis some operand varies over."""
    return tuple(_core.auto_insert_reshard(*args)) if args else args


def _stamp(aval, mesh, varying):
    """`aval` (a ShapedArray built from shapes alone) on `mesh`, varying over `varying`."""
    if not isinstance(aval, _core.ShapedArray):
        return aval
    return aval.update(sharding=NamedSharding(mesh, P(*(None,) * aval.ndim)),
                       manual_axis_type=_core.ManualAxisType(varying=frozenset(varying)))


def _varying_outputs(name, rule):
    """Wraps an abstract-eval rule: its outputs vary as its operands do (which `bind`
    has made equal; operands that still differ raise JAX's own error)."""

    @functools.wraps(rule)
    def abstract_eval(*avals, **params):
        out = rule(*avals, **params)
        shaped = [a for a in avals if isinstance(a, _core.ShapedArray)]
        mesh = next((a.sharding.mesh for a in shaped if a.sharding is not None and not a.sharding.mesh.empty), None)
        if mesh is None:  # not inside a mesh: nothing to carry
            return out
        varying = _core.standard_vma_rule(name, *shaped)
        if isinstance(out, (list, tuple)):
            return type(out)(_stamp(o, mesh, varying) for o in out)
        return _stamp(out, mesh, varying)

    return abstract_eval


class Primitive(_Primitive):
    """`jax.extend.core.Primitive` whose operands and outputs carry shard_map's manual-axis
    variance (module docstring)."""

    def bind(self, *args, **params):
        return super().bind(*_unify(args), **params)

    def def_abstract_eval(self, abstract_eval):
        super().def_abstract_eval(_varying_outputs(self.name, abstract_eval))
        return abstract_eval


def zero_tangent(primal):
    """A symbolic zero tangent for `primal` (its aval's tangent type: float0 for integer
    outputs, and the same manual-axis variance)."""
    return ad.Zero(jax.typeof(primal).to_tangent_aval())
