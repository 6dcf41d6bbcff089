"""The cost model: cover a sparsity sample with each candidate micro-tile, count the
live micro-tiles and the compute tiles they fill, and map that to time.

Everything runs on the host in vectorized NumPy. The sample's non-zero mask is built
once (from the raw bits: +0 and -0 are dead, like `pit_jax.index`); coarser micro-tiles
are OR-reductions of it, eight bool bytes at a time (as uint64 words), cached per row
height, so a 4096 x 4096 sample costs a few passes over its bytes.

Per variant (shapes: x [B, M, K] or w [K, N]; compute tile (BM, BN, BK)):
- dense:  every output tile, MACs = M*K*N.
- m (h, K):  live rows r = h * live row blocks; ceil(r / BM) gathered compute tiles
  per BN output columns, each K deep.
- k (h, bk): per block of h rows, L live micro-tiles -> a reduction ceil(L*bk / BK)*BK
  deep, for each of ceil(N / BN) output tiles of ceil(h / BM)*BM rows.
- w (bk, bn): per column block, L live row blocks -> ceil(L*bk / BK)*BK deep, for each
  of ceil(M / BM) output tiles of ceil(bn / BN)*BN columns.
The filled MACs use a makespan: tiles run `parallel_slots` at a time, so a product is
never cheaper than its largest tile times the slots (load imbalance, few tiles).
Product time = fixed + per-GMAC * filled GMACs + per-GB * bytes moved; index time =
fixed + per-GB * bytes of the sparse operand read + per-GB * bytes of lists written.
The parameters come from the database (profiled per variant) or the heuristic.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple

import numpy as np

from pit_jax.optimizer.database import Variant

GIGA = 1e9

# dtype name -> unsigned view and the mask that drops the sign bit; NaN iff magnitude > inf
_FLOAT_BITS = {
    "bfloat16": (np.uint16, 0x7FFF, 0x7F80),
    "float16": (np.uint16, 0x7FFF, 0x7C00),
}


def _to_numpy(sample, what: str) -> np.ndarray:
    if isinstance(sample, np.ndarray):
        return sample
    import jax

    if isinstance(sample, jax.core.Tracer):
        raise TypeError(
            f"{what} must be a concrete array (a NumPy array or a jax.Array outside jit), got a traced value; "
            f"make the plan outside jit and pass it in (e.g. as a static argument)"
        )
    if not hasattr(sample, "__array__") and not isinstance(sample, (list, tuple)):
        raise TypeError(f"{what} must be an array (NumPy, jax.Array) or a bool mask, got {type(sample).__name__}")
    return np.asarray(sample)


def nonzero_mask(sample, what: str = "sample") -> np.ndarray:
    """bool mask of the elements `pit_jax.index` would count as non-zero; checks NaN."""
    a = _to_numpy(sample, what)
    if a.ndim < 2:
        raise ValueError(f"{what} must have rank >= 2 ([..., rows, cols]), got shape {tuple(a.shape)}")
    if a.size == 0:
        raise ValueError(f"{what} is empty (shape {tuple(a.shape)}); a plan needs at least one element")
    if a.dtype == np.bool_:
        return np.ascontiguousarray(a)
    name = a.dtype.name
    if name in ("float32", "float64"):
        if np.isnan(a.max()):  # max propagates NaN: one pass, no temporary
            raise ValueError(f"{what} contains NaN; a sparsity sample must be finite (NaN would count as live)")
        return a != 0  # -0.0 == 0: dead, as in pit_jax.index
    if name in _FLOAT_BITS:  # 16-bit floats: NumPy has no fast arithmetic for bfloat16, use the bits
        utype, mag_mask, inf_bits = _FLOAT_BITS[name]
        mag = np.ascontiguousarray(a).view(utype) & utype(mag_mask)
        if mag.max() > inf_bits:
            raise ValueError(f"{what} contains NaN; a sparsity sample must be finite (NaN would count as live)")
        return mag != 0
    if np.issubdtype(a.dtype, np.integer):
        return a != 0
    raise TypeError(f"{what} must be a float, integer or bool array, got dtype {a.dtype}")


def _or_rows(a: np.ndarray, h: int) -> np.ndarray:
    """[B, R, C] bool -> [B, ceil(R/h), C]: any over each block of h rows."""
    b, r, c = a.shape
    if h == 1:
        return a
    tr = -(-r // h)
    if tr * h != r:
        a = np.concatenate([a, np.zeros((b, tr * h - r, c), np.bool_)], axis=1)
    if c % 8 == 0:
        words = a.view(np.uint64).reshape(b, tr, h, c // 8)
        return np.bitwise_or.reduce(words, axis=2).view(np.bool_).reshape(b, tr, c)
    return a.reshape(b, tr, h, c).any(axis=2)


def _or_cols(a: np.ndarray, w: int) -> np.ndarray:
    """[B, T, C] bool -> [B, T, ceil(C/w)]: any over each block of w columns."""
    b, t, c = a.shape
    if w == 1:
        return a
    tc = -(-c // w)
    if c % w == 0 and w % 8 == 0:
        words = a.view(np.uint64).reshape(b, t, tc, w // 8)
        return np.bitwise_or.reduce(words, axis=3) != 0
    if tc * w != c:
        a = np.concatenate([a, np.zeros((b, t, tc * w - c), np.bool_)], axis=2)
    return a.reshape(b, t, tc, w).any(axis=3)


class Coverage:
    """Live micro-tiles of one sample ([B, R, C] non-zero mask) for any micro-tile, cached."""

    def __init__(self, mask: np.ndarray):
        mask = np.asarray(mask, np.bool_)
        self.mask = np.ascontiguousarray(mask.reshape(-1, *mask.shape[-2:]))
        self._rows: Dict[int, np.ndarray] = {1: self.mask}
        self._tiles: Dict[Tuple[int, int], np.ndarray] = {}

    @property
    def shape(self) -> Tuple[int, int, int]:
        return self.mask.shape

    def rows(self, h: int) -> np.ndarray:
        if h not in self._rows:
            # Reuse a finer row level whose height divides h (e.g. 64 from 32).
            base = max((k for k in self._rows if h % k == 0 and self.shape[1] % k == 0), default=1)
            self._rows[h] = _or_rows(self._rows[base], h // base) if base > 1 else _or_rows(self.mask, h)
        return self._rows[h]

    def tiles(self, h: int, w: int) -> np.ndarray:
        """bool [B, ceil(R/h), ceil(C/w)]: live micro-tiles."""
        key = (h, w)
        if key not in self._tiles:
            self._tiles[key] = _or_cols(np.ascontiguousarray(self.rows(h)), w)
        return self._tiles[key]


@dataclasses.dataclass(frozen=True)
class Problem:
    """The product being planned: x [B, M, K] (B entries of the sparse x) or a 2-D
    sparse w with M rows of x; N columns; element size in bytes."""

    operand: str  # "x" or "w"
    batch: int
    m: int
    k: int
    n: int
    itemsize: int
    w_batch: int = 1  # entries of w when x is the sparse operand (1 = shared)


@dataclasses.dataclass(frozen=True)
class Estimate:
    variant: Variant
    product_ms: float
    index_ms: float
    density: float  # live fraction of the variant's micro-tiles
    features: Tuple[Tuple[float, ...], Tuple[float, ...]]  # product, index (database terms)

    def total(self, include_index: bool = True) -> float:
        return self.product_ms + (self.index_ms if include_index else 0.0)


def _ceil_to(v, q):
    return -(-v // q) * q


def _makespan(total: float, largest: float, slots: int) -> float:
    return max(float(total), float(largest) * slots)


def features(variant: Variant, cov: Optional[Coverage], p: Problem, slots: int):
    """(product terms, index terms, density) in the database's units: counts -> GMACs/GBs."""
    bm, bn, bk_ct = variant.compute_tile
    e = p.itemsize
    if variant.kind == "dense":
        tiles = p.batch * math.ceil(p.m / bm) * math.ceil(p.n / bn)
        macs = _makespan(p.batch * p.m * p.k * p.n, bm * bn * p.k if tiles else 0, slots)
        io = e * (p.batch * p.m * p.k + p.w_batch * p.k * p.n + p.batch * p.m * p.n)
        return (1.0, macs / GIGA, io / GIGA), (0.0, 0.0, 0.0), 1.0
    h, w = variant.micro_tile
    rows, cols = (p.k, p.n) if variant.kind == "w" else (p.m, p.k)
    w = cols if w is None else w
    live = cov.tiles(h, w)  # [B, tr, tc]
    n_tiles = live.size
    n_live = int(np.count_nonzero(live))
    density = n_live / n_tiles
    if variant.kind == "m":
        live_rows = np.minimum(live.reshape(live.shape[0], -1).sum(axis=1) * h, p.m)  # [B]
        ct = -(-live_rows // bm)
        tn = math.ceil(p.n / bn)
        total = int(ct.sum()) * tn * bm * bn * p.k
        macs = _makespan(total, bm * bn * p.k if total else 0, slots)
        io = e * (int(live_rows.sum()) * p.k + p.w_batch * p.k * p.n + p.batch * p.m * p.n)
        lists = 1
    elif variant.kind == "k":
        per_group = live.sum(axis=2)  # [B, tr] live micro-tiles per block of h rows
        depth = _ceil_to(np.minimum(per_group * w, _ceil_to(p.k, bk_ct)), bk_ct)
        tile_rows = _ceil_to(h, bm)
        tn = math.ceil(p.n / bn)
        total = int(depth.sum()) * tile_rows * bn * tn
        macs = _makespan(total, int(depth.max()) * tile_rows * bn, slots)
        live_k = int(per_group.sum()) * w
        io = e * (live_k * h + live_k * p.n + p.batch * p.m * p.n)
        lists = 3  # flat + row + column lists, as calibrated (a forward-only jit now drops the column lists)
    else:  # "w"
        per_group = live.sum(axis=1)  # [1, tc] live row blocks per column block of w
        depth = _ceil_to(np.minimum(per_group * h, _ceil_to(p.k, bk_ct)), bk_ct)
        tile_cols = _ceil_to(w, bn)
        tm = math.ceil(p.m / bm)
        total = int(depth.sum()) * tile_cols * bm * tm
        macs = _makespan(total, int(depth.max()) * tile_cols * bm, slots)
        live_k = int(per_group.sum()) * h
        io = e * (live_k * w + live_k * p.m + p.m * p.n)
        lists = 3
    owner_bytes = e * cov.shape[0] * rows * cols
    index = (1.0, owner_bytes / GIGA, 4.0 * n_tiles * lists / GIGA)
    return (1.0, macs / GIGA, io / GIGA), index, density


def estimate(variant: Variant, cov: Optional[Coverage], p: Problem, slots: int) -> Estimate:
    prod_f, idx_f, density = features(variant, cov, p, slots)
    product_ms = float(np.dot(prod_f, variant.product))
    index_ms = float(np.dot(idx_f, variant.index))
    return Estimate(variant, product_ms, index_ms, density, (tuple(prod_f), tuple(idx_f)))
