"""The STile database: which STile variants exist and what each costs on one GPU model.

A variant is one way to run `x @ w` with one sparse operand: the dense product, the M
axis (whole rows of x), the K axis ((h, bk) micro-tiles of x) or weight blocks ((bk, bn)
micro-tiles of w), for one dtype. Each carries fitted cost parameters (see
`cost_model`): the product's fixed ms, ms per GMAC of filled compute tiles and ms per GB
moved, and the index construction's fixed ms, ms per GB read and ms per GB of lists.

Databases are versioned JSON files, one per GPU model, in `pit_jax/stile_db/<slug>.json`
(slug: `jax.devices()[0].device_kind` lowercased, non-alphanumerics as '-'), written by
`python -m benchmarks.profile_stiles` on that GPU. Resolution for the current device:
the exact model, else a file of the same family (H100 PCIe -> an H100 file), else the
default model (`DEFAULT_MODEL`, also used on CPU), else a built-in heuristic with
nominal rates. `PIT_JAX_STILE_DB=<path>` forces a file. The chosen source and the
reason are recorded in every Plan.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from typing import Iterable, Optional, Tuple

FORMAT = "pit_jax.stile_db"
VERSION = 1
ENV_VAR = "PIT_JAX_STILE_DB"
DEFAULT_MODEL = "nvidia-h100-80gb-hbm3"
DB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "stile_db")

KINDS = ("dense", "m", "k", "w")
DTYPES = ("bfloat16", "float16", "float32", "tf32")  # tf32: float32 inputs, TF32 allowed
# A dtype missing from a database is costed with the nearest one that is present.
DTYPE_FALLBACK = {"bfloat16": ("float16",), "float16": ("bfloat16",), "tf32": (), "float32": ()}

PRODUCT_TERMS = ("fixed_ms", "ms_per_gmac", "ms_per_gb")
INDEX_TERMS = ("fixed_ms", "ms_per_gb_read", "ms_per_gb_lists")
DEFAULT_PARALLEL_SLOTS = 132  # SMs of an H100 SXM: tiles that run side by side


class DatabaseError(ValueError):
    """A database file is missing fields, has the wrong version or bad numbers."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """A compiled STile variant, independent of dtype: what the kernels implement."""

    kind: str
    micro_tile: Optional[Tuple[int, Optional[int]]]  # (h, w) on the sparse operand; m: (h, None)
    compute_tile: Tuple[int, int, int]  # (BM, BN, BK) of the kernel the variant runs
    description: str
    heuristic_efficiency: float  # useful-MAC rate relative to dense, used only without a database


# The variants `pit_jax.plan` chooses from. Compute tiles are those the kernels pick for
# these micro-tiles on Hopper (cuda/kernels/sparse_gemm.cu, sm90/row_gather_gemm.cuh).
# Heuristic efficiencies are rough, rounded-down readings of the 2026-11-22 H100 run
# (benchmarks/results/sparse_dense_*): they only matter when no database exists.
CATALOG = (
    Spec("dense", None, (128, 256, 64), "x @ w through XLA (cuBLAS), no index", 1.0),
    Spec("m", (1, None), (128, 256, 64), "M axis: live token rows of x gathered into 128-row tiles (row-gather kernel)", 0.6),
    Spec("k", (32, 1), (64, 64, 32), "K axis: 32x1 micro-tiles of x; each 32-row block reduces over its live k only", 0.04),
    Spec("k", (32, 8), (64, 64, 32), "K axis: 32x8 micro-tiles of x", 0.06),
    Spec("k", (32, 64), (64, 64, 32), "K axis: 32x64 micro-tiles of x", 0.1),
    Spec("w", (1, 64), (64, 64, 32), "weight blocks: 1x64 micro-tiles of w; each 64-column block reduces over its live rows", 0.02),
    Spec("w", (32, 64), (64, 64, 32), "weight blocks: 32x64 micro-tiles of w", 0.1),
    Spec("w", (64, 128), (128, 128, 32), "weight blocks: 64x128 micro-tiles of w", 0.15),
)

# Nominal rates for the heuristic (no database): dense TFLOP/s per dtype, HBM GB/s.
_NOMINAL_TFLOPS = {"bfloat16": 600.0, "float16": 600.0, "tf32": 300.0, "float32": 50.0}
_NOMINAL_GBS = 2500.0


# Where a dtype runs a variant on another kernel than the catalog names, that kernel's
# tile: exact float32 M-axis products run the generic SIMT kernel, in 128 x 128 tiles at
# the profiled sizes (cuda/kernels/sparse_gemm.cu, `Pick`; the Hopper row-gather kernel
# takes 16-bit and TF32 only).
# Its rounds of tiles on the SMs set the product's time: with the catalog's 128 x 256 the
# fit missed by 27 % and planned a 1.42x-dense product at 96-100 % live rows (H200,
# 2026-11-29: docs/optimizer.md, "Compute tiles per dtype").
_KERNEL_TILES = {("m", "float32"): (128, 128, 16)}


def compute_tile(spec: Spec, dtype: str) -> Tuple[int, int, int]:
    """The compute tile `spec` runs with for `dtype` (what the cost features count)."""
    return _KERNEL_TILES.get((spec.kind, dtype), spec.compute_tile)


def spec_for(kind: str, micro_tile) -> Optional[Spec]:
    for s in CATALOG:
        if s.kind == kind and _tile(s.micro_tile) == _tile(micro_tile):
            return s
    return None


def _tile(t):
    return None if t is None else (int(t[0]), None if t[1] is None else int(t[1]))


@dataclasses.dataclass(frozen=True)
class Variant:
    """A variant with its cost parameters for one dtype (what a database stores)."""

    kind: str
    micro_tile: Optional[Tuple[int, Optional[int]]]
    compute_tile: Tuple[int, int, int]
    dtype: str
    product: Tuple[float, float, float]  # PRODUCT_TERMS
    index: Tuple[float, float, float]  # INDEX_TERMS (zeros for dense)
    description: str = ""
    # Why the variant is never a candidate: its profile never beat dense by a clear margin
    # (e.g. a float32 K-axis product that CUDA runs as a masked dense one); "" = usable.
    dominated: str = ""

    @property
    def id(self) -> str:
        return variant_id(self.kind, self.micro_tile, self.dtype)


def variant_id(kind, micro_tile, dtype) -> str:
    if micro_tile is None:
        return f"{kind}/{dtype}"
    h, w = micro_tile
    return f"{kind}/{h}x{'K' if w is None else w}/{dtype}"


@dataclasses.dataclass(frozen=True)
class Database:
    """Cost parameters of the variants on one GPU model (or the heuristic)."""

    name: str  # e.g. "nvidia-h100-80gb-hbm3 v1 (2026-11-30)" or "heuristic"
    device: str
    source: str  # file path, or "heuristic"
    note: str  # how it was chosen for this device
    parallel_slots: int
    variants: Tuple[Variant, ...]

    @property
    def is_heuristic(self) -> bool:
        return self.source == "heuristic"

    def describe(self) -> str:
        return f"{self.name}: {self.note}" if self.note else self.name

    def lookup(self, kind: str, micro_tile, dtype: str) -> Optional[Variant]:
        """The variant for `dtype`, else for its fallback dtype, else None."""
        for dt in (dtype, *DTYPE_FALLBACK.get(dtype, ())):
            for v in self.variants:
                if v.kind == kind and v.dtype == dt and _tile(v.micro_tile) == _tile(micro_tile):
                    return v
        return None

    def candidates(self, dtype: str, kinds: Iterable[str]) -> Tuple[Variant, ...]:
        """One variant per (kind, micro-tile) of `kinds` costed for `dtype` (or its fallback)."""
        kinds = tuple(kinds)
        seen, out = set(), []
        for v in self.variants:
            key = (v.kind, _tile(v.micro_tile))
            if v.kind in kinds and key not in seen:
                found = self.lookup(v.kind, v.micro_tile, dtype)
                seen.add(key)
                # A dominated entry for this dtype is left out, not replaced by the
                # fallback dtype's entry: it describes how this dtype really runs.
                if found is not None and not found.dominated:
                    out.append(found)
        return tuple(out)


# ----------------------------------------------------------------------------------
# the heuristic (no database)


def _thin_float32(spec: Spec, dtype: str) -> str:
    """What the profiles mark dominated, known without one: a 32-bit product whose
    micro-tile is thinner than 8 (K-axis 32x1, 1x64 weight strips) has no kernel that
    gathers it (the Hopper ones take 16-bit types), so CUDA runs it as a masked dense
    product (primitives/stile_matmul.py, `_too_thin`): never faster than dense."""
    if dtype in ("float32", "tf32") and spec.kind in ("k", "w") and min(spec.micro_tile) < 8:
        return "a float32 product of micro-tiles thinner than 8 runs as a masked dense one on CUDA"
    return ""


def heuristic(note: str = "no database: heuristic") -> Database:
    """Nominal rates: dense at `_NOMINAL_TFLOPS`, each variant slower per useful MAC by
    its catalog efficiency; index construction at HBM bandwidth. Rough by design."""
    variants = []
    ms_per_gb = 1e3 / _NOMINAL_GBS
    for dtype, tflops in _NOMINAL_TFLOPS.items():
        dense_gmac = 2.0 / tflops  # ms per 1e9 multiply-adds
        for s in CATALOG:
            if s.kind == "dense":
                product, index = (0.005, dense_gmac, ms_per_gb), (0.0, 0.0, 0.0)
            else:
                product = (0.01, dense_gmac / s.heuristic_efficiency, ms_per_gb)
                index = (0.01, ms_per_gb, 2 * ms_per_gb)
            variants.append(Variant(s.kind, s.micro_tile, compute_tile(s, dtype), dtype, product, index, s.description,
                                    _thin_float32(s, dtype)))
    return Database("heuristic", "nominal GPU", "heuristic", note, DEFAULT_PARALLEL_SLOTS, tuple(variants))


# ----------------------------------------------------------------------------------
# files


def device_slug(device_kind: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-")


def _family(slug: str) -> Optional[str]:
    m = re.search(r"(?:^|-)([a-z]{1,3}\d{2,4}[a-z]?)(?:-|$)", slug)
    return m.group(1) if m else None


def _num(value, where: str, *, positive=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DatabaseError(f"{where} must be a finite number, got {value!r}")
    if value < 0 or (positive and value <= 0):
        raise DatabaseError(f"{where} must be {'positive' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _params(entry: dict, key: str, terms, where: str) -> Tuple[float, ...]:
    block = entry.get(key)
    if not isinstance(block, dict):
        raise DatabaseError(f"{where}: '{key}' must be an object with {list(terms)}")
    return tuple(_num(block.get(t), f"{where}.{key}.{t}") for t in terms)


def parse(doc: dict, source: str = "<dict>", note: str = "") -> Database:
    """Validates a database document (the JSON's content) and returns the Database."""
    if not isinstance(doc, dict):
        raise DatabaseError(f"{source}: a STile database is a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise DatabaseError(f"{source}: 'format' must be {FORMAT!r}, got {doc.get('format')!r}")
    if doc.get("version") != VERSION:
        raise DatabaseError(
            f"{source}: database version {doc.get('version')!r}, this pit_jax reads version {VERSION}; "
            f"regenerate it with `python -m benchmarks.profile_stiles`"
        )
    device = doc.get("device")
    if not isinstance(device, str) or not device:
        raise DatabaseError(f"{source}: 'device' must be the GPU's device_kind string")
    slots = int(_num(doc.get("parallel_slots", DEFAULT_PARALLEL_SLOTS), f"{source}: parallel_slots", positive=True))
    entries = doc.get("variants")
    if not isinstance(entries, list) or not entries:
        raise DatabaseError(f"{source}: 'variants' must be a non-empty list")
    variants = []
    for i, e in enumerate(entries):
        where = f"{source}: variants[{i}]"
        if not isinstance(e, dict):
            raise DatabaseError(f"{where} must be an object")
        kind, dtype = e.get("kind"), e.get("dtype")
        if kind not in KINDS:
            raise DatabaseError(f"{where}.kind must be one of {KINDS}, got {kind!r}")
        if dtype not in DTYPES:
            raise DatabaseError(f"{where}.dtype must be one of {DTYPES}, got {dtype!r}")
        tile = e.get("micro_tile")
        if kind == "dense":
            if tile is not None:
                raise DatabaseError(f"{where}: a dense variant has micro_tile null, got {tile!r}")
        else:
            ok = isinstance(tile, list) and len(tile) == 2 and isinstance(tile[0], int) and tile[0] >= 1
            ok = ok and (tile[1] is None if kind == "m" else isinstance(tile[1], int) and tile[1] >= 1)
            if not ok:
                want = "[h, null]" if kind == "m" else "[h, w] of positive ints"
                raise DatabaseError(f"{where}.micro_tile must be {want}, got {tile!r}")
            tile = (tile[0], tile[1])
        ct = e.get("compute_tile")
        if not (isinstance(ct, list) and len(ct) == 3 and all(isinstance(c, int) and c >= 1 for c in ct)):
            raise DatabaseError(f"{where}.compute_tile must be [BM, BN, BK] of positive ints, got {ct!r}")
        product = _params(e, "product", PRODUCT_TERMS, where)
        index = (0.0, 0.0, 0.0) if kind == "dense" else _params(e, "index", INDEX_TERMS, where)
        dominated = e.get("dominated_by_dense", "")
        if not isinstance(dominated, str) or (dominated and kind == "dense"):
            raise DatabaseError(f"{where}.dominated_by_dense must be a reason string on a sparse variant, got {dominated!r}")
        variants.append(Variant(kind, tile, tuple(ct), dtype, product, index, str(e.get("description", "")), dominated))
    if not any(v.kind == "dense" for v in variants):
        raise DatabaseError(f"{source}: no dense variant (every plan compares against dense)")
    name = f"{doc.get('slug') or device_slug(device)} v{VERSION}" + (f" ({str(doc['date'])[:10]})" if doc.get("date") else "")
    return Database(name, device, source, note, slots, tuple(variants))


@functools.lru_cache(maxsize=16)
def _load_file(path: str, mtime: float) -> dict:
    del mtime  # part of the cache key: a regenerated file is read again
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DatabaseError(f"{path}: not valid JSON ({e})") from None


def load_file(path: str, note: str = "") -> Database:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DatabaseError(f"STile database {path!r} does not exist")
    return parse(_load_file(os.path.abspath(path), os.path.getmtime(path)), path, note)


def shipped() -> Tuple[str, ...]:
    """Slugs of the database files shipped with the package."""
    if not os.path.isdir(DB_DIR):
        return ()
    return tuple(sorted(f[:-5] for f in os.listdir(DB_DIR) if f.endswith(".json")))


def current_device_kind() -> Tuple[str, str]:
    """(device_kind, platform) of JAX's default device."""
    import jax

    dev = jax.devices()[0]
    return dev.device_kind, dev.platform


def resolve(device_kind: Optional[str] = None, platform: Optional[str] = None) -> Database:
    """The database for a device (default: JAX's first device), with the reason recorded."""
    env = os.environ.get(ENV_VAR)
    if env:
        return load_file(env, f"from ${ENV_VAR}")
    if device_kind is None:
        device_kind, platform = current_device_kind()
    slug = device_slug(device_kind)
    files = shipped()
    if platform in (None, "gpu", "cuda") and slug in files:
        return load_file(os.path.join(DB_DIR, slug + ".json"), f"profiled on this GPU model ({device_kind})")
    if platform in (None, "gpu", "cuda"):
        fam = _family(slug)
        same = [f for f in files if fam is not None and _family(f) == fam]
        if same:
            return load_file(os.path.join(DB_DIR, same[0] + ".json"), f"same family as this device ({device_kind})")
    if DEFAULT_MODEL in files:
        return load_file(os.path.join(DB_DIR, DEFAULT_MODEL + ".json"), f"default model; no database for this device ({device_kind})")
    return heuristic(f"no database: heuristic (no profiled file for {device_kind} nor the default model {DEFAULT_MODEL})")


def get(database=None) -> Database:
    """`database` as the planner accepts it: None (resolve for this device), a Database,
    a path to a JSON file, or "heuristic"."""
    if database is None:
        return resolve()
    if isinstance(database, Database):
        return database
    if isinstance(database, str) and database == "heuristic":
        return heuristic("heuristic (asked for)")
    if isinstance(database, (str, os.PathLike)):
        return load_file(database, "given path")
    if isinstance(database, dict):
        return parse(database, "<dict>", "given document")
    raise TypeError(
        f"database must be None, a pit_jax.optimizer.Database, a path or 'heuristic', got {type(database).__name__}"
    )


def document(device: str, variants: Iterable[dict], **meta) -> dict:
    """A database document (what `profile_stiles` writes): header fields + variant entries."""
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "device": device,
        "slug": device_slug(device),
        "parallel_slots": DEFAULT_PARALLEL_SLOTS,
        "units": {
            "product": dict(zip(PRODUCT_TERMS, ("ms", "ms per 1e9 MACs of filled compute tiles", "ms per 1e9 bytes moved"))),
            "index": dict(zip(INDEX_TERMS, ("ms", "ms per 1e9 bytes of the sparse operand read", "ms per 1e9 bytes of index lists written"))),
        },
    }
    doc.update(meta)
    doc["variants"] = list(variants)
    return doc
