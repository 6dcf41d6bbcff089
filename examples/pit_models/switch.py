"""A Switch-style encoder stack (PIT Fig. 8): pre-LN transformer layers whose FFN is a
mixture of experts in every `moe_every`-th layer (Switch Transformer: every other one).

One parameter tree, three ways to run the expert FFNs (`mode`):
- "pit": `pit_jax.flax.MoE` — routing index built on the device, gathered grouped
  products, dropless;
- "ragged": what a JAX user writes today — sort the assignments by expert,
  `jax.lax.ragged_dot` twice, unsort, combine with the gates (dropless too);
- "dense": the dense twin — every expert on every token as two wide matmuls
  ([T, D] @ [D, E*F], then [T, E*F] @ [E*F, D] with the gates folded in), E times the
  FLOPs but the same outputs: the dense model of a dropless MoE.
All three route identically (float32 router, softmax, top-k; gates renormalized for
k > 1) and use ReLU experts (Switch / T5 v1.0). The auxiliary losses are sown by the PIT
layer only; the benchmark and the tests use the task loss, so all modes agree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from pit_jax.flax import MoE
from pit_models import common

MODES = ("pit", "ragged", "dense")


@dataclasses.dataclass(frozen=True)
class SwitchConfig:
    vocab: int = 30522
    hidden: int = 768
    heads: int = 12
    ffn: int = 3072  # each expert's hidden width
    layers: int = 4
    moe_every: int = 2  # layer i has an MoE FFN when (i + 1) % moe_every == 0
    experts: int = 64
    top_k: int = 1
    max_len: int = 512
    num_labels: int = 2
    dtype: Any = jnp.bfloat16  # compute dtype; parameters are float32

    @classmethod
    def base(cls, **kw):
        return cls(**kw)

    @classmethod
    def tiny(cls, **kw):
        return cls(**{**dict(vocab=97, hidden=32, heads=4, ffn=48, layers=2, experts=4, max_len=64,
                             dtype=jnp.float32), **kw})

    @property
    def head_dim(self):
        return self.hidden // self.heads

    def is_moe(self, layer: int) -> bool:
        return (layer + 1) % self.moe_every == 0


def route(x, w_router, top_k):
    """The router of `pit_jax.flax.MoE` (float32, exact product, softmax, top-k, gates
    renormalized when k > 1): (gates [T, k] float32, expert ids [T, k] int32)."""
    logits = jnp.matmul(x.astype(jnp.float32), w_router.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    gates, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
    if top_k > 1:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    return gates, ids.astype(jnp.int32)


def ragged_experts(x, gates, ids, w_in, w_out):
    """Sort + ragged_dot + unsort: x [T, D] -> [T, D]."""
    t, k = ids.shape
    e = w_in.shape[0]
    flat = ids.reshape(-1)
    order = jnp.argsort(flat)
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
    xs = jnp.take(x, order // k, axis=0)
    h = jax.nn.relu(jax.lax.ragged_dot(xs, w_in, sizes, preferred_element_type=jnp.float32)).astype(x.dtype)
    o = jax.lax.ragged_dot(h, w_out, sizes, preferred_element_type=jnp.float32)
    o = jnp.zeros_like(o).at[order].set(o).reshape(t, k, -1)  # back to assignment order
    return jnp.einsum("tkd,tk->td", o, gates).astype(x.dtype)


def dense_experts(x, gates, ids, w_in, w_out):
    """Every expert on every token, gates folded into the second product: x [T, D] -> [T, D]."""
    e, d, f = w_in.shape
    g = jnp.zeros((x.shape[0], e), jnp.float32).at[jnp.arange(x.shape[0])[:, None], ids].add(gates)
    h = jax.nn.relu(x @ jnp.transpose(w_in, (1, 0, 2)).reshape(d, e * f))  # [T, E*F]
    h = (h.reshape(-1, e, f) * g[:, :, None].astype(h.dtype)).reshape(-1, e * f)
    return (h @ w_out.reshape(e * f, -1)).astype(x.dtype)


class TwinMoE(nn.Module):
    """The parameters of `pit_jax.flax.MoE` (router_kernel, w_in, w_out), run by the ragged
    or the dense expert computation."""

    num_experts: int
    hidden_dim: int
    top_k: int
    mode: str
    dtype: Any

    @nn.compact
    def __call__(self, x):
        e, d, f = self.num_experts, x.shape[-1], self.hidden_dim
        init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        router_init = nn.initializers.variance_scaling(0.1, "fan_in", "truncated_normal")  # as MoE's
        w_router = self.param("router_kernel", router_init, (d, e), jnp.float32)
        w_in = self.param("w_in", init, (e, d, f), jnp.float32).astype(self.dtype)
        w_out = self.param("w_out", init, (e, f, d), jnp.float32).astype(self.dtype)
        tokens = x.reshape(-1, d)
        gates, ids = route(tokens, w_router, self.top_k)
        run = ragged_experts if self.mode == "ragged" else dense_experts
        return run(tokens.astype(self.dtype), gates, ids, w_in, w_out).reshape(x.shape)


class EncoderLayer(nn.Module):
    cfg: SwitchConfig
    layer: int
    mode: str = "pit"
    attention: str = "xla"

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        b, s, _ = x.shape
        h = nn.LayerNorm(dtype=cfg.dtype, name="ln_attn")(x)
        qkv = nn.Dense(3 * cfg.hidden, dtype=cfg.dtype, name="qkv")(h).reshape(b, s, 3, cfg.heads, cfg.head_dim)
        att = common.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], implementation=self.attention)
        x = x + nn.Dense(cfg.hidden, dtype=cfg.dtype, name="attn_out")(att.reshape(b, s, cfg.hidden))
        h = nn.LayerNorm(dtype=cfg.dtype, name="ln_ffn")(x)
        if not cfg.is_moe(self.layer):
            h = nn.Dense(cfg.hidden, dtype=cfg.dtype, name="ffn_out")(
                jax.nn.relu(nn.Dense(cfg.ffn, dtype=cfg.dtype, name="ffn_in")(h)))
        elif self.mode == "pit":
            h = MoE(cfg.experts, cfg.ffn, top_k=cfg.top_k, activation="relu", dtype=cfg.dtype, name="moe")(h)
        else:
            h = TwinMoE(cfg.experts, cfg.ffn, cfg.top_k, self.mode, cfg.dtype, name="moe")(h)
        return x + h


class SwitchClassifier(nn.Module):
    """Embeddings -> the layer stack -> final LayerNorm; a classifier on the first token.

    __call__(tokens [B, S] int32) -> (logits [B, num_labels] float32, hidden [B, S, H])."""

    cfg: SwitchConfig
    mode: str = "pit"
    attention: str = "xla"  # "xla", "cudnn" or "auto"

    @nn.compact
    def __call__(self, tokens):
        cfg = self.cfg
        if self.mode not in MODES:
            raise ValueError(f"SwitchClassifier: mode must be one of {MODES}, got {self.mode!r}")
        b, s = tokens.shape
        impl = common.resolve_attention(self.attention, b, s, cfg.heads, cfg.head_dim, cfg.dtype)
        x = nn.Embed(cfg.vocab, cfg.hidden, name="word_emb")(tokens)
        x = (x + nn.Embed(cfg.max_len, cfg.hidden, name="pos_emb")(jnp.arange(s))[None]).astype(cfg.dtype)
        for i in range(cfg.layers):
            x = EncoderLayer(cfg, i, self.mode, impl, name=f"layer_{i}")(x)
        x = nn.LayerNorm(dtype=cfg.dtype, name="ln_out")(x)
        logits = nn.Dense(cfg.num_labels, dtype=cfg.dtype, name="classifier")(x[:, 0])
        return logits.astype(jnp.float32), x


# In bf16 a token whose top router scores are nearly tied can pick another expert in another
# implementation after a few layers of rounding; its output then differs by O(1). That is
# routing, not arithmetic: agreement is judged per token, and this fraction may differ
# (H100, 4 layers, top-2: ragged_dot and pit_jax both differ from the dense twin on
# 0.8-1.2 % of the tokens; top-1 on none).
MAX_REROUTED = 0.02


def token_agreement(out, ref, tol, max_fraction=MAX_REROUTED) -> dict:
    """Hidden states [..., H] against a reference: each token's max |diff| relative to the
    largest |ref|. ok when at most `max_fraction` of the tokens exceed `tol`."""
    a = np.asarray(out, np.float32).reshape(-1, out.shape[-1])
    b = np.asarray(ref, np.float32).reshape(-1, ref.shape[-1])
    row = np.abs(a - b).max(axis=1) / max(float(np.abs(b).max()), 1e-30)
    frac = float(np.mean(row > tol))
    return {"max_rel_err": float(row.max()), "tokens_over_tol": frac, "ok": frac <= max_fraction}


def loss_fn(model, params, tokens, labels):
    logits, _ = model.apply(params, tokens)
    return jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


def synthetic_batch(rng, cfg: SwitchConfig, batch, seq):
    """Random tokens and labels (every token valid: MoE sparsity is in the routing)."""
    tokens = rng.integers(0, cfg.vocab, size=(batch, seq)).astype(np.int32)
    labels = rng.integers(0, cfg.num_labels, size=batch).astype(np.int32)
    return jnp.asarray(tokens), jnp.asarray(labels)
