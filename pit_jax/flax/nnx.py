"""flax.nnx layers: `SparseDense` (`nnx.Linear` whose product skips dead micro-tiles),
`LayerNorm` (`nnx.LayerNorm` on the live rows of a padded batch) and `VarlenSelfAttention`
(self-attention of a padded batch on its valid tokens, bidirectional or causal)."""

from __future__ import annotations

from typing import Any, Optional

import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes, initializers

from pit_jax.flax._common import (attention_heads, check_features, keep_float32_bias, layer_norm_last_dim,
                                  plan_from_sample, sparse_matmul_last_dim, varlen_self_attention)
from pit_jax.flax.nnx_moe import MoE
from pit_jax.optimizer.plan import Plan
from pit_jax.pit_index import MicroTileSpec


class SparseDense(nnx.Module):
    """A drop-in for `flax.nnx.Linear` (same parameters `kernel` [in, out] and `bias`
    [out], same initializers and dtypes), computed by `pit_jax.sparse_dense` with the
    index built from the input on every call. `axis`, `micro_tile` and `plan` as in the
    linen layer; `sample` (a sample of the inputs, [..., in_features]) makes the plan
    here, at construction. `activation` (None, a name or a callable) is applied after
    the bias; on the M axis a named activation runs with the bias in the product's
    epilogue, on live rows only (`pit_jax.sparse_dense`). `batch_dims`: leading dims of
    the inputs kept as a batch (one index per entry; `jit` over several devices splits
    it), and `dead_rows` ("dense", "zeros" or "unspecified": the padding rows' value),
    as in the linen layer."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        use_bias: bool = True,
        dtype: Optional[Any] = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        kernel_init: Any = initializers.lecun_normal(),
        bias_init: Any = initializers.zeros_init(),
        axis: str = "m",
        micro_tile: Optional[MicroTileSpec] = None,
        plan: Optional[Plan] = None,
        sample: Any = None,
        activation: Any = None,
        batch_dims: int = 0,
        dead_rows: str = "dense",
        rngs: nnx.Rngs,
    ):
        check_features("pit_jax.flax.nnx.SparseDense", in_features=in_features, out_features=out_features)
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision
        self.axis = axis
        self.micro_tile = micro_tile
        self.activation = activation
        self.batch_dims = batch_dims
        self.dead_rows = dead_rows
        if sample is not None:
            if plan is not None:
                raise ValueError("SparseDense: pass either plan or sample, not both")
            plan = plan_from_sample(
                sample, in_features, out_features, dtype=dtype, param_dtype=param_dtype, precision=precision
            )
        self.plan = plan
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype))
        self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype)) if use_bias else None

    def __call__(self, inputs, index=None):
        kernel = self.kernel[...]
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, promoted = dtypes.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
        y = sparse_matmul_last_dim(
            inputs, kernel, axis=self.axis, micro_tile=self.micro_tile, precision=self.precision, index=index,
            plan=self.plan, bias=keep_float32_bias(bias, promoted), activation=self.activation,
            batch_dims=self.batch_dims, dead_rows=self.dead_rows,
        )
        return y


class LayerNorm(nnx.Module):
    """A drop-in for `flax.nnx.LayerNorm` over the last axis (parameters `scale` and
    `bias`) that normalizes only the rows an M-axis index lists (`pit_jax.layer_norm`;
    zeros elsewhere): `LayerNorm(n, rngs=r)(x, index, residual=res, bias=b)` is
    `nnx.LayerNorm(n)(x + res + b)` on the live rows. `index=None`: every row.
    `dead_rows="unspecified"`: the other rows are left unwritten (gradients as with "zeros").
    `copies=2`: the result twice, one per consumer, so the backward adds their
    cotangents on the live rows only (`pit_jax.layer_norm`)."""

    def __init__(
        self,
        num_features: int,
        *,
        epsilon: float = 1e-6,
        dtype: Optional[Any] = None,
        param_dtype: Any = jnp.float32,
        use_bias: bool = True,
        use_scale: bool = True,
        bias_init: Any = initializers.zeros_init(),
        scale_init: Any = initializers.ones_init(),
        dead_rows: str = "zeros",
        rngs: nnx.Rngs,
    ):
        self.num_features = num_features
        self.epsilon = epsilon
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.dead_rows = dead_rows
        self.scale = nnx.Param(scale_init(rngs.params(), (num_features,), param_dtype)) if use_scale else None
        self.bias = nnx.Param(bias_init(rngs.params(), (num_features,), param_dtype)) if use_bias else None

    def __call__(self, x, index=None, *, residual=None, bias=None, copies=1):
        scale = self.scale[...] if self.scale is not None else None
        offset = self.bias[...] if self.bias is not None else None
        return layer_norm_last_dim(x, scale, offset, index, residual=residual, bias=bias, epsilon=self.epsilon,
                                   dtype=self.dtype, param_dtype=self.param_dtype, dead_rows=self.dead_rows,
                                   copies=copies)


class VarlenSelfAttention(nnx.Module):
    """Multi-head self-attention of a padded batch on its valid tokens: the state of
    `flax.nnx.MultiHeadAttention` (`query`, `key`, `value`, `out`, each an
    `nnx.LinearGeneral` with its kernel and bias; same initializers), and on the valid rows
    its result for self-attention with the mask `nnx.make_attention_mask(valid, valid)`
    (`causal=True`: combined with `nnx.make_causal_mask`; `padding="left"`: the valid
    tokens are each sequence's last lengths[b]).
    The projections run as M-axis products over the valid tokens only (q, k, v in one; with
    `num_kv_heads`, q in one and k, v in another), the attention as
    `pit_jax.varlen_attention`; as `pit_jax.flax.VarlenSelfAttention`
    (linen), whose docstring has the details.

    `__call__(x [B, S, D], lengths [B], index=None)`, or for packed rows `__call__(x,
    cu_seqlens=[B, n + 1], max_seqlen=None)`. `num_kv_heads` (grouped-query attention:
    `key` and `value` with that many heads) and `local_window_size` (a sliding window) as
    in the linen layer.
    """

    def __init__(
        self,
        num_heads: int,
        in_features: int,
        qkv_features: Optional[int] = None,
        out_features: Optional[int] = None,
        *,
        dtype: Optional[Any] = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        kernel_init: Any = initializers.lecun_normal(),
        bias_init: Any = initializers.zeros_init(),
        use_bias: bool = True,
        dead_rows: str = "zeros",
        causal: bool = False,
        padding: str = "right",
        num_kv_heads: Optional[int] = None,
        local_window_size: Any = None,
        rngs: nnx.Rngs,
    ):
        feats = qkv_features or in_features
        heads, kv_heads = attention_heads(num_heads, num_kv_heads, feats)
        self.num_heads, self.num_kv_heads, self.in_features, self.qkv_features = heads, kv_heads, in_features, feats
        self.out_features = out_features or in_features
        self.dtype, self.precision, self.use_bias, self.dead_rows = dtype, precision, use_bias, dead_rows
        self.causal, self.padding, self.local_window_size = causal, padding, local_window_size
        hd = feats // heads
        # Parameter holders only (never called), so the state is nnx.MultiHeadAttention's.
        proj = lambda i, o, axis=-1: nnx.LinearGeneral(i, o, axis=axis, use_bias=use_bias, param_dtype=param_dtype,  # noqa: E731
                                                       kernel_init=kernel_init, bias_init=bias_init, rngs=rngs)
        self.query, self.key, self.value = (proj(in_features, (h, hd)) for h in (heads, kv_heads, kv_heads))
        self.out = proj((heads, hd), self.out_features, axis=(-2, -1))

    def __call__(self, x, lengths=None, index=None, *, cu_seqlens=None, max_seqlen=None):
        qkv = (self.query, self.key, self.value)
        return varlen_self_attention(
            x, lengths, [m.kernel[...] for m in qkv], [m.bias[...] for m in qkv] if self.use_bias else None,
            self.out.kernel[...], self.out.bias[...] if self.use_bias else None, dtype=self.dtype,
            precision=self.precision, index=index, dead_rows=self.dead_rows, causal=self.causal, padding=self.padding,
            local_window_size=self.local_window_size, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)


SparseLinear = SparseDense

__all__ = ["LayerNorm", "MoE", "SparseDense", "SparseLinear", "VarlenSelfAttention"]
