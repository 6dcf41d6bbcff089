"""A list-scheduling model of the long attention backward's launch (varlen_attention_long.cu):
how long the grid takes when every CTA runs for a cost proportional to the products it does,
placed on the first free slot in launch order. It predicts what a block order or a split of
the work does to the span before a kernel is changed (docs/notes/varlen_attention.md).

    python -m benchmarks.attention_launch_model            # the bench's documents

A dK / dV block of 128 keys costs 4 products (times the query heads of its kv group) per
query token it walks, a dQ block of 128 queries 3 per key token; causal blocks walk the
queries from their keys on (dK / dV) or the keys up to their queries (dQ). The grid follows
the kernel: causal (heads, sequences, 2 x blocks), bidirectional (heads, 2 x blocks,
sequences) with the sequences longest first (`launch_order`), launched heads fastest, the
dK / dV half first, blocks numbered from the sequence's last (`Block`), or with
`dkv_from_first` the dK / dV blocks from its first. Costs are in units of 64 tokens times a
product; the model ignores staging, barriers and the forward's tail, so compare spans, not
times.
"""

from __future__ import annotations

import argparse
import heapq
from typing import List, Sequence

import numpy as np


def span(costs: Sequence[float], slots: int) -> float:
    """When the last CTA ends, each started on the first free slot in launch order."""
    free = [0.0] * slots
    end = 0.0
    for c in costs:
        t = heapq.heappop(free) + c
        heapq.heappush(free, t)
        end = max(end, t)
    return end


def backward_costs(lengths: Sequence[int], heads: int, kv_heads: int, causal: bool, dkv_from_first: bool,
                   block: int = 128) -> List[float]:
    """Every CTA's cost in launch order (zero for blocks past a sequence's tokens)."""
    count = -(-max(lengths) // block)
    group = heads // kv_heads
    out = []

    def blocks(z, n):
        dkv, index = z < count, z % count
        first = block * (index if dkv and dkv_from_first else count - 1 - index)
        for h in range(heads):
            if first >= n or (dkv and h >= kv_heads):
                out.append(0.0)
                continue
            walk = n if not causal else (n - first if dkv else min(n, first + block))
            out.append((4 * group if dkv else 3) * walk / 64)

    if causal:  # grid (heads, sequences, blocks)
        for z in range(2 * count):
            for n in lengths:
                blocks(z, n)
    else:  # bidirectional: launch_order's (heads, blocks, sequences), the longest sequence first
        for n in sorted(lengths, reverse=True):
            for z in range(2 * count):
                blocks(z, n)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", type=int, default=264, help="CTAs resident at once (H200, head_dim 64: 2 x 132)")
    args = ap.parse_args(argv)
    from pit_models import common as mc  # examples/ on the path, as the benchmarks run

    rng = np.random.default_rng(0)  # bench_attention's draws: GLUE-like lengths first, then the documents
    mc.sample_lengths(rng, 32, **{**mc.GLUE, "max_len": 128})
    docs = [int(n) for n in mc.sample_lengths(rng, 8, **{**mc.LONG_DOC, "max_len": 2048})]
    print(f"documents {sorted(docs, reverse=True)}")
    for name, heads, kv_heads, causal, slots in (("bidirectional", 12, 12, False, args.slots),
                                                 ("causal", 12, 12, True, args.slots),
                                                 ("causal, 32 heads on 8 kv heads", 32, 8, True, args.slots // 2)):
        for from_first in (False, True):
            costs = backward_costs(docs, heads, kv_heads, causal, from_first)
            print(f"{name:32s} dK/dV from the first keys: {str(from_first):5s}  span {span(costs, slots):7.1f}"
                  f"  perfect packing {sum(costs) / slots:7.1f}")


if __name__ == "__main__":
    main()
