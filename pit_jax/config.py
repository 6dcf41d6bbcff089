"""The kill switch: route every pit_jax op to its pure-JAX reference.

For debugging and A/B comparisons. Either set the environment variable
`PIT_JAX_REFERENCE=1` before the process starts, or use the context manager::

    with pit_jax.use_reference():
        y = jax.jit(model)(x)   # traced here: no custom calls inside

The choice is made when a function is traced: a function jitted and traced before
the switch keeps its compiled form (jit caches by arguments, not by this switch).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

ENV_VAR = "PIT_JAX_REFERENCE"

_local = threading.local()


def _env_enabled() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("", "0", "false", "no", "off")


def reference_enabled() -> bool:
    """Whether ops traced now run their pure-JAX references instead of custom calls."""
    override = getattr(_local, "override", None)
    return _env_enabled() if override is None else override


@contextlib.contextmanager
def use_reference(enabled: bool = True) -> Iterator[None]:
    """Within the block, ops trace to their pure-JAX references (or, with False, never do)."""
    previous = getattr(_local, "override", None)
    _local.override = bool(enabled)
    try:
        yield
    finally:
        _local.override = previous
