"""`pit_jax.sparse_dense`: a dense layer's product that skips dynamically dead micro-tiles.

Semantics (documented, and what the tests check):

    axis="m" or "k":  sparse_dense(x, w, index) == (x * index.mask()) @ w
    axis="w":         sparse_dense(x, w, index) == x @ (w * index.mask())

With `index=None` the index is built from x (from w for axis "w") in the same jit, so
the forward equals `x @ w` exactly. The pattern is a constant of the step: gradients
are those of the masked expression above (the gradient w.r.t. the masked operand is
restricted to its live tiles), which is the true gradient whenever the zeros come from
masking or ReLU. Forward and backward run as PIT products on the one index:

- axis "m": live token rows (micro-tile (h, K), default (1, K): padding, dropped tokens).
  Forward gathers live rows, multiplies, scatters rows; dx gathers the same rows of dy;
  dw reduces over the live rows only.
- axis "k": activation sparsity (micro-tile (h, bk) of x, default (32, 1)): each block
  of h rows reduces only over its live k. Needs the index's row lists (and column lists
  to differentiate): with `index=None` each grouping is built by its own call, so a
  forward-only jit drops the one only the gradient reads (see `_own_index`).
- axis "w": weight blocks (micro-tile (bk, bn) of w, default (32, 64); a pruning mask
  that may change every step): each block of output columns reduces over its live k
  blocks only.

Bias and activation: `sparse_dense(x, w, index, bias=b, activation="gelu")` is
`act(sparse_dense(x, w, index) + b)`. On the M axis a named activation runs with the bias
in the product's epilogue on the live rows (dead rows are written act(b) without a
product): a padded model's activation then costs nothing on its padding. Elsewhere (a
bias alone, a callable activation, a batched bias, the K and W axes) XLA applies them
after the product. Differentiating runs the unfused expression (primitives/row_linear.py).

Choosing the STile (docs/optimizer.md): `plan=pit_jax.plan(sample, ...)` runs the plan's
axis and micro-tile, or `x @ w` when the plan is dense (the forward is the same: with
`index=None` the mask comes from the operand itself). `micro_tile="auto"` plans from the
operand when it is concrete (an eager call); under jit the operand is a tracer with no
values to plan from, so "auto" uses the axis's default micro-tile: make the plan from a
sample outside jit and pass `plan=` (a static, hashable value) for a sample-driven choice.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from pit_jax import _activations, config, reference
from pit_jax.ops.index import index as build_index
from pit_jax.optimizer.plan import Plan
from pit_jax.pit_index import MicroTileSpec, PitIndex
from pit_jax.primitives import _products
from pit_jax.primitives.row_linear import ACTIVATIONS as FUSED_ACTIVATIONS
from pit_jax.primitives.row_linear import row_linear
from pit_jax.primitives.row_layer_norm import listed_rows_only
from pit_jax.primitives.row_linear_parts import row_linear_parts
from pit_jax.primitives.stile_matmul import stile_matmul

AXES = ("m", "k", "w")
DEAD_ROWS = ("dense", "zeros", "unspecified")  # sparse_dense(dead_rows=...)
DEFAULT_MICRO_TILES = {"m": (1, None), "k": (32, 1), "w": (32, 64)}

_EXACT = {"highest", "float32"}
_TF32 = {"default", "high", "fastest", "tensorfloat32", "tf32", "bfloat16", "bfloat16_3x"}


def allow_tf32(precision: Any) -> bool:
    """Maps a `precision` argument to whether float32 products may use TF32.

    None (the default) means exact float32 unless `jax.default_matmul_precision` was set
    to a TF32-allowing value; HIGHEST means exact; DEFAULT / HIGH or "tensorfloat32"
    ask for speed and allow TF32. Ignored for 16-bit inputs.
    """
    if precision is None:
        configured = jax.config.jax_default_matmul_precision
        return allow_tf32(configured) if configured is not None else False
    if isinstance(precision, (tuple, list)) and len(precision) == 2:
        first, second = (allow_tf32(p) for p in precision)
        if first != second:
            raise ValueError(f"sparse_dense: precision pairs must agree, got {precision!r}")
        return first
    if isinstance(precision, jax.lax.Precision):
        return precision != jax.lax.Precision.HIGHEST
    if isinstance(precision, str) and precision.lower() in _EXACT | _TF32:
        return precision.lower() in _TF32
    raise ValueError(
        f"sparse_dense: precision must be None, a jax.lax.Precision or one of "
        f"{sorted(_EXACT | _TF32)}, got {precision!r}"
    )


def _resolve_tile(micro_tile, axis, shape, what):
    from pit_jax.pit_index import normalize_micro_tile

    if micro_tile is None:
        # The axis's default, clipped to a smaller matrix, where an explicit micro-tile
        # larger than the matrix is the caller's error.
        micro_tile = clip_micro_tile(DEFAULT_MICRO_TILES[axis], shape)
    tile = normalize_micro_tile(micro_tile, shape, what)
    if axis == "m" and tile[1] != shape[1]:
        raise ValueError(
            f"sparse_dense: axis='m' gathers whole rows, so micro_tile must be (h, {shape[1]}) or (h, None), "
            f"got {tile}; use axis='k' for tiles that split rows"
        )
    return tile


def _check_index(index, axis, owner, tile, owner_name):
    if not isinstance(index, PitIndex):
        raise TypeError(f"sparse_dense: index must be a pit_jax.PitIndex (from pit_jax.index), got {type(index).__name__}")
    shape = tuple(owner.shape[-2:])
    if axis == "m" and index.tile_cols == 1 and index.shape[0] == shape[0]:
        # Row tiles may come from a row mask [M, 1] (a padding mask): only rows matter.
        pass
    elif tuple(index.shape) != shape:
        raise ValueError(
            f"sparse_dense: the index was built for a {index.shape} matrix but {owner_name} is {shape} "
            f"(axis={axis!r} indexes {owner_name})"
        )
    if tile is not None and tuple(index.micro_tile) != tuple(tile) and not (axis == "m" and index.tile_cols == 1):
        raise ValueError(f"sparse_dense: micro_tile {tile} differs from the index's {index.micro_tile}")
    if axis == "m" and index.micro_tile[1] != index.shape[1]:
        raise ValueError(
            f"sparse_dense: axis='m' needs an index of row micro-tiles (h, {shape[1]}), got micro_tile "
            f"{index.micro_tile}; use axis='k' for it"
        )
    if index.batch_shape not in ((), tuple(owner.shape[:-2])):
        raise ValueError(
            f"sparse_dense: the index has batch dims {index.batch_shape}, {owner_name} has {tuple(owner.shape[:-2])}"
        )


def dense_product(x: jax.Array, w: jax.Array, precision: Any = None) -> jax.Array:
    """`x @ w` through XLA with sparse_dense's numerics: float32 accumulation, rounded
    once; float32 exact unless `precision` allows TF32. x and w share a dtype."""
    exact = x.dtype == jnp.float32 and not allow_tf32(precision)
    prec = jax.lax.Precision.HIGHEST if exact else jax.lax.Precision.DEFAULT
    return jnp.matmul(x, w, precision=prec, preferred_element_type=jnp.float32).astype(x.dtype)


def clip_micro_tile(tile, shape):
    """(h, w) clipped to a [rows, cols] matrix (None, the whole extent, stays None): the same
    cover as a partial edge tile (a (32, 1) strip on 17 rows covers the 17). For defaults and
    plans meeting a smaller matrix than they were made for."""
    h, w = tile
    rows, cols = shape
    return (None if h is None else min(h, rows), None if w is None else min(w, cols))


def _check_plan(plan, axis, micro_tile, x, w):
    if not isinstance(plan, Plan):
        raise TypeError(f"sparse_dense: plan must be a pit_jax.Plan (from pit_jax.plan), got {type(plan).__name__}")
    if micro_tile is not None:
        raise ValueError("sparse_dense: pass either plan or micro_tile, not both (the plan sets the micro-tile)")
    if axis is not None and axis != plan.axis:
        raise ValueError(
            f"sparse_dense: axis={axis!r} but the plan chose {plan.stile!r}; leave axis unset when passing a plan"
        )
    k, n = plan.w_shape[-2:]
    if x.shape[-1] != k or w.shape[-1] != n:
        raise ValueError(
            f"sparse_dense: the plan was made for w {plan.w_shape} (K={k}, N={n}) but x is {tuple(x.shape)} and "
            f"w is {tuple(w.shape)}"
        )
    if plan.axis == "w" and tuple(w.shape[-2:]) != tuple(plan.w_shape[-2:]):
        raise ValueError(f"sparse_dense: the plan was made for w {plan.w_shape}, got w {tuple(w.shape)}")


def _auto_plan(x, w, axis, precision, dtype):
    """A plan from the concrete operand, or None when it is traced (inside jit)."""
    from pit_jax.optimizer.planner import plan as make_plan

    owner = w if axis == "w" else x
    if isinstance(owner, jax.core.Tracer) or (axis == "w" and w.ndim != 2):
        return None
    axes = ("m", "k") if axis is None else (axis,)
    if axis == "w":
        return make_plan(owner, dtype=dtype, operand="w", x_shape=tuple(x.shape), precision=precision)
    return make_plan(owner, tuple(w.shape), dtype, axes=axes, precision=precision)


def sparse_dense(
    x: jax.Array,
    w: jax.Array,
    index: Optional[PitIndex] = None,
    *,
    axis: Optional[str] = None,
    micro_tile: Optional[MicroTileSpec] = None,
    precision: Any = None,
    plan: Optional[Plan] = None,
    bias: Optional[jax.Array] = None,
    activation: Optional[_activations.ActivationSpec] = None,
    out_parts: int = 1,
    dead_rows: str = "dense",
) -> Any:
    """`act(x @ w + bias)` with the product only on the live micro-tiles of x (axes "m",
    "k") or w (axis "w").

    Args:
      x: [..., M, K] (or [K]) float32 / bfloat16 / float16.
      w: [..., K, N]. Batch dims broadcast like `jnp.matmul`.
      index: a `PitIndex` of x (of w for axis "w"); None builds it here, on the device.
      axis: "m" (token rows, the default), "k" (activation sparsity) or "w" (weight blocks).
      micro_tile: the micro-tile when building the index (defaults: m (1, K),
        k (32, 1), w (32, 64), each clipped to a smaller matrix: the cover of a partial
        edge tile); checked against a given index. "auto": chosen by the
        optimizer from the operand when it is concrete, else the default (see above).
      precision: float32 only: None/HIGHEST exact, DEFAULT/HIGH/"tensorfloat32" allow TF32.
        On the M axis, TF32 on Hopper reads w K-major, so a w stored [K, N] is copied
        transposed per call; store it [N, K] and pass `w.T` to spare that (XLA folds the
        two transposes; docs/kernels.md).
      plan: a `pit_jax.Plan`: its axis and micro-tile (clipped to smaller inputs), or
        the dense product; leave axis and micro_tile unset.
      bias: None or [..., N] (broadcast against the result), cast to the result's dtype.
        A float32 [N] bias with 16-bit x and w, fused on the M axis, is rounded to their
        dtype in the kernel's epilogue (same values; no cast kernel per call).
      activation: None, a name ("relu", "gelu" (tanh approximation, as jax.nn.gelu),
        "gelu_exact", "silu", "swish") or a callable, applied after the bias. The names
        are fused into the M-axis product's epilogue (see above).
      out_parts: P > 1 returns the result as a tuple of P arrays [..., M, N / P] (equal
        column blocks, e.g. q, k, v of a fused projection). On the M axis the bias (1-D)
        and a named activation then run in the epilogue, and on an sm_90a GPU (16-bit
        types, P = 3, N / 3 a multiple of 256) the kernel writes the parts itself, which
        saves the pass over every row that slicing one result would cost.
      dead_rows: M axis: what the rows the index does not list hold. "dense" (the
        default): what the dense expression gives, act(bias) (zeros without a bias).
        "zeros": zeros, the bias and activation on the live rows only, for a model that
        never reads its padding rows' values: the bias's gradient then sums the
        cotangent over the live rows only (`pit_row_sum`), not over every row.
        "unspecified": for a model that never reads the padding rows: they are left
        unwritten (the GPU kernels skip their stores; the CPU and the jnp reference write
        NaN there, so that a reader of them shows), the bias and activation on the live
        rows. Differentiable as "zeros" is: the unlisted rows carry no gradient (their
        cotangent is ignored), so training gets the same gradients without the writes.

    Returns:
      [..., M, N] in `jnp.result_type(x, w)`; float32 accumulation. A tuple with out_parts.
    """
    if not _products.is_count(out_parts):
        raise ValueError(f"sparse_dense: out_parts must be a positive int, got {out_parts!r}")
    out_parts = int(out_parts)
    if dead_rows not in DEAD_ROWS:
        raise ValueError(f"sparse_dense: dead_rows must be one of {DEAD_ROWS}, got {dead_rows!r}")
    skip_dead = dead_rows == "unspecified"
    zero_dead = dead_rows == "zeros" or skip_dead  # the bias on the live rows only
    if axis is not None and axis not in AXES:
        raise ValueError(f"sparse_dense: axis must be one of {AXES}, got {axis!r}")
    auto = isinstance(micro_tile, str) and micro_tile == "auto"
    if auto and (index is not None or plan is not None):
        raise ValueError("sparse_dense: micro_tile='auto' chooses the micro-tile, so index and plan must be None")
    x, w = jnp.asarray(x), jnp.asarray(w)
    dtype = jnp.result_type(x.dtype, w.dtype)
    if dtype not in _products.FLOATS:
        raise TypeError(f"sparse_dense: x and w must be float32, bfloat16 or float16, got {x.dtype} and {w.dtype}")
    if w.ndim < 2:
        raise ValueError(f"sparse_dense: w must have rank >= 2 ([..., K, N]), got shape {tuple(w.shape)}")
    if x.ndim < 1:
        raise ValueError("sparse_dense: x must have rank >= 1")
    vector = x.ndim == 1
    if vector:
        x = x[None]
    if x.shape[-1] != w.shape[-2]:
        raise ValueError(f"sparse_dense: inner dimensions differ: x is {tuple(x.shape)}, w is {tuple(w.shape)}")
    tf32 = allow_tf32(precision)
    x, w = x.astype(dtype), w.astype(dtype)
    act = None if activation is None else _activations.resolve(activation, "sparse_dense: activation")
    kernel_bias = None  # the bias the fused M-axis kernels take: float32 stays float32
    if bias is not None:
        bias = jnp.asarray(bias)
        if bias.ndim < 1 or bias.shape[-1] != w.shape[-1]:
            raise ValueError(f"sparse_dense: bias must be [..., N] with N = {w.shape[-1]}, got {tuple(bias.shape)}")
        kernel_bias = bias if bias.dtype == jnp.float32 else bias.astype(dtype)
        bias = bias.astype(dtype)

    def epilogue(y):
        y = y if bias is None else y + bias
        return y if act is None else act(y)

    if out_parts > 1 and w.shape[-1] % out_parts:
        raise ValueError(f"sparse_dense: out_parts={out_parts} must divide N = {w.shape[-1]}")

    def unvector(y):
        return y[..., 0, :] if vector else y

    def result(y):
        y = unvector(y)
        return y if out_parts == 1 else tuple(jnp.split(y, out_parts, axis=-1))
    if auto:
        plan = _auto_plan(x, w, axis, precision, dtype)
        micro_tile = None
        if plan is None:  # traced: the axis's default micro-tile
            axis = axis or "m"
        else:
            axis = None
    if plan is not None:
        _check_plan(plan, axis, micro_tile, x, w)
        if plan.is_dense:
            if zero_dead:
                raise ValueError(f"sparse_dense: dead_rows={dead_rows!r} needs the M axis, and the plan is dense")
            if index is not None:
                raise ValueError("sparse_dense: the plan is dense, so there is no index to pass")
            return result(epilogue(dense_product(x, w, precision)))
        axis = plan.axis
        micro_tile = clip_micro_tile(plan.micro_tile, (w if axis == "w" else x).shape[-2:])  # a smaller batch than planned
    axis = axis or "m"
    if zero_dead and axis != "m":
        raise ValueError(f"sparse_dense: dead_rows={dead_rows!r} needs the M axis (token rows), got axis={axis!r}")

    # The masked operand and the index cover the full batch, except a shared weight on the W
    # axis (below); the other operand may be shared (no batch dims) or carry the full batch
    # (jnp.matmul broadcasting otherwise).
    full = jnp.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    owner_name = "w" if axis == "w" else "x"
    owner = w if axis == "w" else x
    tile = None if micro_tile is None else _resolve_tile(micro_tile, axis, owner.shape[-2:], "micro_tile")
    if index is None:
        tile = tile or _resolve_tile(None, axis, owner.shape[-2:], "micro_tile")
    else:
        _check_index(index, axis, owner, tile, owner_name)
    # A shared weight (W axis, w without batch dims, its index too) stays shared: the
    # products take a sparse operand whose batch divides the others' (one index build, no
    # copy of w per batch entry).
    shared_owner = axis == "w" and owner.ndim == 2 and (index is None or index.batch_shape == ())
    if tuple(owner.shape[:-2]) != full and not shared_owner:
        owner = jnp.broadcast_to(owner, (*full, *owner.shape[-2:]))
    other = x if axis == "w" else w
    if other.ndim > 2 and tuple(other.shape[:-2]) != full:
        other = jnp.broadcast_to(other, (*full, *other.shape[-2:]))
    x, w = (other, owner) if axis == "w" else (owner, other)

    if index is None:
        index = _own_index(owner, tile, axis)
    elif index.batch_shape != full and not shared_owner:
        lead = len(index.batch_shape)
        index = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (*full, *a.shape[lead:])), index)

    sparse = "b" if axis == "w" else "a"
    tile = (index.micro_tile[0], x.shape[-1]) if axis == "m" else index.micro_tile
    params = dict(sparse=sparse, tile=tile, trans_a=False, trans_b=False, trans_c=False,
                  allow_tf32=tf32, out_batch=len(full))
    # A bias alone stays in XLA, which fuses the add into whatever reads the product (a
    # layer norm, a slice); in the epilogue it cost more than that (H100 BERT profile,
    # docs/notes/sm90_row_gather.md "Fused epilogue").
    m_epilogue = axis == "m" and (bias is None or bias.ndim == 1)
    named = isinstance(activation, str) and activation in FUSED_ACTIVATIONS
    # With dead_rows="zeros" a bias alone goes to the epilogue too: its gradient is then
    # a sum over the live rows (row_linear), where XLA's add has a column sum over all.
    # With "unspecified" every M-axis product goes there: only that kernel skips the stores.
    fused = m_epilogue and (named or (zero_dead and bias is not None and activation is None) or
                            (skip_dead and activation is None))
    parts_fused = m_epilogue and out_parts > 1 and (activation is None or named)

    def live_only(y):  # the unfused paths' dead rows: zeros with dead_rows="zeros", NaN if unspecified
        if not zero_dead:
            return y
        return listed_rows_only(y, index.arrays[0], index.arrays[1], x.shape[-2], tile[0],
                                native=not config.reference_enabled("sparse_dense"), fill=jnp.nan if skip_dead else 0.0)

    if config.reference_enabled("sparse_dense"):
        y = live_only(epilogue(reference.stile_matmul(x, w, *index.arrays, **params)))
    elif parts_fused:
        ys = row_linear_parts(x, w, kernel_bias, index.arrays, tile_h=tile[0], parts=out_parts, activation=activation,
                              allow_tf32=tf32, zero_dead=zero_dead, skip_dead=skip_dead)
        return tuple(map(unvector, ys))
    elif fused:
        y = row_linear(x, w, kernel_bias, index.arrays, tile_h=tile[0], activation=activation, allow_tf32=tf32,
                       zero_dead=zero_dead, skip_dead=skip_dead)
    else:
        y = live_only(epilogue(stile_matmul(x, w, index.arrays, **params)))
    return result(y)


def _own_index(owner, tile, axis) -> PitIndex:
    """The index sparse_dense builds when given none. The M axis reads the flat list only.
    A K-axis (weight-block) forward reads the per-row (per-column) lists and its gradient
    the other grouping: one index call per grouping, so that in a jit that does not
    differentiate XLA removes the unused call, where one group_by="both" pass would write
    both groupings every time (H100, 4096^2 bf16: 12-20 us of a 16-37 us index)."""
    if axis == "m":
        return build_index(owner, tile)
    fwd, other = ("row", "col") if axis == "k" else ("col", "row")
    first = build_index(owner, tile, group_by=fwd)
    second = build_index(owner, tile, group_by=other)
    rows, cols = (first, second) if fwd == "row" else (second, first)
    return PitIndex(
        first.tiles, first.count, rows.row_tiles, rows.row_count, cols.col_tiles, cols.col_count,
        shape=first.shape, micro_tile=first.micro_tile, group_by="both",
    )
