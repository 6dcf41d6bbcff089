"""flax.linen layers: `SparseDense` (`nn.Dense` whose product skips dead micro-tiles),
`LayerNorm` (`nn.LayerNorm` on the live rows of a padded batch) and `VarlenSelfAttention`
(self-attention of a padded batch on its valid tokens, bidirectional or causal)."""

from __future__ import annotations

from typing import Any, Optional

import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.linen.dtypes import promote_dtype

from pit_jax.flax._common import (attention_heads, check_features, keep_float32_bias, layer_norm_last_dim,
                                  plan_from_sample, sparse_matmul_last_dim, varlen_self_attention)
from pit_jax.optimizer.plan import Plan
from pit_jax.pit_index import MicroTileSpec


class SparseDense(nn.Module):
    """A drop-in for `flax.linen.Dense`: same parameters ("kernel" [in, features],
    "bias" [features]), same initializers and dtype handling, same result — computed by
    `pit_jax.sparse_dense`, with the sparsity index built from the input on every call.

    Attributes (beyond nn.Dense's):
      axis: "m" (dead token rows, e.g. padding), "k" (activation sparsity, e.g. the
        input is a ReLU output) or "w" (block-sparse kernel).
      micro_tile: the index's micro-tile; defaults m (1, K), k (32, 1), w (32, 64);
        "auto" plans from the inputs when they are concrete, else uses the default.
      plan: a `pit_jax.Plan` for the product (static): overrides axis and micro_tile,
        or runs the dense product. `SparseDense.from_sample` makes one from inputs.
      activation: None, a name ("relu", "gelu", "gelu_exact", "silu") or a callable,
        applied after the bias: `act(nn.Dense(x))`. On the M axis a named activation runs
        with the bias in the product's epilogue, on live rows only (padding rows are
        written act(bias) without work), so it costs nothing on padding.
      batch_dims: leading dims of the inputs kept as a batch (one index per entry), the
        rest folded into rows (default 0: one index over all rows, which keeps 128-row
        tiles full for short sequences). `jit` over several devices splits a batch dim
        (docs/transformations.md); folded rows run on whole operands there.
      dead_rows: axis "m": "dense" (padding rows hold act(bias), as nn.Dense gives),
        "zeros" (they hold zeros; the bias's gradient then reads the live rows only) or
        "unspecified" (left unwritten; gradients as with "zeros"), as in `pit_jax.sparse_dense`.
    """

    features: int
    use_bias: bool = True
    dtype: Optional[Any] = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros_init()
    axis: str = "m"
    micro_tile: Optional[MicroTileSpec] = None
    plan: Optional[Plan] = None
    activation: Any = None
    batch_dims: int = 0
    dead_rows: str = "dense"

    @classmethod
    def from_sample(cls, sample, features: int, **attributes) -> "SparseDense":
        """The layer with a plan made from a sample of its inputs ([..., in_features]):
        `SparseDense.from_sample(x, 512)` then `init` / `apply` as usual."""
        p = plan_from_sample(
            sample, np.shape(sample)[-1], features, dtype=attributes.get("dtype"),
            param_dtype=attributes.get("param_dtype", jnp.float32), precision=attributes.get("precision"),
        )
        return cls(features, plan=p, **attributes)

    @nn.compact
    def __call__(self, inputs, index=None):
        """`index` (optional): a PitIndex of the inputs (of the kernel for axis "w")."""
        check_features("pit_jax.flax.SparseDense", features=self.features, in_features=jnp.shape(inputs)[-1])
        kernel = self.param("kernel", self.kernel_init, (jnp.shape(inputs)[-1], self.features), self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
        inputs, kernel, promoted = promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        y = sparse_matmul_last_dim(
            inputs, kernel, axis=self.axis, micro_tile=self.micro_tile, precision=self.precision, index=index,
            plan=self.plan, bias=keep_float32_bias(bias, promoted), activation=self.activation,
            batch_dims=self.batch_dims, dead_rows=self.dead_rows,
        )
        return y


class LayerNorm(nn.Module):
    """A drop-in for `flax.linen.LayerNorm` over the last axis (same parameters "scale"
    and "bias", initializers and dtypes) that normalizes only the rows an M-axis index
    lists, by `pit_jax.layer_norm`; the other rows are zeros.

    `LayerNorm()(x, index, residual=r, bias=b)` is `nn.LayerNorm()(x + r + b)` on the
    live rows: a padded model's residual add, the preceding product's bias and the norm
    run in one pass over the valid tokens (XLA would run them over every row).
    `index=None` normalizes every row. `dead_rows="unspecified"` leaves the other rows
    unwritten (gradients as with "zeros"), as in `pit_jax.layer_norm`. `copies=2` returns the result
    twice, one per consumer (a residual stream's next product and next norm): the
    backward then adds their cotangents on the live rows only (`pit_jax.layer_norm`).
    """

    epsilon: float = 1e-6
    dtype: Optional[Any] = None
    param_dtype: Any = jnp.float32
    use_bias: bool = True
    use_scale: bool = True
    bias_init: Any = nn.initializers.zeros_init()
    scale_init: Any = nn.initializers.ones_init()
    dead_rows: str = "zeros"

    @nn.compact
    def __call__(self, x, index=None, *, residual=None, bias=None, copies=1):
        features = jnp.shape(x)[-1]
        scale = self.param("scale", self.scale_init, (features,), self.param_dtype) if self.use_scale else None
        offset = self.param("bias", self.bias_init, (features,), self.param_dtype) if self.use_bias else None
        return layer_norm_last_dim(x, scale, offset, index, residual=residual, bias=bias, epsilon=self.epsilon,
                                   dtype=self.dtype, param_dtype=self.param_dtype, dead_rows=self.dead_rows,
                                   copies=copies)


class _KernelBias(nn.Module):
    """Holds one projection's "kernel" and "bias" under its own name, as nn.DenseGeneral does."""

    kernel_shape: tuple
    bias_shape: tuple
    use_bias: bool
    kernel_init: Any
    bias_init: Any
    param_dtype: Any

    @nn.compact
    def __call__(self):
        kernel = self.param("kernel", self.kernel_init, self.kernel_shape, self.param_dtype)
        bias = self.param("bias", self.bias_init, self.bias_shape, self.param_dtype) if self.use_bias else None
        return kernel, bias


class VarlenSelfAttention(nn.Module):
    """Multi-head self-attention of a padded batch on its valid tokens: the
    parameters of `flax.linen.MultiHeadDotProductAttention` ("query", "key", "value":
    kernel [D, heads, head_dim], bias [heads, head_dim]; "out": kernel [heads, head_dim,
    out_features], bias [out_features]; same initializers), and on the valid rows its
    result for `inputs_q = inputs_kv = x` with the mask `nn.make_attention_mask(valid,
    valid)` (`causal=True`: combined with `nn.make_causal_mask`). The projections run as
    M-axis products over the valid tokens only (q, k, v in one; with `num_kv_heads`, q in
    one and k, v in another), the attention as `pit_jax.varlen_attention`.

    `__call__(x [B, S, D], lengths [B], index=None)`: sequence b's valid tokens are its
    first lengths[b] (`padding="right"`) or its last (`padding="left"`); `index` is the
    row index of the valid tokens of x as [B * S, D] (e.g. one
    `pit_jax.index(mask.reshape(-1, 1), "row")` shared by a model's layers), built from
    lengths when None. The padding rows of the result are zeros (`dead_rows="zeros"`) or
    left unwritten (`"unspecified"`), where Flax's would hold an average over the whole
    sequence. No dropout, decoding cache or qk normalization.

    Beyond Flax's attributes: `num_kv_heads` (default num_heads) makes the "key" and
    "value" projections [D, num_kv_heads, head_dim], shared by groups of num_heads /
    num_kv_heads query heads (grouped-query attention, as `jax.nn.dot_product_attention`
    groups; Flax's layer with each kv head repeated over its group gives the same result);
    `local_window_size` (None, w or (left, right)) attends within a sliding window, as in
    `pit_jax.varlen_attention`.

    Packed rows: `__call__(x, cu_seqlens=cu, max_seqlen=None, index=None)` with `cu`
    [B, n + 1] in place of lengths: row b holds n sequences one after another, each
    attending to its own tokens only (`pit_jax.packed_attention`; Flax's layer with the
    segments' block-diagonal mask gives the same result on their tokens); the row's other
    tokens are padding.
    """

    num_heads: int
    qkv_features: Optional[int] = None
    out_features: Optional[int] = None
    dtype: Optional[Any] = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros_init()
    use_bias: bool = True
    dead_rows: str = "zeros"
    causal: bool = False
    padding: str = "right"
    num_kv_heads: Optional[int] = None
    local_window_size: Any = None

    @nn.compact
    def __call__(self, x, lengths=None, index=None, *, cu_seqlens=None, max_seqlen=None):
        d = jnp.shape(x)[-1]
        feats = self.qkv_features or d
        heads, kv_heads = attention_heads(self.num_heads, self.num_kv_heads, feats)
        hd, out = feats // heads, self.out_features or d
        proj = lambda name, k_shape, b_shape: _KernelBias(k_shape, b_shape, self.use_bias, self.kernel_init,  # noqa: E731
                                                          self.bias_init, self.param_dtype, name=name)()
        qkv = [proj(n, (d, h, hd), (h, hd)) for n, h in (("query", heads), ("key", kv_heads), ("value", kv_heads))]
        out_kernel, out_bias = proj("out", (heads, hd, out), (out,))
        return varlen_self_attention(x, lengths, [k for k, _ in qkv], [b for _, b in qkv] if self.use_bias else None,
                                     out_kernel, out_bias, dtype=self.dtype, precision=self.precision, index=index,
                                     dead_rows=self.dead_rows, causal=self.causal, padding=self.padding,
                                     local_window_size=self.local_window_size, cu_seqlens=cu_seqlens,
                                     max_seqlen=max_seqlen)
