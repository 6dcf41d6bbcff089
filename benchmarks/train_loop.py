"""BERT b32 fine-tuning as a plain training loop: wall time per step of a donated, chained
loop (each step's parameters and optimizer state feed the next), after warm-up.

    python -m benchmarks.train_loop                      # dense dense_cudnn pit pit_unspecified
    python -m benchmarks.train_loop pit_unspecified dense --rounds 3 --steps 100
    python -m benchmarks.train_loop --small              # tiny model (CPU smoke run)
    python -m benchmarks.train_loop pit_unspecified --via aot   # how the suite calls it

--via says how the step is called: `jit` (a jitted function, as users write), `aot` (the
executable of `jit(...).lower(...).compile()`, as bench_workloads compiles every variant
once for its memory plan), `suite` (that executable through `ChainedStep` and
`bench_workloads.time_round`, as `Suite.run_interleaved` times a training row: three
waited-for calls, then >= 20 back to back; its enqueue column is then the wall time). With
`--interleave` every variant is compiled first and the rounds time them in turns, as
the suite does; without it, one variant after another.

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

from benchmarks.bench_workloads import BERT_VARIANTS as IMPLS, _train_step, bert_models, time_round  # noqa: E402
from benchmarks.kernel_profile import _bert_batch  # noqa: E402


VIA = ("jit", "aot", "suite")


class Loop:
    """One variant's training loop: `steps(n)` runs n chained steps (parameters and
    optimizer state donated and carried) and returns (enqueue_ms, wall_ms) a step."""

    def __init__(self, impl, *, small=False, via="jit"):
        from pit_models import bert, common as mcommon

        if impl not in IMPLS:
            raise ValueError(f"train_loop: variant must be one of {IMPLS}, got {impl!r}")
        if via not in VIA:
            raise ValueError(f"train_loop: via must be one of {VIA}, got {via!r}")
        cfg, batch, attn, params = _bert_batch(small)
        tx = optax.adamw(1e-4)
        state = jax.jit(tx.init)(params)
        step = jax.jit(_train_step(functools.partial(bert.loss_fn, bert_models(cfg, attn)[impl]), tx),
                       donate_argnums=(0, 1))
        if via != "jit":
            step = step.lower(params, state, *batch).compile()
        self.via = via
        self.call = mcommon.ChainedStep(step, (params, state, *batch))
        self.out = None

    def steps(self, n):
        if self.via == "suite":  # Suite.run_interleaved's timing of one round
            ms = time_round(self._call)
            return ms, ms
        t0 = time.perf_counter()
        for _ in range(n):
            self._call()
        t1 = time.perf_counter()
        jax.block_until_ready(self.out)
        t2 = time.perf_counter()
        return (t1 - t0) * 1e3 / n, (t2 - t0) * 1e3 / n

    def _call(self):
        self.out = self.call()
        return self.out

    def loss(self):
        return float(self.out[2])


def run(impls, *, small=False, warmup=20, steps=100, rounds=3, via="jit", interleave=False):
    """{impl: ([(enqueue_ms, wall_ms) per step, per round], final loss)}. One variant after
    another (each freed before the next compiles), or with `interleave` all compiled first
    and timed in turns within each round (as bench_workloads' Suite.run_interleaved does).
    With via="suite" a round's step count is the suite's own (`bench_workloads.time_round`),
    not `steps`."""
    res, losses, live = {}, {}, {}
    for impl in impls:
        loop = Loop(impl, small=small, via=via)
        if warmup > 0:
            loop.steps(warmup)
        if interleave:
            live[impl] = loop
        else:
            res[impl] = [loop.steps(steps) for _ in range(rounds)]
            losses[impl] = loop.loss()
        del loop
    for _ in range(rounds if interleave else 0):
        for impl, loop in live.items():
            res.setdefault(impl, []).append(loop.steps(steps))
    losses.update({impl: loop.loss() for impl, loop in live.items()})
    return {impl: (res[impl], losses[impl]) for impl in impls}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("impls", nargs="*", default=list(IMPLS), help=f"variants, of {IMPLS}")
    ap.add_argument("--small", action="store_true", help="tiny model, batch 4 x 32")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--via", choices=VIA, default="jit", help="how the step is called (see above)")
    ap.add_argument("--interleave", action="store_true",
                    help="compile every variant first, then time them in turns each round (as the suite does)")
    args = ap.parse_args(argv)
    bad = [i for i in args.impls if i not in IMPLS]
    if bad:
        ap.error(f"variants must be of {IMPLS}, got {bad}")
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        ap.error(f"--steps and --rounds must be >= 1 and --warmup >= 0, got {args.steps}, {args.rounds}, {args.warmup}")
    print(f"BERT {'tiny' if args.small else 'base'} fine-tuning loop on {jax.devices()[0].device_kind}, "
          f"jax {jax.__version__}, called via {args.via}" + (", interleaved" if args.interleave else ""), flush=True)
    out = run(args.impls, small=args.small, warmup=args.warmup, steps=args.steps, rounds=args.rounds,
              via=args.via, interleave=args.interleave)
    for impl, (res, loss) in out.items():
        walls = [w for _, w in res]
        print(f"{impl:16s} enqueue / wall ms a step: " + ", ".join(f"{e:.2f}/{w:.2f}" for e, w in res)
              + f"  (median wall {float(np.median(walls)):.3f})  loss {loss:.6f}", flush=True)
    return out


if __name__ == "__main__":
    main()
