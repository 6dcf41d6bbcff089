"""`Plan`: the STile the optimizer chose for one product, as a static, hashable value.

A plan is data, not a function: it names the PIT axis and micro-tile (or dense), the
shapes and dtype it was costed for, its expected time and the runner-up. Pass it to
`pit_jax.sparse_dense(..., plan=p)` or a `SparseDense` layer; it can be a `jax.jit`
static argument (frozen dataclass of tuples, strings and floats).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

MicroTile = Optional[Tuple[int, Optional[int]]]


def describe(axis: Optional[str], micro_tile: MicroTile) -> str:
    """'dense', 'm rows' (whole rows), 'k 32x1', 'w 32x64'."""
    if axis is None:
        return "dense"
    h, w = micro_tile
    if axis == "m" and w is None:
        return "m rows" if h == 1 else f"m {h}-row blocks"
    return f"{axis} {h}x{w}"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One STile the optimizer costed: `axis` None means the dense product `x @ w`."""

    axis: Optional[str]
    micro_tile: MicroTile
    expected_ms: float
    density: float  # fraction of this micro-tile's tiles that are live (1.0 for dense)

    @property
    def is_dense(self) -> bool:
        return self.axis is None

    def __str__(self) -> str:
        live = "" if self.is_dense else f", {self.density:.1%} live"
        return f"{describe(self.axis, self.micro_tile)} ({self.expected_ms:.4g} ms{live})"


@dataclasses.dataclass(frozen=True)
class Plan:
    """The chosen STile for `x @ w` with one sparse operand, and what it expects.

    Fields:
      axis: "m" (token rows of x), "k" (micro-tiles of x along K), "w" (weight blocks),
        or None for the dense product.
      micro_tile: (h, w) on the sparse operand; (h, None) = whole rows (axis "m");
        None for dense.
      operand: "x" or "w", the operand the sample described.
      dtype: the input dtype costed ("bfloat16", "float16", "float32"); `tf32`: float32
        products may use TF32.
      x_shape, w_shape: the shapes the plan was made for ([..., M, K], [..., K, N]).
      expected_ms: estimated time of the chosen STile (index construction included
        when `include_index`); dense_ms: the dense product's estimate.
      runner_up: the best candidate not chosen (None when there was only one).
      candidates: every candidate costed, fastest expected first (dense is chosen
        over a sparse STile that is not faster by the planner's `dense_margin`).
      database: which database (or heuristic) produced the estimates, and why.
    """

    axis: Optional[str]
    micro_tile: MicroTile
    operand: str
    dtype: str
    tf32: bool
    x_shape: Tuple[int, ...]
    w_shape: Tuple[int, ...]
    expected_ms: float
    dense_ms: float
    density: float
    runner_up: Optional[Candidate]
    candidates: Tuple[Candidate, ...]
    database: str
    include_index: bool = True

    @property
    def is_dense(self) -> bool:
        return self.axis is None

    @property
    def speedup(self) -> float:
        """Expected speed-up over the dense product (1.0 for a dense plan)."""
        return self.dense_ms / self.expected_ms if self.expected_ms > 0 else 1.0

    @property
    def stile(self) -> str:
        return describe(self.axis, self.micro_tile)

    def __str__(self) -> str:
        x = "x".join(map(str, self.x_shape))
        w = "x".join(map(str, self.w_shape))
        dt = self.dtype + (" (tf32)" if self.tf32 else "")
        chosen = self.stile if self.is_dense else f"{self.stile} on {'w' if self.axis == 'w' else 'x'}, {self.density:.1%} live"
        lines = [
            f"Plan: {chosen}",
            f"  product  x[{x}] @ w[{w}], {dt}",
            f"  expected {self.expected_ms:.4g} ms (dense {self.dense_ms:.4g} ms, x{self.speedup:.2f})"
            + ("" if self.include_index or self.is_dense else ", index not included"),
            f"  runner-up {self.runner_up}" if self.runner_up is not None else "  runner-up none",
            f"  database {self.database}",
        ]
        return "\n".join(lines)
