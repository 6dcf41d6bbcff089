"""pit_jax demo: sparsity indices built on the device inside jit, a sparse product, and
a small MLP trained with pit_jax's sparse layers.

Runs on the GPU where JAX sees one, else on the CPU. Synthetic data, no downloads.
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import pit_jax


def main():
    dev = jax.devices()[0]
    print(f"pit_jax {pit_jax.__version__} on {dev.platform.upper()} ({dev.device_kind}), jax {jax.__version__}")
    key = jax.random.PRNGKey(0)

    # Token rows: a batch of 8 sequences of up to 512 tokens, the rest padding.
    lengths = jax.random.randint(key, (8,), 32, 512)
    h = jax.random.normal(key, (8, 512, 1024), jnp.bfloat16)
    h = h * (jnp.arange(512)[None, :, None] < lengths[:, None, None])
    rows = jax.jit(lambda x: pit_jax.index(x, "row"))(h)
    print(f"row index over {h.shape}: {np.asarray(rows.count)} live rows per sequence "
          f"(lengths {np.asarray(lengths)})")

    # ReLU activations with 32x1 micro-tiles, grouped per block of 32 rows (K-axis use).
    a = jax.nn.relu(jax.random.normal(key, (1024, 4096)) - 1.5)
    f = jax.jit(lambda x: pit_jax.index(x, (32, 1), group_by="row"))
    idx = jax.block_until_ready(f(a))
    t0 = time.perf_counter()
    for _ in range(10):
        idx = f(a)
    jax.block_until_ready(idx)
    ms = (time.perf_counter() - t0) / 10 * 1e3
    live = int(idx.count) / idx.num_tiles
    print(f"32x1 index over relu activations {a.shape}: {live:.1%} of {idx.num_tiles} micro-tiles live, "
          f"{ms:.3f} ms per build")
    print(f"  first row block lists {int(idx.row_count[0])} live columns, e.g. {np.asarray(idx.row_tiles[0, :8])}")

    # The product those activations feed: (a * mask) @ w == a @ w, computed on live tiles only.
    w = jax.random.normal(key, (4096, 512))
    y = jax.jit(lambda a, b: pit_jax.sparse_dense(a, b, axis="k", micro_tile=(32, 1)))(a, w)
    err = float(jnp.max(jnp.abs(y - jnp.matmul(a, w, precision="highest"))) / jnp.max(jnp.abs(y)))
    print(f"sparse_dense (K axis) vs dense: max relative difference {err:.1e}")

    print("training a sparse MLP (padding rows skipped on the M axis, ReLU zeros on the K axis):")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sparse_mlp

    steps = 300 if dev.platform == "gpu" else 150
    losses, dt = sparse_mlp.train(steps=steps, log_every=50)
    print(f"loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f} in {steps} steps ({dt:.1f} s)")


if __name__ == "__main__":
    main()
