"""The short attention kernels' launch order, timed: `pit_jax.varlen_attention`'s forward
and forward + backward (device time of the kernels a call) over several GLUE-like batches
and a few controls, in one process. Run it twice, with PIT_JAX_ATTN_LONGEST_FIRST=0 (grid
order) and without (the sequences longest first), alternating, to A/B the order
(docs/notes/varlen_attention.md; benchmarks/results/attention_short_longest_first_ab_*).

    python -m benchmarks.attention_order_ab              # on the GPU
    python -m benchmarks.attention_order_ab --small      # tiny batches (CPU smoke run)
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import pit_jax  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.bench_attention import with_backward  # noqa: E402
from pit_models import common as mc  # noqa: E402


def glue(seed, batch):
    return mc.sample_lengths(np.random.default_rng(seed), batch, **{**mc.GLUE, "max_len": 128})


def cases(small):
    """(name, lengths, seq, heads, head_dim, causal, padding)."""
    if small:
        return [("glue seed 0", glue(0, 4), 128, 2, 64, False, "right")]
    out = [(f"glue seed {s}", glue(s, 32), 128, 12, 64, False, "right") for s in range(6)]
    return out + [
        ("decoder seed 0 (32 heads)", glue(0, 32), 128, 32, 64, True, "left"),
        ("glue seed 0 head 128", glue(0, 32), 128, 12, 128, False, "right"),
        ("glue b40 seed 7 (two words)", glue(7, 40), 128, 12, 64, False, "right"),
        ("full 128 (overhead)", np.full(32, 128, np.int32), 128, 12, 64, False, "right"),
        ("full 128 b8 (one wave, off)", np.full(8, 128, np.int32), 128, 12, 64, False, "right"),
    ]


def time_case(lengths, s, h, d, causal, padding, small):
    b = len(lengths)
    ln = jnp.asarray(lengths, jnp.int32)
    sets = []
    for i in range(2 if small else 4):
        ks = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(1), i), 4)
        q, k, v, do = (common.random_normal(kk, (b, s, h, d), jnp.bfloat16) for kk in ks)
        sets.append((q, k, v, ln, do))

    def attention(q, k, v, ln):
        return pit_jax.varlen_attention(q, k, v, ln, causal=causal, padding=padding)

    kw = dict(reps=3, device_calls=0) if small else dict(reps=7, device_calls=20)
    return [common.time_op(f, sets, **kw)
            for f in (lambda q, k, v, ln, do: attention(q, k, v, ln), with_backward(attention))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny batches (CPU smoke run)")
    args = ap.parse_args(argv)
    order = os.environ.get("PIT_JAX_ATTN_LONGEST_FIRST", "") or "1"
    print(f"{common.device_info()['device']}, PIT_JAX_ATTN_LONGEST_FIRST={order}")
    rows = []
    for name, lengths, s, h, d, causal, padding in cases(args.small):
        f, fb = time_case(lengths, s, h, d, causal, padding, args.small)
        key = "device_ms" if "device_ms" in f else "median_ms"  # CPU: no device trace
        rows.append((name, f[key], fb[key]))
        print(f"{name:28s} mean {np.mean(lengths):5.1f} max {max(lengths):3d}  fwd {f[key] * 1e3:7.2f} us"
              f"  fwd+bwd {fb[key] * 1e3:7.2f} us  (wall {f['median_ms'] * 1e3:6.1f} / {fb['median_ms'] * 1e3:6.1f})",
              flush=True)
    return rows


if __name__ == "__main__":
    main()
