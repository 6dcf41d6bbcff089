"""pit_jax's custom calls under plain `jit` with batch-sharded operands.

XLA's partitioner knows nothing of a custom call: without a rule it gathers every
operand whole onto each device and runs the kernel on the whole batch there (correct,
not parallel, and N times the memory). Every pit_jax op is independent per entry of its
batch (the prefix convention of docs/kernels.md: each operand's leading dims are a prefix
of one full batch shape), so its lowering carries a Shardy rule through
`custom_partitioning`: the first batch dim is one factor shared by every operand and
result that has it, every other dim must be replicated. Each device then runs the kernel
on its own batch entries, with the index it built for them. A result without that dim
(a shared weight's gradient, which sums over the batch) is each device's partial sum,
added up across the devices (in float32) inside the partitioned lowering.

Only under `jit` over several devices: inside `shard_map` the operands are per device
already, on one device nothing is split, and a program lowered for `jax.export` keeps
whole operands (its partitioning callback could not be serialized). The batch dim is split
only when it divides evenly over its devices; otherwise the op sees whole operands, as
before. With Explicit mesh axes, where the operands' types say how the batch is split,
the op runs under `jax.shard_map` over those axes instead of custom_partitioning
(`_shard_mapped`: jax 0.11 traces custom_partitioning's per-device function under the
caller's Explicit mesh, which breaks its psum on the GPU). The internals used (no public
API in jax 0.10-0.11): `sharding_impls`'s axis contexts, to leave lowerings outside plain
multi-device jit untouched, and `dispatch`'s registry of primitives that need the devices
while lowering.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax._src import dispatch as _dispatch
from jax._src import sharding_impls as _sharding_impls
from jax.experimental.custom_partitioning import ArrayMapping, SdyShardingRule, custom_partitioning
from jax.interpreters import mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

_BATCH = "batch"


def _batched(avals, core: Sequence[int]):
    """Whether each value has the batch: more dims than its own (core) ones."""
    return [a.ndim > c for a, c in zip(avals, core)]


def _mapping(aval, batched: bool, names):
    dims = [_BATCH] if batched else []
    dims += [next(names) for _ in range(aval.ndim - len(dims))]
    return ArrayMapping(*dims)


def _rule(avals_in, avals_out, in_batched, out_batched) -> SdyShardingRule:
    names = (f"d{i}" for i in itertools.count())
    ins = [_mapping(a, b, names) for a, b in zip(avals_in, in_batched)]
    outs = [_mapping(a, b, names) for a, b in zip(avals_out, out_batched)]
    others = tuple(f for m in (*ins, *outs) for f in m if f != _BATCH)
    reduced = (_BATCH,) if not any(out_batched) else ()
    return SdyShardingRule(tuple(ins), tuple(outs), reduction_factors=reduced, need_replication_factors=others)


def _split_operand(values, in_batched):
    """(value, its dim-0 spec entry) of the first batched value whose batch dim is split
    over mesh axes (its sharding: an aval's type, or a shape at partitioning); or None."""
    for v, b in zip(values, in_batched):
        sharding = getattr(v, "sharding", None)
        if b and isinstance(sharding, NamedSharding) and len(sharding.spec) and sharding.spec[0] is not None:
            return v, sharding.spec[0]
    return None


def _batch_axes(mesh, arg_shapes, in_batched):
    """The mesh axes the batch dim is split over (the first split operand's), when they
    divide it evenly; else None (whole operands)."""
    split = _split_operand(arg_shapes, in_batched)
    if split is None:
        return None
    s, entry = split
    axes = (entry,) if isinstance(entry, str) else tuple(entry)
    parts = math.prod(mesh.shape[a] for a in axes)
    return axes if parts > 1 and s.shape[0] % parts == 0 else None


def _sum_across(x, axes):
    """A partial result of this device's batch entries, summed over the devices."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jax.lax.psum(x.astype(jnp.float32), axes).astype(x.dtype)
    return jax.lax.psum(x, axes)


def _per_device(prim, params: dict, out_batched, axes):
    """`prim` on one device's operands (it lowers plainly there: manual axes), the results
    without the batch summed across the devices of `axes` (None: nothing is split)."""

    def run(*args):
        out = prim.bind(*args, **params)
        outs = list(out) if prim.multiple_results else [out]
        outs = [o if b or axes is None else _sum_across(o, axes) for o, b in zip(outs, out_batched)]
        return outs if prim.multiple_results else outs[0]

    return run


def _partitioned(prim, params: dict, avals_in, avals_out, in_batched, out_batched):
    call = functools.partial(prim.bind, **params)

    def partition(mesh, arg_shapes, result_shape):
        axes = _batch_axes(mesh, arg_shapes, in_batched)
        spec = (lambda b: P(axes) if b and axes else P())  # noqa: E731
        arg_sh = tuple(NamedSharding(mesh, spec(b)) for b in in_batched)
        out_sh = [NamedSharding(mesh, spec(b)) for b in out_batched]
        lower = _per_device(prim, params, out_batched, axes)
        return mesh, lower, (out_sh if prim.multiple_results else out_sh[0]), arg_sh

    wrapped = custom_partitioning(call)
    wrapped.def_partition(partition, sharding_rule=_rule(avals_in, avals_out, in_batched, out_batched))
    return wrapped


def _entry_axes(entry) -> tuple:
    """A PartitionSpec entry as a tuple of mesh axes."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _typed_split(avals_in, in_batched):
    """(mesh, axes) when the operands' types (Explicit mesh axes) split the batch dim over
    `axes`, evenly, and nothing else: each batched operand's first dim over those axes or
    replicated (a weight's index broadcast over the batch: sliced, not sent), every other
    dim and every unbatched operand replicated. Else None."""
    split = _split_operand(avals_in, in_batched)
    if split is None:
        return None
    v, entry = split
    mesh, axes = v.sharding.mesh, _entry_axes(entry)
    types = dict(zip(mesh.axis_names, mesh.axis_types))
    explicit = all(types[a] == jax.sharding.AxisType.Explicit for a in axes)
    if not explicit or v.shape[0] % math.prod(mesh.shape[a] for a in axes):
        return None
    for a, b in zip(avals_in, in_batched):
        spec = tuple(getattr(a.sharding, "spec", ()))
        dims = [_entry_axes(e) for e in spec + (None,) * (a.ndim - len(spec))]
        if any(dims[1:]) or dims[:1] not in ([], [()], [axes] if b else [()]):
            return None
    return mesh, axes


def _shard_mapped(prim, params: dict, in_batched, out_batched, mesh, axes):
    """`prim` per device under `jax.shard_map` over the batch's mesh axes, the results
    without the batch summed across them: the Explicit-axes form of `_partitioned`.
    custom_partitioning traces its per-device function under the caller's Explicit mesh,
    so with jax 0.11 the psum's reducer there carries sharding custom calls that XLA's GPU
    all-reduce cannot read (a CHECK failure in all_reduce_thunk.cc aborts the process; on
    CPU an unregistered custom call); shard_map's manual axes carry none."""
    spec = (lambda b: P(axes) if b else P())  # noqa: E731
    out_specs = [spec(b) for b in out_batched]
    split = jax.shard_map(_per_device(prim, params, out_batched, axes), mesh=mesh,
                          in_specs=tuple(spec(b) for b in in_batched),
                          out_specs=out_specs if prim.multiple_results else out_specs[0], axis_names=frozenset(axes))

    def call(*args):
        # a NamedSharding, not a bare spec: the caller need not be inside `jax.set_mesh`
        return split(*(jax.sharding.reshard(a, NamedSharding(mesh, spec(b))) if b else a
                       for a, b in zip(args, in_batched)))

    return call


def _plain_multi_device_jit(ctx) -> bool:
    axis_ctx = ctx.module_context.axis_context
    # jax.export: a partitioning callback cannot be serialized, so exported programs keep
    # whole operands.
    exporting = ctx.module_context.lowering_parameters.for_export
    return (isinstance(axis_ctx, _sharding_impls.ShardingContext) and axis_ctx.num_devices > 1 and not exporting
            and axis_ctx.device_assignment is not None)  # custom_partitioning needs the devices


def _batch_flags(prim, avals_in, avals_out, params):
    """Which operands and which results of this call of `prim` have the batch."""
    core_in, core_out = (c(**params) if callable(c) else c for c in prim.batch_core)
    return _batched(avals_in, core_in), _batched(avals_out, core_out)


def _splittable(in_b, out_b) -> bool:
    """Some operand has the batch, and the results all keep it or all sum over it (no op
    mixes them)."""
    return any(in_b) and (all(out_b) or not any(out_b))


def typed_batch_specs(prim, avals_in, avals_out, params):
    """With Explicit mesh axes (sharding in types): the mesh axes each result's first dim
    is typed as split over, the batch's, taken from the first batched operand split over
    them, for results that keep the batch (the split lowering then needs no gather after
    it); None for every result otherwise."""
    none = [None] * len(avals_out)
    if getattr(prim, "batch_core", None) is None:
        return none
    in_b, out_b = _batch_flags(prim, avals_in, avals_out, params)
    split = _split_operand(avals_in, in_b) if all(out_b) else None
    return none if split is None else [split[1]] * len(avals_out)


def register(prim, core_in: Sequence[int] | Callable, core_out: Sequence[int] | Callable) -> None:
    """Declares `prim`'s batch: each operand's / result's own rank (its dims that are not
    batch dims), or a callable of the params giving them."""
    prim.batch_core = (core_in, core_out)
    # custom_partitioning needs the devices at lowering time, which jit provides only for
    # the primitives in this registry (as for cuDNN attention's).
    _dispatch.prim_requires_devices_during_lowering.add(prim)


def batch_partitioned(prim, rule: Callable) -> Callable:
    """`rule` (prim's lowering on one device), split over the first batch dim under
    multi-device jit (`register` first)."""

    def lowering(ctx, *args, **params):
        if _plain_multi_device_jit(ctx):
            in_b, out_b = _batch_flags(prim, ctx.avals_in, ctx.avals_out, params)
            if _splittable(in_b, out_b):
                typed = _typed_split(ctx.avals_in, in_b)
                if typed is not None:
                    f = _shard_mapped(prim, params, in_b, out_b, *typed)
                else:
                    f = _partitioned(prim, params, ctx.avals_in, ctx.avals_out, in_b, out_b)
                return mlir.lower_fun(f, multiple_results=prim.multiple_results)(ctx, *args)
        return rule(ctx, *args, **params)

    return lowering
