"""Train a small MLP with pit_jax's sparse layers (synthetic data, no downloads).

- Layer 1 reads a batch in which a quarter of the rows are padding (all zeros): it
  skips them on the M axis (token rows).
- Layers 2 and 3 read ReLU outputs: they skip the dead activations on the K axis
  (32x1 micro-tiles: for each block of 32 rows, only the live hidden units).
Each layer builds its index from its input inside the jitted step; the backward reuses
it. Runs on the GPU where JAX sees one, else on the CPU.

    python examples/sparse_mlp.py [--steps 300] [--batch 512] [--hidden 512]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

import pit_jax
from pit_jax.flax import SparseDense


class SparseMLP(nn.Module):
    hidden: int
    out: int

    @nn.compact
    def __call__(self, x):
        h = nn.relu(SparseDense(self.hidden, axis="m", name="fc1")(x))
        h = nn.relu(SparseDense(self.hidden, axis="k", name="fc2")(h))
        return SparseDense(self.out, axis="k", name="fc3")(h)


def make_data(key, batch, dim, out):
    """A random teacher network; inputs with 25% padding rows (zeros)."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    teacher = (jax.random.normal(k1, (dim, 64)) / dim**0.5, jax.random.normal(k2, (64, out)) / 8.0)

    def sample(step):
        kx, km = jax.random.split(jax.random.fold_in(k3, step))
        x = jax.random.normal(kx, (batch, dim))
        live = jax.random.uniform(km, (batch, 1)) < 0.75
        x = jnp.where(live, x, 0.0)
        y = jnp.tanh(x @ teacher[0]) @ teacher[1]
        return x, y, live

    return sample


def train(steps=300, batch=512, dim=128, hidden=512, out=16, log_every=50, seed=0):
    model = SparseMLP(hidden, out)
    sample = make_data(jax.random.PRNGKey(seed), batch, dim, out)
    x0, _, _ = sample(0)
    params = model.init(jax.random.PRNGKey(seed + 1), x0)
    tx = optax.adam(1e-3)
    opt_state = tx.init(params)

    def loss_fn(p, x, y, live):
        pred = model.apply(p, x)
        err = jnp.where(live, (pred - y) ** 2, 0.0)  # padding rows do not count
        return err.sum() / (live.sum() * y.shape[-1])

    @jax.jit
    def step(p, s, x, y, live):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y, live)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    @jax.jit
    def hidden_sparsity(p, x):
        h1 = nn.relu(x @ p["params"]["fc1"]["kernel"] + p["params"]["fc1"]["bias"])
        return jnp.mean(h1 == 0)

    losses = []
    t0 = time.perf_counter()
    for i in range(steps):
        x, y, live = sample(i)
        params, opt_state, loss = step(params, opt_state, x, y, live)
        losses.append(float(loss))
        if log_every and (i % log_every == 0 or i == steps - 1):
            print(f"  step {i:4d}  loss {losses[-1]:.4f}  hidden zeros {float(hidden_sparsity(params, x)):.0%}")
    dt = time.perf_counter() - t0
    return losses, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=512)
    args = ap.parse_args()
    dev = jax.devices()[0]
    print(f"sparse MLP on {dev.platform.upper()} ({dev.device_kind}), pit_jax {pit_jax.__version__}")
    losses, dt = train(args.steps, args.batch, hidden=args.hidden)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    print(f"loss {first:.4f} -> {last:.4f} in {args.steps} steps ({dt:.1f} s)")
    if not last < first:
        raise SystemExit("loss did not go down")


if __name__ == "__main__":
    main()
