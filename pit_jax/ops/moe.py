"""Dropless mixture-of-experts with PIT: an online routing index, gathered grouped products
and a weighted combine.

    index = pit_jax.moe_index(expert_ids, num_experts)      # [..., T, k] -> MoeIndex
    y = pit_jax.moe_ffn(x, gates, index, w_in, w_out)       # y[t] = sum_j gates[t,j] FFN_e(x[t])

The index lists each expert's assignments (one pass with atomics on the device: no sort,
no host sync, every expert can hold every token, so nothing valid is dropped). Each expert
FFN runs as grouped products: SRead gathers the expert's token rows into dense tiles,
the tile multiplies by that expert's weight, SWrite scatters the rows to assignment order
(tiles past an expert's count cost nothing). The k outputs of a token are combined by a
gate-weighted sum in float32 (deterministic). Autodiff reuses the index: d x and the
hidden gradients are grouped products with transposed weights, each expert's weight
gradient is a gathered reduction over its own tokens only, and the gates get
d gates[t, j] = <dy[t], out[t, j]> so the router trains.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from pit_jax import _activations, config, reference
from pit_jax.moe_index import MoeIndex
from pit_jax.ops.sparse_dense import allow_tf32 as _allow_tf32
from pit_jax.pit_index import _static_int
from pit_jax.primitives import _products
from pit_jax.primitives.grouped_matmul import grouped_matmul as _grouped_matmul_p
from pit_jax.primitives.moe_index import moe_index_p

_MAX_ASSIGNMENTS = 2**31 - 1
ROWS = ("tokens", "assignments")


def moe_index(expert_ids: jax.Array, num_experts: int) -> MoeIndex:
    """Lists each expert's routed tokens in one pass on the device (inside jit, no sort).

    Args:
      expert_ids: integer [..., T, k] (k = experts per token, the router's top-k), or
        [..., T] for top-1. Leading dims are batch dims (one index per token group).
        An id outside [0, num_experts) cannot raise inside jit: that assignment is
        dropped, counted in `MoeIndex.dropped()`, and contributes zero to the output.
      num_experts: E, a static int >= 1.
    Returns:
      A `MoeIndex` (lists [..., E+1, T*k], counts [..., E+1]). Order within a list is free.
    """
    num_experts = _static_int(num_experts, "moe_index: num_experts")
    if num_experts < 1:
        raise ValueError(f"moe_index: num_experts must be >= 1, got {num_experts}")
    if not hasattr(expert_ids, "dtype"):
        expert_ids = jnp.asarray(expert_ids)
    if not jnp.issubdtype(expert_ids.dtype, jnp.integer):
        raise TypeError(f"moe_index: expert_ids must be an integer array [..., T, k], got {expert_ids.dtype}")
    if expert_ids.ndim < 1:
        raise ValueError("moe_index: expert_ids must have shape [..., T, k] or [T] (top-1), got a scalar")
    if expert_ids.ndim == 1:
        expert_ids = expert_ids[:, None]
    t, k = expert_ids.shape[-2:]
    if k < 1:
        raise ValueError(f"moe_index: expert_ids' last dim (k, experts per token) must be >= 1, got {k}")
    if k > num_experts:
        raise ValueError(
            f"moe_index: each token picks k={k} experts (expert_ids' last dim) but there are only "
            f"num_experts={num_experts}; expected k <= {num_experts}"
        )
    if t * k > _MAX_ASSIGNMENTS:
        raise ValueError(f"moe_index: {t} tokens x {k} choices exceeds {_MAX_ASSIGNMENTS} assignments")
    if num_experts * t * k > 2**40:
        raise ValueError(f"moe_index: {num_experts} experts x {t * k} assignments is too large an index")
    if expert_ids.dtype != jnp.int32:
        info = jnp.iinfo(expert_ids.dtype)
        if info.bits > 32 or (info.min == 0 and info.bits == 32):
            # Ids that do not fit int32 are out of range for any E < 2^31: keep them out of range.
            expert_ids = jnp.where((expert_ids >= 0) & (expert_ids < num_experts), expert_ids, -1)
        expert_ids = expert_ids.astype(jnp.int32)
    if config.reference_enabled("moe"):
        lists, counts = reference.moe_index(expert_ids, num_experts=num_experts)
    else:
        lists, counts = moe_index_p.bind(expert_ids, num_experts=num_experts)
    return MoeIndex(lists, counts, num_experts, k)


def _check_index(index, t, what):
    if not isinstance(index, MoeIndex):
        raise TypeError(f"{what}: index must be a pit_jax.MoeIndex (from pit_jax.moe_index), got {type(index).__name__}")
    if index.num_tokens != t:
        raise ValueError(f"{what}: the index routes {index.num_tokens} tokens but x has {t} (x is [..., T, D])")


def _check_batch(x_batch, other_batch, name, what):
    if other_batch and tuple(x_batch[: len(other_batch)]) != tuple(other_batch):
        raise ValueError(
            f"{what}: {name} has batch dims {tuple(other_batch)}, which must be a prefix of x's {tuple(x_batch)} "
            f"(or none: shared by every token group)"
        )


def _grouped(src, w, index, row_div, tf32, relu=False):
    if config.reference_enabled("moe"):
        y = reference.grouped_matmul(src, w, index.lists, index.counts, row_div=row_div, trans_w=False, allow_tf32=tf32)
        return jax.nn.relu(y) if relu else y
    return _grouped_matmul_p(src, w, index.lists, index.counts, row_div=row_div, allow_tf32=tf32, relu=relu)


def grouped_matmul(
    x: jax.Array, w: jax.Array, index: MoeIndex, *, rows: str = "tokens", precision: Any = None
) -> jax.Array:
    """Each assignment's row times its expert's weight: out[..., a] = x[..., row(a)] @ w[e(a)].

    Args:
      x: [..., T, D] tokens (rows="tokens": assignment t*k+j reads token t) or
        [..., T*k, D] rows already in assignment order (rows="assignments").
      w: [E, D, F] expert weights (or [..., E, D, F] with batch dims a prefix of x's).
      index: the `MoeIndex` of the routing.
    Returns:
      [..., T*k, F] in assignment order; dropped assignments give zero rows.
    """
    what = "grouped_matmul"
    if rows not in ROWS:
        raise ValueError(f"{what}: rows must be one of {ROWS}, got {rows!r}")
    x, w = jnp.asarray(x), jnp.asarray(w)
    dtype = jnp.result_type(x.dtype, w.dtype)
    if dtype not in _products.FLOATS:
        raise TypeError(f"{what}: x and w must be float32, bfloat16 or float16, got {x.dtype} and {w.dtype}")
    if x.ndim < 2 or w.ndim < 3:
        raise ValueError(f"{what}: x must be [..., rows, D] and w [E, D, F], got {x.shape} and {w.shape}")
    row_div = index.top_k if rows == "tokens" else 1
    if rows == "assignments" and x.shape[-2] != index.num_assignments:
        raise ValueError(f"{what}: rows='assignments' needs x [..., {index.num_assignments}, D] (T*k rows), got {x.shape}")
    _check_index(index, x.shape[-2] // (1 if rows == "tokens" else index.top_k), what)
    if w.shape[-3] != index.num_experts:
        raise ValueError(f"{what}: w has {w.shape[-3]} experts ([E, D, F]) but the index routes to {index.num_experts}")
    if w.shape[-2] != x.shape[-1]:
        raise ValueError(f"{what}: w is [E, {w.shape[-2]}, F] but x has {x.shape[-1]} features")
    _check_batch(x.shape[:-2], w.shape[:-3], "w", what)
    _check_batch(x.shape[:-2], index.batch_shape, "the index", what)
    return _grouped(x.astype(dtype), w.astype(dtype), index, row_div, _allow_tf32(precision))


def moe_ffn(
    x: jax.Array,
    gates: jax.Array,
    index: MoeIndex,
    w_in: jax.Array,
    w_out: jax.Array,
    *,
    w_gate: Optional[jax.Array] = None,
    activation: _activations.ActivationSpec = "relu",
    precision: Any = None,
) -> jax.Array:
    """A dropless MoE feed-forward layer: y[t] = sum_j gates[t, j] * FFN_{e(t, j)}(x[t]).

    Args:
      x: [..., T, D] tokens (float32 / bfloat16 / float16).
      gates: [..., T, k] combine weights of the k chosen experts (differentiable: the
        router trains through them).
      index: `pit_jax.moe_index(expert_ids, E)` of the same [..., T, k] routing.
      w_in: [E, D, F]; w_out: [E, F, D]; w_gate: optional [E, D, F] for a gated FFN
        (SwiGLU with activation="silu"): FFN_e(v) = (act(v @ w_gate[e]) * (v @ w_in[e])) @ w_out[e];
        without it FFN_e(v) = act(v @ w_in[e]) @ w_out[e]. Weights may carry batch dims
        that are a prefix of x's.
      activation: "relu", "gelu", "gelu_exact", "silu" or a callable (elementwise).
      precision: float32 only: None/HIGHEST exact, DEFAULT/"tensorfloat32" allow TF32.
    Returns:
      [..., T, D] in the result dtype of x and the weights.
    """
    what = "moe_ffn"
    act = _activations.resolve(activation, f"{what}: activation")
    x, gates = jnp.asarray(x), jnp.asarray(gates)
    weights = [jnp.asarray(w_in), jnp.asarray(w_out)] + ([] if w_gate is None else [jnp.asarray(w_gate)])
    dtype = jnp.result_type(x.dtype, *(w.dtype for w in weights))
    if dtype not in _products.FLOATS:
        raise TypeError(f"{what}: x and the weights must be float32, bfloat16 or float16, got {dtype}")
    if x.ndim < 2:
        raise ValueError(f"{what}: x must be [..., T, D], got shape {tuple(x.shape)}")
    t, d = x.shape[-2:]
    _check_index(index, t, what)
    k, e = index.top_k, index.num_experts
    if not jnp.issubdtype(gates.dtype, jnp.floating) or tuple(gates.shape) != tuple(x.shape[:-1]) + (k,):
        raise ValueError(
            f"{what}: gates must be a float array {tuple(x.shape[:-1]) + (k,)} ([..., T, k]), got "
            f"{gates.dtype}{list(gates.shape)}"
        )
    w_in, w_out = weights[0], weights[1]
    if w_in.ndim < 3 or w_in.shape[-3:-1] != (e, d):
        raise ValueError(f"{what}: w_in must be [E={e}, D={d}, F], got {tuple(w_in.shape)}")
    f = w_in.shape[-1]
    if w_out.ndim < 3 or w_out.shape[-3:] != (e, f, d):
        raise ValueError(f"{what}: w_out must be [E={e}, F={f}, D={d}], got {tuple(w_out.shape)}")
    if w_gate is not None and (weights[2].ndim < 3 or weights[2].shape[-3:] != w_in.shape[-3:]):
        raise ValueError(f"{what}: w_gate must be [E={e}, D={d}, F={f}] like w_in, got {tuple(weights[2].shape)}")
    for name, w in zip(("w_in", "w_out", "w_gate"), weights):
        _check_batch(x.shape[:-2], w.shape[:-3], name, what)
    _check_batch(x.shape[:-2], index.batch_shape, "the index", what)
    tf32 = _allow_tf32(precision)
    x = x.astype(dtype)
    w_in, w_out = w_in.astype(dtype), w_out.astype(dtype)

    # ReLU runs in the product's epilogue (relu of the rounded product = the rounded relu,
    # so the result is the same); other activations in XLA, in float32.
    fused = act is jax.nn.relu
    if w_gate is not None:
        g = _grouped(x, weights[2].astype(dtype), index, k, tf32, relu=fused)  # [..., T*k, F], assignment order
        h = (g if fused else act(g.astype(jnp.float32))).astype(jnp.float32) * _grouped(x, w_in, index, k, tf32)
    else:
        h = _grouped(x, w_in, index, k, tf32, relu=fused)
        h = h if fused else act(h.astype(jnp.float32))
    out = _grouped(h.astype(dtype), w_out, index, 1, tf32)  # [..., T*k, D]; dropped rows are 0
    out = out.reshape(*out.shape[:-2], t, k, d).astype(jnp.float32)
    y = jnp.einsum("...tkd,...tk->...td", out, gates.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return y.astype(dtype)
