"""Train a small Switch-style transformer block with a dropless MoE FFN (synthetic data).

    tokens -> embed + positions -> x + Attention(LN(x)) -> x + MoE(LN(x)) -> LN -> logits

The MoE FFN is `pit_jax.flax.MoE`: a router picks top-k of E experts per token, the
routing index is built on the device inside the jitted step, and every token is
processed by its experts (no capacity, nothing dropped). The training loss adds the
layer's auxiliary losses (load balancing + router z-loss) from the "losses" collection.

Task: reverse a random sequence and map every token through a fixed random permutation,
target[i] = perm[tokens[S - 1 - i]]; attention must fetch the mirrored token and the
FFN must learn the permutation. Runs on the GPU where JAX sees one, else on the CPU.

    python examples/moe_transformer.py [--steps 150] [--experts 8] [--top-k 2]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

import pit_jax
from pit_jax.flax import MoE


class MoEBlock(nn.Module):
    """One pre-LayerNorm transformer block whose FFN is a mixture of experts."""

    vocab: int
    seq_len: int
    dim: int
    heads: int
    experts: int
    top_k: int
    hidden: int

    @nn.compact
    def __call__(self, tokens, *, deterministic=True):
        x = nn.Embed(self.vocab, self.dim, name="embed")(tokens)
        x = x + self.param("pos", nn.initializers.normal(0.02), (self.seq_len, self.dim))
        h = nn.LayerNorm(name="ln_attn")(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads, name="attn")(h, h)
        h = nn.LayerNorm(name="ln_moe")(x)
        x = x + MoE(
            num_experts=self.experts, hidden_dim=self.hidden, top_k=self.top_k, activation="gelu",
            router_jitter=0.01, name="moe",
        )(h, deterministic=deterministic)
        return nn.Dense(self.vocab, name="head")(nn.LayerNorm(name="ln_out")(x))


def make_data(seed, batch, seq_len, vocab):
    perm = jnp.asarray(np.random.default_rng(seed).permutation(vocab))
    key = jax.random.PRNGKey(seed)

    def sample(step):
        tokens = jax.random.randint(jax.random.fold_in(key, step), (batch, seq_len), 0, vocab)
        return tokens, perm[tokens[:, ::-1]]

    return sample


def train(steps=150, experts=8, top_k=2, batch=32, seq_len=12, vocab=32, dim=64, heads=4, hidden=64,
          lr=3e-3, log_every=25, seed=0):
    model = MoEBlock(vocab, seq_len, dim, heads, experts, top_k, hidden)
    sample = make_data(seed, batch, seq_len, vocab)
    params = jax.jit(model.init)(jax.random.PRNGKey(seed + 1), sample(0)[0])["params"]
    tx = optax.adamw(lr)
    opt_state = tx.init(params)

    def loss_fn(p, tokens, targets, key):
        logits, state = model.apply(
            {"params": p}, tokens, deterministic=False, rngs={"dropout": key}, mutable=["losses", "intermediates"]
        )
        task = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
        aux = sum(jax.tree_util.tree_leaves(state["losses"]))
        counts = state["intermediates"]["moe"]["expert_counts"][0]
        return task + aux, (task, aux, counts)

    @jax.jit
    def step(p, s, tokens, targets, key):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, tokens, targets, key)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, metrics

    losses = []
    t0 = time.perf_counter()
    for i in range(steps):
        tokens, targets = sample(i)
        params, opt_state, (task, aux, counts) = step(params, opt_state, tokens, targets, jax.random.PRNGKey(i))
        losses.append(float(task))
        if log_every and (i % log_every == 0 or i == steps - 1):
            share = np.asarray(counts) / max(int(counts.sum()), 1)
            print(f"  step {i:4d}  loss {losses[-1]:.4f}  aux {float(aux):.4f}  "
                  f"expert load min/max {share.min():.0%}/{share.max():.0%}", flush=True)
    return losses, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    dev = jax.devices()[0]
    print(f"MoE transformer block on {dev.platform.upper()} ({dev.device_kind}), {args.experts} experts, "
          f"top-{args.top_k}, pit_jax {pit_jax.__version__}")
    losses, dt = train(args.steps, args.experts, args.top_k, batch=args.batch)
    n = max(1, min(10, len(losses) // 2))
    first, last = sum(losses[:n]) / n, sum(losses[-n:]) / n
    print(f"loss {first:.4f} -> {last:.4f} in {args.steps} steps ({dt:.1f} s)")
    if not last < first:
        raise SystemExit("loss did not go down")


if __name__ == "__main__":
    main()
