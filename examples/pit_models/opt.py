"""An OPT-style decoder layer (pre-LN, causal attention, ReLU FFN of 4d) for inference on
left-padded batches, with fc2's input sparsity detected online.

Modes (the same parameters run all three):
  "dense": nn.Dense everywhere.
  "pit":   qkv, out_proj and fc1 skip padding rows (M axis, one row index per batch);
           fc2 reads the ReLU output through a K-axis index of 32x1 micro-tiles built
           from it in the same jit: per block of 32 tokens, only the neurons that fired;
           causal attention over the valid tokens (`pit_jax.varlen_attention`, left
           padding) where its kernels take the heads (16-bit, head_dim 64, 80, 96 or 128:
           every OPT width here).
  "pit_m": like "pit" but fc2 also on the M axis (isolates what the K axis adds).
The ReLU output is zero on padding tokens (pit: fc1 writes zeros there, dead_rows="zeros";
dense: multiplied by the padding mask), so blocks of padding tokens are dead micro-tiles
and the model never reads padding as activations.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

import pit_jax
from pit_jax.flax import SparseDense
from pit_models import common
from pit_models.bert import row_index

MODES = ("pit", "pit_m", "dense")
K_TILE = (32, 1)
# d -> heads of the OPT family (1.3B, 2.7B, 6.7B, 13B)
OPT_HEADS = {2048: 32, 2560: 32, 4096: 32, 5120: 40}


@dataclasses.dataclass(frozen=True)
class OPTConfig:
    d: int = 2048
    heads: int = 32
    dtype: Any = jnp.bfloat16

    @classmethod
    def of(cls, d, **kw):
        return cls(d=d, heads=OPT_HEADS.get(d, max(1, d // 64)), **kw)

    @classmethod
    def tiny(cls, **kw):
        return cls(**{**dict(d=64, heads=4, dtype=jnp.float32), **kw})

    @property
    def ffn(self):
        return 4 * self.d

    @property
    def head_dim(self):
        return self.d // self.heads


class OPTDecoderLayer(nn.Module):
    """__call__(x [B, S, d], lengths [B] int32, left-padded) -> (y [B, S, d], fc2 input
    [B*S, 4d]); rows of padding tokens in y are not meaningful."""

    cfg: OPTConfig
    mode: str = "pit"
    attention: str = "xla"
    # pit modes: attention by `pit_jax.varlen_attention` where its kernels take the shapes
    # (16-bit, head_dim 64, 80, 96 or 128, seq <= 65536), else `attention`.
    varlen_attention: bool = True

    @nn.compact
    def __call__(self, x, lengths):
        cfg = self.cfg
        if self.mode not in MODES:
            raise ValueError(f"OPTDecoderLayer: mode must be one of {MODES}, got {self.mode!r}")
        b, s, d = x.shape
        if d != cfg.d:
            raise ValueError(f"OPTDecoderLayer: x has d={d}, the config says d={cfg.d}")
        valid = common.left_padding_mask(lengths, s)
        if self.mode != "dense" and self.varlen_attention and common.varlen_kernels_apply(b, s, cfg, causal=True):
            impl = "pit"
        else:
            impl = common.resolve_attention(self.attention, b, s, cfg.heads, cfg.head_dim, cfg.dtype,
                                            causal=True, key_mask=True)
        rows = None if self.mode == "dense" else row_index(valid)

        def lin(features, name, h, *, k_index=None, relu=False, dead_rows="dense"):
            if self.mode == "dense":
                y = nn.Dense(features, dtype=cfg.dtype, name=name)(h)
                return nn.relu(y) if relu else y
            if k_index is not None:
                return SparseDense(features, dtype=cfg.dtype, axis="k", name=name)(h, index=k_index)
            # M axis: the bias and the ReLU run in the product's epilogue, on live rows only.
            act = "relu" if relu else None
            return SparseDense(features, dtype=cfg.dtype, axis="m", activation=act, dead_rows=dead_rows,
                               name=name)(h, index=rows)

        x = x.reshape(b * s, d)
        h = nn.LayerNorm(dtype=cfg.dtype, name="ln_attn")(x)
        qkv = lin(3 * d, "qkv", h).reshape(b, s, 3, cfg.heads, cfg.head_dim)
        att = common.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], lengths=lengths, causal=True,
                               padding="left", implementation=impl)
        x = x + lin(d, "out_proj", att.reshape(b * s, d))
        h = nn.LayerNorm(dtype=cfg.dtype, name="ln_ffn")(x)
        if self.mode == "dense":
            h = lin(cfg.ffn, "fc1", h, relu=True) * valid.reshape(-1, 1).astype(cfg.dtype)
        else:
            # fc1 writes zeros on the padding rows itself. (A mask multiply here was fused by
            # XLA into fc2's x^T transpose, and the index then read h back through a second
            # transpose: 87 us at d = 5120 on the H200.)
            h = lin(cfg.ffn, "fc1", h, relu=True, dead_rows="zeros")
        k_index = pit_jax.index(h.astype(cfg.dtype), K_TILE, group_by="row") if self.mode == "pit" else None
        x = x + lin(d, "fc2", h, k_index=k_index)
        return x.reshape(b, s, d), h


def relu_like_opt(params, key, cfg: OPTConfig, tile_density, *, block=K_TILE[0], spread=1.5):
    """params with fc1's bias set so that the ReLU output has about `tile_density` live
    32x1 micro-tiles, neurons skewed like a trained OPT's (a few fire often, most rarely).

    fc1's pre-activation of a LayerNorm'd input is ~N(0, 1) per neuron at init, so
    neuron j fires on a fraction p_j = Phi(b_j) of tokens and its 32x1 tile is live with
    1 - (1 - p_j)^32. p_j = c * u_j with lognormal u_j; c is solved for the mean.
    """
    u = np.exp(spread * np.asarray(jax.random.normal(key, (cfg.ffn,)), np.float64))
    u /= u.mean()

    def live(c):
        p = np.clip(c * u, 1e-9, 0.5)
        return float(np.mean(1.0 - (1.0 - p) ** block)), p

    lo, hi = 1e-9, 1.0
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if live(mid)[0] < tile_density else (lo, mid)
    p = live(hi)[1]
    from jax.scipy.special import ndtri

    bias = np.asarray(ndtri(jnp.asarray(p, jnp.float32)), np.float32)
    params = jax.tree_util.tree_map(lambda a: a, params)  # a copy: do not mutate the caller's dict
    params["params"]["fc1"]["bias"] = jnp.asarray(bias)
    return params


def tile_density(h, tile=K_TILE) -> float:
    """Fraction of live micro-tiles of the fc2 input (host-side, for reporting)."""
    a = np.asarray(h, np.float32) != 0
    m, k = a.shape
    bh, bw = tile
    tm, tk = math.ceil(m / bh), math.ceil(k / bw)
    a = np.pad(a, ((0, tm * bh - m), (0, tk * bw - k)))
    return float(a.reshape(tm, bh, tk, bw).any(axis=(1, 3)).mean())
