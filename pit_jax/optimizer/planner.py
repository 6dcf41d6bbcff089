"""`pit_jax.plan`: choose the STile (PIT axis + micro-tile, or dense) for one product."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from pit_jax.optimizer import cost_model
from pit_jax.optimizer import database as db_mod
from pit_jax.optimizer.plan import Candidate, Plan

AXES_OF = {"x": ("m", "k"), "w": ("w",)}
_DTYPES = ("bfloat16", "float16", "float32")


def _shape(value, what: str, min_rank: int):
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{what} must be a tuple of ints, got {value!r}")
    out = []
    for d in value:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 0:
            raise TypeError(f"{what} must be a tuple of non-negative ints, got {tuple(value)!r}")
        out.append(int(d))
    if len(out) < min_rank:
        raise ValueError(f"{what} must have rank >= {min_rank}, got {tuple(out)}")
    return tuple(out)


def _dtype_name(dtype, sample) -> str:
    import jax.numpy as jnp

    if dtype is None:
        name = getattr(getattr(sample, "dtype", None), "name", None)
        if name not in _DTYPES:
            raise ValueError(
                f"plan: dtype is required when the sample is not a float32/bfloat16/float16 array "
                f"(got a {name or type(sample).__name__} sample); pass the dtype the product runs in"
            )
        return name
    try:
        name = jnp.dtype(dtype).name
    except TypeError:
        raise TypeError(f"plan: dtype must be a dtype, got {dtype!r}") from None
    if name not in _DTYPES:
        raise TypeError(f"plan: dtype must be float32, bfloat16 or float16, got {name}")
    return name


def plan(
    sample,
    w_shape: Optional[Sequence[int]] = None,
    dtype=None,
    *,
    operand: str = "x",
    x_shape: Optional[Sequence[int]] = None,
    axes: Optional[Sequence[str]] = None,
    precision=None,
    include_index: bool = True,
    database=None,
    dense_margin: float = 0.05,
) -> Plan:
    """Chooses the fastest STile for `x @ w` from a sample of the sparse operand.

    Args:
      sample: what the sparse operand looks like, on the host or device (copied to the
        host): x [..., M, K] (operand "x"; leading dims are batch entries) or w [K, N]
        (operand "w"). Values (zeros are dead, +0 and -0 alike) or a bool mask.
      w_shape: w's shape [..., K, N] (operand "x"; defaults to the sample for "w").
      dtype: the dtype the product runs in; default the sample's (required for masks).
      operand: "x" (activation / token sparsity: axes "m", "k") or "w" (weight blocks).
      x_shape: x's shape [..., M, K], required for operand "w".
      axes: restrict the PIT axes considered (dense is always a candidate).
      precision: as in `sparse_dense`; for float32, whether TF32 is allowed.
      include_index: cost the index construction too (True when sparse_dense builds it
        from the operand on every call; False when you pass a prebuilt index).
      database: None (the database for JAX's first device, see
        `pit_jax.optimizer.database`), a Database, a JSON path or "heuristic".
      dense_margin: a sparse STile is chosen only when expected at least this fraction
        faster than dense (estimates have errors; dense has no index and no risk).

    Returns:
      A `Plan` (frozen, hashable): the chosen axis and micro-tile (axis None = dense),
      expected and dense ms, the runner-up and every candidate costed.
    """
    from pit_jax.ops.sparse_dense import allow_tf32

    if not (isinstance(dense_margin, (int, float)) and 0 <= dense_margin < 1):
        raise ValueError(f"plan: dense_margin must be in [0, 1), got {dense_margin!r}")
    if operand not in AXES_OF:
        raise ValueError(f"plan: operand must be 'x' or 'w', got {operand!r}")
    mask = cost_model.nonzero_mask(sample, "plan: sample")
    s_shape = tuple(int(d) for d in mask.shape)
    name = _dtype_name(dtype, sample if hasattr(sample, "dtype") else np.asarray(sample))
    tf32 = name == "float32" and allow_tf32(precision)
    key = "tf32" if tf32 else name
    itemsize = 2 if name in ("bfloat16", "float16") else 4

    if operand == "x":
        if w_shape is None:
            raise ValueError("plan: w_shape ([..., K, N]) is required for a sample of x")
        w_shape = _shape(w_shape, "plan: w_shape", 2)
        if w_shape[-2] != s_shape[-1]:
            raise ValueError(
                f"plan: the sample of x is {s_shape} but w_shape is {w_shape}: x's last dim ({s_shape[-1]}) must "
                f"equal w_shape[-2] (K)"
            )
        x_shape = s_shape
        batch = math.prod(s_shape[:-2])
        problem = cost_model.Problem("x", batch, s_shape[-2], s_shape[-1], w_shape[-1], itemsize, math.prod(w_shape[:-2]))
    else:
        if len(s_shape) != 2:
            raise ValueError(f"plan: a sample of w must be 2-D [K, N], got shape {s_shape}")
        if w_shape is not None and _shape(w_shape, "plan: w_shape", 2) != s_shape:
            raise ValueError(f"plan: w_shape {tuple(w_shape)} differs from the sample of w {s_shape}")
        w_shape = s_shape
        if x_shape is None:
            raise ValueError("plan: x_shape ([..., M, K]) is required for a sample of w (operand='w')")
        x_shape = _shape(x_shape, "plan: x_shape", 1)
        if x_shape[-1] != s_shape[0]:
            raise ValueError(
                f"plan: x_shape is {x_shape} but the sample of w is {s_shape}: x_shape[-1] must equal K = {s_shape[0]}"
            )
        problem = cost_model.Problem("w", 1, math.prod(x_shape[:-1]), s_shape[0], s_shape[1], itemsize)

    allowed = AXES_OF[operand]
    if axes is None:
        axes = allowed
    else:
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        bad = [a for a in axes if a not in allowed]
        if bad:
            raise ValueError(f"plan: axes for a sample of {operand} must be among {allowed}, got {tuple(axes)}")

    db = db_mod.get(database)
    variants = db.candidates(key, ("dense", *axes))
    if not any(v.kind == "dense" for v in variants):
        db = db_mod.heuristic(f"no database: heuristic ({db.name} has no {key} variants)")
        variants = db.candidates(key, ("dense", *axes))

    cov = cost_model.Coverage(mask)
    order = {("dense", None): -1}
    order.update({(s.kind, s.micro_tile): i for i, s in enumerate(db_mod.CATALOG)})
    estimates = [cost_model.estimate(v, cov, problem, db.parallel_slots) for v in variants]
    # Ties go to the earlier catalog entry (dense first): the simpler, safer choice.
    estimates.sort(key=lambda e: (round(e.total(include_index), 9), order.get((e.variant.kind, e.variant.micro_tile), 99)))
    cands = tuple(
        Candidate(None if e.variant.kind == "dense" else e.variant.kind, e.variant.micro_tile, e.total(include_index), e.density)
        for e in estimates
    )
    dense = next(c for c in cands if c.is_dense)
    best = cands[0]
    if not best.is_dense and best.expected_ms > dense.expected_ms * (1 - dense_margin):
        best = dense
    runner_up = next((c for c in cands if c is not best), None)
    return Plan(
        axis=best.axis,
        micro_tile=best.micro_tile,
        operand=operand,
        dtype=name,
        tf32=tf32,
        x_shape=tuple(x_shape),
        w_shape=tuple(w_shape),
        expected_ms=best.expected_ms,
        dense_ms=dense.expected_ms,
        density=best.density,
        runner_up=runner_up,
        candidates=cands,
        database=db.describe(),
        include_index=bool(include_index),
    )

