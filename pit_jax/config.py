"""The kill switch: route pit_jax ops (all, or the named ones) to their pure-JAX references.

For debugging and A/B comparisons. Either set the environment variable before the
process starts, `PIT_JAX_REFERENCE=1` for every op or `PIT_JAX_REFERENCE=sparse_dense,moe`
for some, or use the context manager::

    with pit_jax.use_reference():                      # every op
        y = jax.jit(model)(x)                          # traced here: no custom calls inside
    with pit_jax.use_reference(ops=("layer_norm",)):   # just these
        y = jax.jit(model)(x)

The ops: "index" (also index_from_tiles), "sparse_dense", "layer_norm", "sread",
"swrite", "moe" (moe_index and the grouped products), "varlen_attention". The choice is
made when a function is traced: a function jitted and traced before the switch keeps
its compiled form (jit caches by arguments, not by this switch).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import FrozenSet, Iterable, Iterator, Optional

ENV_VAR = "PIT_JAX_REFERENCE"
OPS = ("index", "sparse_dense", "layer_norm", "sread", "swrite", "moe", "varlen_attention")

_local = threading.local()


def _ops(names: Iterable[str], where: str) -> FrozenSet[str]:
    names = frozenset(n.strip() for n in names if n.strip())
    unknown = sorted(names - set(OPS))
    if unknown:
        raise ValueError(f"{where}: unknown op(s) {unknown}; expected a subset of {OPS}")
    return names


def _env_ops() -> FrozenSet[str]:
    value = os.environ.get(ENV_VAR, "").strip()
    if value.lower() in ("", "0", "false", "no", "off"):
        return frozenset()
    if value.lower() in ("1", "true", "yes", "on", "all"):
        return frozenset(OPS)
    return _ops(value.split(","), f"{ENV_VAR}={value!r} (1 for every op, or op names separated by commas)")


def reference_enabled(op: Optional[str] = None) -> bool:
    """Whether `op` (one of OPS; None: every op) traced now runs its pure-JAX reference."""
    override = getattr(_local, "override", None)
    ops = _env_ops() if override is None else override
    return ops == frozenset(OPS) if op is None else op in ops


@contextlib.contextmanager
def use_reference(enabled: bool = True, *, ops: Optional[Iterable[str]] = None) -> Iterator[None]:
    """Within the block, ops trace to their pure-JAX references: every op, or those named
    in `ops` (of OPS); with enabled=False, none does (whatever the environment says)."""
    previous = getattr(_local, "override", None)
    if isinstance(ops, str):
        ops = (ops,)
    chosen = frozenset(OPS) if ops is None else _ops(ops, "use_reference: ops")
    _local.override = chosen if enabled else frozenset()
    try:
        yield
    finally:
        _local.override = previous
