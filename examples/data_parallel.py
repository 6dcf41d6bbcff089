"""Data-parallel training of a small sparse MoE block with plain `jax.jit` (synthetic data).

The batch [B, T, D] is sharded over B across every device, the parameters replicated.
The layers keep B as a batch dim (`batch_dims=1`), so each pit_jax op runs on its own
device's sequences: each builds its index (padding rows, routing) for those, and the
weights' gradients are summed across the devices by the ops' partitioning rule. The
compiled step holds no all-gather of pit_jax's operands. Runs on all GPUs JAX sees, else
on 4 CPU host devices (set before JAX starts).

    python examples/data_parallel.py [--steps 100] [--batch 16]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # pit_jax when not installed

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from pit_jax.flax import MoE, SparseDense  # noqa: E402


class Block(nn.Module):
    """Padding-skipping projection (M axis), then a dropless top-2 MoE FFN, per sequence."""

    dim: int
    experts: int = 8

    @nn.compact
    def __call__(self, x):
        h = SparseDense(self.dim, axis="m", activation="gelu", batch_dims=1, name="proj")(x)
        return h + MoE(num_experts=self.experts, hidden_dim=2 * self.dim, top_k=2, batch_dims=1, name="moe")(h)


def devices():
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    return gpus if gpus else jax.devices("cpu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (a multiple of the device count)")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--dim", type=int, default=64)
    args = ap.parse_args(argv)

    devs = devices()
    if args.batch % len(devs):
        raise SystemExit(f"--batch {args.batch} must be a multiple of the {len(devs)} devices")
    mesh = jax.sharding.Mesh(np.array(devs), ("data",))
    batch_sharding, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((args.dim, args.dim)).astype(np.float32) / args.dim**0.5

    def sample():  # sequences with random valid lengths; padding rows are zeros
        x = rng.standard_normal((args.batch, args.seq, args.dim)).astype(np.float32)
        lengths = rng.integers(args.seq // 4, args.seq + 1, size=args.batch)
        x *= (np.arange(args.seq)[None, :, None] < lengths[:, None, None])
        return jax.device_put(x, batch_sharding), jax.device_put(np.tanh(x @ teacher), batch_sharding)

    model, tx = Block(args.dim), optax.adam(3e-3)
    x0, _ = sample()
    params = jax.device_put(model.init(jax.random.PRNGKey(0), x0), replicated)
    opt_state = jax.device_put(tx.init(params), replicated)

    def loss_fn(p, x, y):
        out, state = model.apply(p, x, mutable=["losses"])
        return jnp.mean((out - y) ** 2) + sum(jax.tree.leaves(state["losses"]))

    @jax.jit
    def step(p, s, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    x, y = sample()
    hlo = step.lower(params, opt_state, x, y).compile().as_text()
    lines = [ln for ln in hlo.splitlines() if " all-gather(" in ln]
    gathers = sum("pit_" in ln or "ffi_call" in ln for ln in lines)  # of pit_jax's ops (op_name metadata)
    print(f"{len(devs)} {devs[0].platform} devices; all-gathers in the compiled step: {gathers} of pit_jax's "
          f"operands, {len(lines) - gathers} of XLA's own ops (e.g. the router's top_k on the CPU)")
    losses = []
    for i in range(args.steps):
        params, opt_state, loss = step(params, opt_state, *sample())
        losses.append(float(loss))
        if i % max(1, args.steps // 5) == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {losses[-1]:.4f}")
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in {args.steps} steps")
    return {"losses": losses, "devices": len(devs), "gathers": gathers}


if __name__ == "__main__":
    main()
