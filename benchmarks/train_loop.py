"""BERT b32 fine-tuning as a plain training loop: wall time per step of a donated, chained
loop (each step's parameters and optimizer state feed the next), after warm-up.

    python -m benchmarks.train_loop                      # dense dense_cudnn pit pit_unspecified
    python -m benchmarks.train_loop pit_unspecified dense --rounds 3 --steps 100
    python -m benchmarks.train_loop --small              # tiny model (CPU smoke run)

The variants are bench_workloads' BERT training names:
  dense            the dense twin: nn.Dense, XLA attention over the padded batch
  dense_cudnn      the best JAX alternative: nn.Dense + cuDNN attention with sequence
                   lengths (XLA's where cuDNN does not take the shapes)
  pit              pit_jax: M-axis products, live-row layer norms, pit_jax.varlen_attention
  pit_unspecified  the same with dead_rows="unspecified"
Run one process per variant when comparing (a fresh XLA client each: the earlier
variants' buffers and compiled programs do not share the device with the later ones).
Prints enqueue / wall ms a step per round and the final loss.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import jax
import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from benchmarks.bench_workloads import BERT_VARIANTS as IMPLS, _train_step, bert_models  # noqa: E402
from benchmarks.kernel_profile import _bert_batch  # noqa: E402


def run(impl, *, small=False, warmup=20, steps=100, rounds=3):
    """[(enqueue_ms, wall_ms) per step, per round], final loss."""
    from pit_models import bert

    if impl not in IMPLS:
        raise ValueError(f"train_loop: variant must be one of {IMPLS}, got {impl!r}")
    cfg, (tokens, lengths, labels), attn, params = _bert_batch(small)
    tx = optax.adamw(1e-4)
    state = jax.jit(tx.init)(params)
    step = jax.jit(_train_step(functools.partial(bert.loss_fn, bert_models(cfg, attn)[impl]), tx),
                   donate_argnums=(0, 1))
    for _ in range(warmup):
        params, state, loss = step(params, state, tokens, lengths, labels)
    jax.block_until_ready(loss)
    res = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            params, state, loss = step(params, state, tokens, lengths, labels)
        t1 = time.perf_counter()
        jax.block_until_ready(loss)
        t2 = time.perf_counter()
        res.append(((t1 - t0) * 1e3 / steps, (t2 - t0) * 1e3 / steps))
    return res, float(loss)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("impls", nargs="*", default=list(IMPLS), help=f"variants, of {IMPLS}")
    ap.add_argument("--small", action="store_true", help="tiny model, batch 4 x 32")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    bad = [i for i in args.impls if i not in IMPLS]
    if bad:
        ap.error(f"variants must be of {IMPLS}, got {bad}")
    out = {}
    print(f"BERT {'tiny' if args.small else 'base'} fine-tuning loop on {jax.devices()[0].device_kind}, "
          f"jax {jax.__version__}", flush=True)
    for impl in args.impls:
        res, loss = run(impl, small=args.small, warmup=args.warmup, steps=args.steps, rounds=args.rounds)
        out[impl] = (res, loss)
        walls = [w for _, w in res]
        print(f"{impl:16s} enqueue / wall ms a step: " + ", ".join(f"{e:.2f}/{w:.2f}" for e, w in res)
              + f"  (median wall {float(np.median(walls)):.3f})  loss {loss:.6f}", flush=True)
    return out


if __name__ == "__main__":
    main()
