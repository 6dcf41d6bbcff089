"""`pit_jax.sparse_dense` against dense, plain JAX, jax.experimental.sparse and the oracle (issue 4).

    python -m benchmarks.bench_sparse_dense [--out DIR] [--small] [--only m,m_bwd,k,w]
                                            [--stand-in] [--deadline-s S] [--verbose]
    python -m benchmarks.bench_sparse_dense --rescore RESULTS.json   # targets only, no device

Workloads (full sizes; `--small` shrinks every dim to 256-512 for a CPU smoke run):
  m      M axis, random live rows of x, 16384 x 4096 x 4096, 10/30/50 % live rows,
         bf16, f16, and float32 with TF32 allowed (precision="tensorfloat32");
         index from x and from a bool row mask [M, 1].
  m_bwd  its backward (dx, dw through jax.vjp), bf16, against the oracle backward.
  k      K axis, 32 x 1 micro-tiles of x: random (PIT Fig. 15) and neuron-structured
         (ReLU-FFN-like), 4096^3 bf16 at sparsity 0.5 / 0.9 / 0.95 / 0.99.
  w      weight blocks of w, 32 x 64 and 1 x 64 micro-tiles, same sizes.
Implementations (docs/benchmarks.md says more):
  dense            x @ w through XLA (cuBLAS): the 100 % reference.
  oracle           dense XLA product on already-compacted data, no index, no gather.
  jnp_nonzero_all  plain JAX in jit: any + nonzero(size=M) + gather + matmul + scatter.
  jnp_nonzero_cap  the same with size = the pattern's live count (a bound a user must know).
  bcoo / bcsr      jax.experimental.sparse, fromdense inside the jit (nse = exact nnz).
  pit_jax          sparse_dense with the index built inside the timed jit.
  pit_jax_pre      sparse_dense with a precomputed index passed in.
  pit_jax_mask     (m) sparse_dense with the index built from the row mask inside the jit.
  pit_jax_unspecified  (m) pit_jax with dead_rows="unspecified": the dead rows left
                   unwritten, for a consumer of the live rows only (checked on those).
  index/index_mask pit_jax.index alone (from x / from the row mask).

Prints one line per case as it goes, then a table and the issue-4 targets; writes
JSON (and a PNG of speed-up over dense vs density) after every case, so an
interrupted run still leaves its results.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
import time
import traceback
import warnings
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

import pit_jax
from benchmarks import common

WORKLOADS = ("m", "m_bwd", "k", "w")

# name -> (dtype, precision passed to products, relative tolerance of the check)
DTYPES = {
    "bf16": (jnp.bfloat16, None, 2e-2),
    "f16": (jnp.float16, None, 4e-3),
    "f32": (jnp.float32, "tensorfloat32", 8e-3),
}
DTYPE_LABEL = {"bf16": "bfloat16", "f16": "float16", "f32": "float32 (tf32 allowed)"}

# (workload, pattern name, micro-tile on the masked operand)
KW_PATTERNS = (
    ("k", "random_32x1", (32, 1)),
    ("k", "neuron_32x1", (32, 1)),
    ("w", "random_32x64", (32, 64)),
    ("w", "random_1x64", (1, 64)),
)
PATTERN_TEXT = {
    "rows": "random live rows of x (row micro-tiles (1, K))",
    "random_32x1": "random live 32x1 micro-tiles of x (K axis, PIT Fig. 15)",
    "neuron_32x1": "neuron-structured 32x1 micro-tiles of x: skewed per-column popularity, "
    "about half the elements of a live tile zero (ReLU-FFN-like)",
    "random_32x64": "random live 32x64 blocks of w",
    "random_1x64": "random live 1x64 blocks of w",
}

IMPL_TEXT = {
    "dense": "x @ w through XLA (cuBLAS), the 100% reference",
    "oracle": "dense XLA product on already-compacted data (m: x_live[n_live, K] @ w; k/w: "
    "[M, K_live] @ [K_live, N] with K_live = round(K * density)); no index, no gather",
    "jnp_nonzero_all": "plain JAX in jit: any(x != 0) + jnp.nonzero(size=M) + gather + matmul + scatter; "
    "size must be static, so it is every row and the matmul is full size",
    "jnp_nonzero_cap": "as jnp_nonzero_all with size = the pattern's largest live count (m: n_live; "
    "k/w: per row/column block), a bound the user must know ahead",
    "bcoo": "jax.experimental.sparse.BCOO.fromdense(nse = exact nnz) inside the jit, then @; "
    "JAX's cuSPARSE lowering is off by default, so this is its generic gather/scatter lowering, whose "
    "scatter-add accumulates in the input dtype (16-bit results lose accuracy: the check may fail)",
    "bcsr": "jax.experimental.sparse.BCSR.fromdense(nse = exact nnz) inside the jit, then @ (lhs only)",
    "pit_jax": "pit_jax.sparse_dense with the index built inside the same jit",
    "pit_jax_pre": "pit_jax.sparse_dense with a precomputed index passed in",
    "pit_jax_mask": "pit_jax.sparse_dense with the index built inside the jit from the bool row mask [M, 1]",
    "pit_jax_unspecified": "pit_jax (index inside the jit) with dead_rows='unspecified': the dead rows left unwritten",
    "index": "pit_jax.index alone (from x, or from w for weight blocks)",
    "index_mask": "pit_jax.index(mask[:, None], 'row') alone, from a bool [M, 1] row mask",
}

# jax.experimental.sparse's generic lowering materializes an [nse, N] (or [nse, M])
# product; past this many elements it is skipped without trying (memory, int32 indexing).
SPARSE_MAX_ELEMENTS = 1.5e9
SLOW_BUDGET_S = 2.0
DEVICE_CALLS = 20  # traced calls behind a row's device_ms (index rows and the product they feed)


@dataclasses.dataclass(frozen=True)
class Sizes:
    m_shape: tuple
    m_densities: tuple
    m_dtypes: tuple
    bwd_dtypes: tuple
    kw_shape: tuple
    kw_sparsities: tuple
    reps: int
    target_s: float


FULL = Sizes((16384, 4096, 4096), (0.1, 0.3, 0.5), ("bf16", "f16", "f32"), ("bf16",), (4096, 4096, 4096), (0.5, 0.9, 0.95, 0.99), 11, 0.015)
# the smoke run keeps the densities every target and edge case needs (10 % live, 0.9; 0.99: one live block)
SMALL = Sizes((512, 256, 256), (0.1, 0.5), ("bf16", "f16", "f32"), ("bf16",), (256, 256, 256), (0.5, 0.9, 0.99), 3, 0.005)


# ----------------------------------------------------------------------------------
# pit_jax access: absent API, stand-in, and small signature variations


class Pit:
    """Calls `pit_jax.sparse_dense` as the brief specifies; resolves, once per case
    kind, which grouped index a precomputed index needs (by abstract evaluation)."""

    GROUP = {"m": (None, "both"), "k": ("row", "both"), "w": ("col", "both")}

    def __init__(self, standin: bool):
        self.fn = getattr(pit_jax, "sparse_dense", None)
        self.standin = False
        if self.fn is None and standin:
            from benchmarks import _standin

            self.fn = _standin.sparse_dense
            self.standin = True
        self._resolved = {}

    @property
    def available(self) -> bool:
        return self.fn is not None

    def inside(self, axis, micro_tile, precision):
        kw = {} if axis == "m" else {"micro_tile": micro_tile}
        return lambda x, w: self.fn(x, w, axis=axis, precision=precision, **kw)

    def mask_call(self, call, xw, mask):
        """(fn(x, w, mask), note): the product with its index built from a bool row mask
        [M, 1] inside the jit, `pit_jax.index(mask[:, None], "row")`. If sparse_dense
        rejects an index of that shape, the same index is relabelled as x's row index
        (an [M, 1] grid of (1, 1) tiles has the tile ids of an [M, K] grid of (1, K)
        tiles): metadata only, no data touched."""

        def direct(x, w, mk):
            return call(x, w, pit_jax.index(mk[:, None], "row"))

        try:
            jax.eval_shape(direct, *xw, mask)
            return direct, "index = pit_jax.index(mask[:, None], 'row')"
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"

        def relabelled(x, w, mk):
            i = pit_jax.index(mk[:, None], "row")
            i = pit_jax.PitIndex(*i.arrays, shape=tuple(x.shape[-2:]), micro_tile=(1, x.shape[-1]), group_by=i.group_by)
            return call(x, w, i)

        return relabelled, f"sparse_dense rejected the [M, 1] mask index ({why}); the same index relabelled as x's (1, K) row index"

    def resolve(self, axis, micro_tile, precision, x_like, w_like):
        """-> (build_index(src), call(x, w, index), note, group_by) for a precomputed index."""
        key = (axis, micro_tile, precision, x_like.shape, w_like.shape, x_like.dtype)
        if key in self._resolved:
            return self._resolved[key]
        src_like = w_like if axis == "w" else x_like
        tried = []
        first = None
        for group_by in self.GROUP[axis]:
            for pass_tile in (False, True):
                def build(src, group_by=group_by):
                    return pit_jax.index(src, micro_tile, group_by=group_by)

                extra = {"micro_tile": micro_tile} if pass_tile else {}

                def call(x, w, idx, extra=extra):
                    return self.fn(x, w, idx, axis=axis, precision=precision, **extra)

                note = f"index group_by={group_by!r}" + (", micro_tile passed too" if pass_tile else "")
                first = first or (build, call, note, group_by)
                try:
                    jax.eval_shape(lambda x, w, s: call(x, w, build(s)), x_like, w_like, src_like)
                except Exception as e:  # noqa: BLE001 - any tracing failure: try the next form
                    tried.append(f"{note}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
                    continue
                self._resolved[key] = (build, call, note, group_by)
                return self._resolved[key]
        self._resolved[key] = (first[0], first[1], "no call form traced: " + " | ".join(tried), first[3])
        return self._resolved[key]


# ----------------------------------------------------------------------------------
# baselines


def jnp_rows(x, w, size, precision):
    """Live rows by any + nonzero, gather, dense product, scatter back (M axis)."""
    m = x.shape[0]
    live = jnp.any(x != 0, axis=1)
    (rows,) = jnp.nonzero(live, size=size, fill_value=m)
    xg = jnp.take(x, rows, axis=0, mode="fill", fill_value=0)
    y = jnp.matmul(xg, w, precision=precision)
    return jnp.zeros((m, w.shape[1]), y.dtype).at[rows].set(y, mode="drop")


def jnp_k_tiles(x, w, cap, h, precision):
    """K axis, (h, 1) micro-tiles: per block of h rows, the live columns (nonzero with
    size=cap), their x columns and w rows gathered, one batched product."""
    m, k = x.shape
    xb = x.reshape(m // h, h, k)
    live = jnp.any(xb != 0, axis=1)  # [blocks, K]
    cols = jax.vmap(lambda l: jnp.nonzero(l, size=cap, fill_value=k)[0])(live)  # [blocks, cap]
    xg = jnp.take_along_axis(xb, cols[:, None, :], axis=2, mode="fill", fill_value=0)  # [blocks, h, cap]
    wg = jnp.take(w, cols, axis=0, mode="fill", fill_value=0)  # [blocks, cap, N]
    y = jnp.einsum("bhc,bcn->bhn", xg, wg, precision=precision)
    return y.reshape(m, w.shape[1])


def jnp_w_blocks(x, w, cap, bk, bn, precision):
    """Weight blocks (bk, bn): per column block of w, its live row blocks (nonzero with
    size=cap), those w blocks and the matching x column strips gathered, batched product."""
    m = x.shape[0]
    k, n = w.shape
    kt, nt = k // bk, n // bn
    wb = w.reshape(kt, bk, nt, bn)
    live = jnp.any(wb != 0, axis=(1, 3))  # [kt, nt]
    rows = jax.vmap(lambda l: jnp.nonzero(l, size=cap, fill_value=kt)[0])(live.T)  # [nt, cap]
    wg = jnp.take_along_axis(wb.transpose(2, 0, 1, 3), rows[:, :, None, None], axis=1, mode="fill", fill_value=0)
    xg = jnp.take(x.reshape(m, kt, bk), rows, axis=1, mode="fill", fill_value=0)  # [m, nt, cap, bk]
    y = jnp.einsum("mjcb,jcbn->mjn", xg, wg, precision=precision)
    return y.reshape(m, n)


def sparse_fn(kind, nse, sparse_rhs):
    def run(x, w):
        from jax.experimental import sparse  # imported here: a failure is this row's error

        cls = sparse.BCOO if kind == "bcoo" else sparse.BCSR
        if sparse_rhs:
            return x @ cls.fromdense(w, nse=nse)
        return cls.fromdense(x, nse=nse) @ w

    return run


# ----------------------------------------------------------------------------------
# data


def normal(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


@functools.partial(jax.jit, static_argnames=("m", "k", "n", "n_live", "dtype", "grad"))
def make_m_set(key, *, m, k, n, n_live, dtype, grad):
    kp, kx, kw, kg = jax.random.split(key, 4)
    rows = jnp.sort(jax.random.permutation(kp, m)[:n_live]).astype(jnp.int32)
    mask = jnp.zeros((m,), jnp.bool_).at[rows].set(True)
    x = jnp.where(mask[:, None], normal(kx, (m, k), jnp.float32), 0).astype(dtype)
    d = {"x": x, "w": normal(kw, (k, n), dtype), "mask": mask, "rows": rows, "x_live": x[rows]}
    if grad:
        g = normal(kg, (m, n), dtype)
        d.update(g=g, g_live=g[rows])
    return d


@functools.partial(jax.jit, static_argnames=("m", "k", "n", "density", "axis", "tile", "pattern", "dtype"))
def make_kw_set(key, *, m, k, n, density, axis, tile, pattern, dtype):
    ks = jax.random.split(key, 8)
    rows, cols = (m, k) if axis == "k" else (k, n)
    bh, bw = tile
    tr, tc = rows // bh, cols // bw
    n_tiles = tr * tc
    n_live = max(1, round(n_tiles * density))
    if pattern.startswith("neuron"):
        # Gumbel top-k: tiles drawn without replacement, weighted by a lognormal
        # per-column (neuron) popularity; popular neurons are live in most row blocks.
        pop = 1.5 * jax.random.normal(ks[0], (tc,))
        score = pop[None, :] + jax.random.gumbel(ks[1], (tr, tc))
    else:
        score = jax.random.uniform(ks[1], (tr, tc))
    top = jnp.argsort(-score.ravel())[:n_live]
    live = jnp.zeros((n_tiles,), jnp.bool_).at[top].set(True).reshape(tr, tc)
    emask = jnp.repeat(jnp.repeat(live, bh, axis=0), bw, axis=1)
    if pattern.startswith("neuron"):
        # ReLU-like zeros inside live tiles, one element per tile kept so it stays live
        keep_row = jnp.repeat(jnp.repeat(jax.random.randint(ks[2], (tr, tc), 0, bh), bh, axis=0), bw, axis=1)
        row_in_tile = (jnp.arange(rows) % bh)[:, None]
        emask &= (jax.random.uniform(ks[3], (rows, cols)) < 0.5) | (row_in_tile == keep_row)
    sparse_v = jnp.where(emask, normal(ks[4], (rows, cols), jnp.float32), 0).astype(dtype)
    if axis == "k":
        x, w = sparse_v, normal(ks[5], (k, n), dtype)
    else:
        x, w = normal(ks[5], (m, k), dtype), sparse_v
    k_live = max(1, round(k * density))
    return {"x": x, "w": w, "live": live, "x_o": normal(ks[6], (m, k_live), dtype), "w_o": normal(ks[7], (k_live, n), dtype)}


@jax.jit
def rel_err(out, ref):
    outs, refs = jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)
    errs = []
    for o, r in zip(outs, refs):
        r = r.astype(jnp.float32)
        errs.append(jnp.max(jnp.abs(o.astype(jnp.float32) - r)) / jnp.maximum(jnp.max(jnp.abs(r)), 1e-30))
    return jnp.max(jnp.stack(errs))


def f32_product(x, w):
    return jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32), precision="highest")


# ----------------------------------------------------------------------------------
# the run


class Suite:
    def __init__(self, args):
        self.args = args
        self.sizes = SMALL if args.small else FULL
        self.pit = Pit(args.stand_in)
        self.rows: list[dict] = []
        self.t0 = time.perf_counter()
        self.meta = common.device_info()
        self.meta.update(
            suite="sparse_dense",
            small=bool(args.small),
            argv=sys.argv[1:],
            pit_sparse_dense=("stand-in (pure-JAX masked dense product; timings are NOT pit_jax's)" if self.pit.standin else ("present" if self.pit.available else "absent: pit_jax rows skipped")),
            impls=IMPL_TEXT,
            patterns=PATTERN_TEXT,
            timing=(
                "median ms of one call; inputs rotated over several sets inside one jit so nothing sits in L2 "
                "(benchmarks/common.py); slow baselines (bcoo/bcsr): run once first, null if > "
                f"{SLOW_BUDGET_S:g} s, timed on one set when > 50 ms"
            ),
        )
        self.suite_name = "sparse_dense_small" if args.small else "sparse_dense"
        self.path = None
        self.key = jax.random.key(0)
        self.case_lines: list[str] = []

    # -- bookkeeping ----------------------------------------------------------------
    def should_run(self, label):
        """False once the run is past --deadline-s: the case is listed as not run."""
        if self.args.deadline_s and self.elapsed() > self.args.deadline_s:
            self.meta.setdefault("not_run_deadline", []).append(label)
            print(f"[{self.elapsed():6.1f}s] {label}: not run (past --deadline-s {self.args.deadline_s:g})", flush=True)
            return False
        return True

    def rotations(self, bytes_per_set):
        # the small sizes are a smoke test (CPU): two sets keep compiles short
        return common.rotations(bytes_per_set, max_sets=2 if self.args.small else 16)

    def elapsed(self):
        return time.perf_counter() - self.t0

    def flush(self, plot=False):
        payload = {
            "meta": {**self.meta, "wall_s": round(self.elapsed(), 1)},
            "config": dataclasses.asdict(self.sizes),
            "results": self.rows,
            "targets": targets(self.rows, self.meta),
        }
        self.path = common.write_results(self.suite_name, payload, self.args.out)
        if plot:
            try:
                plot_speedups(self.rows, self.path[: -len(".json")] + ".png", self.meta)
            except Exception as e:  # noqa: BLE001 - a plot problem must not lose the numbers
                print(f"plot failed: {type(e).__name__}: {e}", file=sys.stderr)

    def measure(self, case, impl, fn, sets, *, ref=None, tol=None, slow=False, skip=None, count=None, note=None,
                device=False, rows=None):
        """rows: check the output against ref on these rows only (the others unspecified)."""
        row = {**case, "impl": impl}
        if note:
            row["note"] = note
        if skip:
            row.update(median_ms=None, skipped=skip)
            self.rows.append(row)
            return row
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if slow:
                    t = common.time_bounded(fn, sets, budget_s=SLOW_BUDGET_S, reps=3, keep_output=True)
                else:
                    # device: also the kernels' summed time from a profiler trace (GPU only;
                    # the index shares compare these, see index_share)
                    t = common.time_op(fn, sets, reps=self.sizes.reps, target_s=self.sizes.target_s, keep_output=True, budget_s=3.0,
                                       device_calls=DEVICE_CALLS if device else 0)
            out = t.pop("output")
            row.update(t)
            if ref is not None:
                if rows is not None:
                    out, ref = out[rows], ref[rows]
                err = float(rel_err(out, ref))
                row["max_rel_err"] = err
                row["ok"] = bool(err <= tol)
            if count is not None:
                got = int(jax.device_get(out[1]))
                row["count"] = got
                row["ok"] = got == count
            del out
        except common.TooSlow as e:
            row.update(median_ms=None, skipped=str(e))
        except Exception as e:  # noqa: BLE001 - record and go on
            msg = str(e).strip().splitlines()
            row.update(median_ms=None, error=f"{type(e).__name__}: {msg[0][:300] if msg else ''}")
            if self.args.verbose:
                traceback.print_exc()
        self.rows.append(row)
        return row

    def pit_skip(self):
        return None if self.pit.available else "pit_jax.sparse_dense does not exist (yet)"

    def finish_case(self, case_rows, label):
        by = {r["impl"]: r for r in case_rows}
        dense = (by.get("dense") or {}).get("median_ms")
        oracle = (by.get("oracle") or {}).get("median_ms")
        pre = (by.get("pit_jax_pre") or {}).get("median_ms")
        for r in case_rows:
            ms = r.get("median_ms")
            if ms is None:
                continue
            if r["impl"].startswith("index"):
                if pre:
                    r["pct_of_product"] = 100.0 * ms / pre
                if oracle:
                    r["pct_of_oracle"] = 100.0 * ms / oracle
                pre_dev = (by.get("pit_jax_pre") or {}).get("device_ms")
                if r.get("device_ms") and pre_dev:
                    r["pct_of_product_device"] = 100.0 * r["device_ms"] / pre_dev
                continue
            if dense:
                r["speedup_vs_dense"] = dense / ms
            if oracle:
                r["ratio_to_oracle"] = ms / oracle
            if self.pit.standin and r["impl"].startswith("pit_jax"):
                r["standin"] = True
        for r in case_rows:
            if r["impl"].startswith("index") and self.pit.standin and "pct_of_product" in r:
                r["standin_product"] = True
        def ms(name):
            v = (by.get(name) or {}).get("median_ms")
            return "-" if v is None else f"{v:.4g}"
        line = f"[{self.elapsed():6.1f}s] {label}: dense {ms('dense')}  oracle {ms('oracle')}  pit {ms('pit_jax')}  pit_pre {ms('pit_jax_pre')}  pit_unspec {ms('pit_jax_unspecified')}  index {ms('index')} ms"
        bad = [f"{r['impl']} ({'count ' + str(r['count']) if 'count' in r else 'rel err %.2g' % r.get('max_rel_err', float('nan'))})" for r in case_rows if r.get("ok") is False]
        if bad:
            line += f"  CHECK FAILED: {', '.join(bad)}"
        print(line, flush=True)
        self.flush()

    # -- M axis -----------------------------------------------------------------------
    def m_forward(self):
        m, k, n = self.sizes.m_shape
        for dname in self.sizes.m_dtypes:
            dtype, prec, tol = DTYPES[dname]
            for density in self.sizes.m_densities:
                if not self.should_run(f"m {dname} live {density:.0%}"):
                    continue
                n_live = max(1, round(m * density))
                n_sets = self.rotations(common.np_bytes(jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((k, n), dtype)))
                sets = [make_m_set(jax.random.fold_in(self.key, 1000 * len(self.rows) + i), m=m, k=k, n=n, n_live=n_live, dtype=dtype, grad=False) for i in range(n_sets)]
                s0 = sets[0]
                ref = f32_product(s0["x"], s0["w"])
                ref_live = ref[s0["rows"]]
                case = {
                    "workload": "m", "pattern": "rows", "dtype": DTYPE_LABEL[dname], "shape": [m, k, n],
                    "density": density, "sparsity": round(1 - density, 6), "n_live": n_live, "precision": prec,
                }
                xw = [(s["x"], s["w"]) for s in sets]
                before = len(self.rows)
                mm = functools.partial(jnp.matmul, precision=prec)
                self.measure(case, "dense", lambda x, w: mm(x, w), xw, ref=ref, tol=tol)
                self.measure(case, "oracle", lambda xl, w: mm(xl, w), [(s["x_live"], s["w"]) for s in sets], ref=ref_live, tol=tol)
                self.measure(case, "jnp_nonzero_all", lambda x, w: jnp_rows(x, w, m, prec), xw, ref=ref, tol=tol, note="nonzero size = M (all rows)")
                self.measure(case, "jnp_nonzero_cap", lambda x, w: jnp_rows(x, w, n_live, prec), xw, ref=ref, tol=tol, note=f"nonzero size = {n_live}")
                nse = n_live * k
                for kind in ("bcoo", "bcsr"):
                    self.sparse_baseline(case, kind, nse, n, xw, ref, tol, sparse_rhs=False, itemsize=jnp.dtype(dtype).itemsize)
                self.m_pit(case, sets, xw, ref, tol, prec, n_live)
                self.finish_case(self.rows[before:], f"m {dname} live {density:.0%}")
                del sets, s0, ref, ref_live, xw

    def m_pit(self, case, sets, xw, ref, tol, prec, n_live):
        skip = self.pit_skip()
        if self.pit.available:
            x0, w0 = xw[0]
            build, call, note, _ = self.pit.resolve("m", "row", prec, jax.ShapeDtypeStruct(x0.shape, x0.dtype), jax.ShapeDtypeStruct(w0.shape, w0.dtype))
            self.measure(case, "pit_jax", self.pit.inside("m", "row", prec), xw, ref=ref, tol=tol)
            idx = [jax.jit(build)(s["x"]) for s in sets]
            self.measure(case, "pit_jax_pre", call, [(s["x"], s["w"], i) for s, i in zip(sets, idx)], ref=ref, tol=tol, note=note,
                         device=True)
            mask_call, mask_note = self.pit.mask_call(call, xw[0], sets[0]["mask"])
            self.measure(case, "pit_jax_mask", mask_call, [(s["x"], s["w"], s["mask"]) for s in sets], ref=ref, tol=tol, note=mask_note)
            del idx
            if self.pit.standin:
                self.measure(case, "pit_jax_unspecified", None, None, skip="the stand-in has no dead_rows")
            else:
                self.measure(case, "pit_jax_unspecified",
                             lambda x, w: self.pit.fn(x, w, axis="m", precision=prec, dead_rows="unspecified"), xw,
                             ref=ref, tol=tol, rows=sets[0]["rows"])
        else:
            for impl in ("pit_jax", "pit_jax_pre", "pit_jax_mask", "pit_jax_unspecified"):
                self.measure(case, impl, None, None, skip=skip)
        self.measure(case, "index", lambda x: pit_jax.index(x, "row").arrays, [(s["x"],) for s in sets], count=n_live, device=True)
        self.measure(case, "index_mask", lambda mk: pit_jax.index(mk[:, None], "row").arrays, [(s["mask"],) for s in sets],
                     count=n_live, device=True)

    def sparse_baseline(self, case, kind, nse, other, sets, ref, tol, *, sparse_rhs, itemsize):
        if kind == "bcsr" and sparse_rhs:
            return self.measure(case, kind, None, None, skip="BCSR @ is implemented for a sparse lhs only")
        elems = nse * other
        if elems > SPARSE_MAX_ELEMENTS:
            skip = (
                f"not run: the generic lowering (JAX's cuSPARSE lowering is off by default) materializes an "
                f"[nse={nse}, {other}] product, {elems * itemsize / 1e9:.0f} GB"
            )
            return self.measure(case, kind, None, None, skip=skip)
        return self.measure(case, kind, sparse_fn(kind, nse, sparse_rhs), sets[:2], ref=ref, tol=tol, slow=True, note=f"nse={nse}")

    # -- M axis backward --------------------------------------------------------------
    def m_backward(self):
        m, k, n = self.sizes.m_shape
        for dname in self.sizes.bwd_dtypes:
            dtype, prec, tol = DTYPES[dname]
            for density in self.sizes.m_densities:
                if not self.should_run(f"m_bwd {dname} live {density:.0%}"):
                    continue
                n_live = max(1, round(m * density))
                n_sets = self.rotations(common.np_bytes(*(jax.ShapeDtypeStruct(s, dtype) for s in ((m, k), (k, n), (m, n)))))
                sets = [make_m_set(jax.random.fold_in(self.key, 1000 * len(self.rows) + i), m=m, k=k, n=n, n_live=n_live, dtype=dtype, grad=True) for i in range(n_sets)]
                s0 = sets[0]
                g32 = s0["g"].astype(jnp.float32)
                ref_dx = jnp.where(s0["mask"][:, None], f32_product(s0["g"], s0["w"].T), 0)
                ref_dw = f32_product(s0["x"].T, s0["g"])
                ref = (ref_dx, ref_dw)
                ref_live = (ref_dx[s0["rows"]], ref_dw)
                ref_dense = (f32_product(s0["g"], s0["w"].T), ref_dw)  # dense dx has every row
                del g32
                case = {
                    "workload": "m_bwd", "pattern": "rows", "dtype": DTYPE_LABEL[dname], "shape": [m, k, n],
                    "density": density, "sparsity": round(1 - density, 6), "n_live": n_live, "precision": prec,
                    "what": "dx and dw of y = sparse_dense(x, w) given dy (jax.vjp; the forward is dead code)",
                }
                xwg = [(s["x"], s["w"], s["g"]) for s in sets]
                mm = functools.partial(jnp.matmul, precision=prec)
                before = len(self.rows)
                self.measure(case, "dense", lambda x, w, g: (mm(g, w.T), mm(x.T, g)), xwg, ref=ref_dense, tol=tol, note="dx = g @ w.T, dw = x.T @ g")
                self.measure(case, "oracle", lambda xl, w, gl: (mm(gl, w.T), mm(xl.T, gl)), [(s["x_live"], s["w"], s["g_live"]) for s in sets], ref=ref_live, tol=tol, note="dx_live = g_live @ w.T, dw = x_live.T @ g_live")

                def vjp_of(f):
                    def run(x, w, g, *rest):
                        _, back = jax.vjp(lambda x, w: f(x, w, *rest), x, w)
                        return back(g)

                    return run

                self.measure(case, "jnp_nonzero_cap", vjp_of(lambda x, w: jnp_rows(x, w, n_live, prec)), xwg, ref=ref, tol=tol, note=f"jax.vjp of jnp_nonzero_cap (size = {n_live})")
                if self.pit.available:
                    build, call, note, _ = self.pit.resolve("m", "row", prec, jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((k, n), dtype))
                    inside = self.pit.inside("m", "row", prec)
                    self.measure(case, "pit_jax", vjp_of(inside), xwg, ref=ref, tol=tol)
                    idx = [jax.jit(build)(s["x"]) for s in sets]
                    self.measure(case, "pit_jax_pre", vjp_of(call), [(s["x"], s["w"], s["g"], i) for s, i in zip(sets, idx)], ref=ref, tol=tol, note=note)
                    del idx
                else:
                    for impl in ("pit_jax", "pit_jax_pre"):
                        self.measure(case, impl, None, None, skip=self.pit_skip())
                self.finish_case(self.rows[before:], f"m_bwd {dname} live {density:.0%}")
                del sets, s0, ref, ref_live, ref_dense, xwg

    # -- K axis and weight blocks -------------------------------------------------------
    def kw(self, workload):
        m, k, n = self.sizes.kw_shape
        dtype, prec, tol = DTYPES["bf16"]
        itemsize = jnp.dtype(dtype).itemsize
        for wl, pattern, tile in KW_PATTERNS:
            if wl != workload:
                continue
            for sparsity in self.sizes.kw_sparsities:
                if not self.should_run(f"{wl} {pattern} sparsity {sparsity:g}"):
                    continue
                density = round(1 - sparsity, 6)
                n_sets = self.rotations(2 * m * k * itemsize)
                sets = [
                    make_kw_set(jax.random.fold_in(self.key, 1000 * len(self.rows) + i), m=m, k=k, n=n, density=density, axis=wl, tile=tile, pattern=pattern, dtype=dtype)
                    for i in range(n_sets)
                ]
                s0 = sets[0]
                ref = f32_product(s0["x"], s0["w"])
                live = np.stack([np.asarray(jax.device_get(s["live"])) for s in sets])  # [sets, tr, tc]
                per_group = live.sum(axis=2) if wl == "k" else live.sum(axis=1)
                cap = max(1, int(per_group.max()))
                src = "x" if wl == "k" else "w"
                nse = max(1, max(int(jnp.count_nonzero(s[src])) for s in sets))
                k_live = s0["x_o"].shape[1]
                case = {
                    "workload": wl, "pattern": pattern, "micro_tile": list(tile), "dtype": DTYPE_LABEL["bf16"], "shape": [m, k, n],
                    "sparsity": sparsity, "density": density, "measured_tile_density": float(live.mean()),
                    "element_density": nse / (m * k if wl == "k" else k * n), "k_live_oracle": k_live, "precision": prec,
                }
                xw = [(s["x"], s["w"]) for s in sets]
                mm = functools.partial(jnp.matmul, precision=prec)
                before = len(self.rows)
                self.measure(case, "dense", lambda x, w: mm(x, w), xw, ref=ref, tol=tol)
                self.measure(case, "oracle", lambda x, w: mm(x, w), [(s["x_o"], s["w_o"]) for s in sets], note=f"[{m}, {k_live}] @ [{k_live}, {n}] on random data")
                if wl == "k":
                    base = lambda x, w: jnp_k_tiles(x, w, cap, tile[0], prec)
                else:
                    base = lambda x, w: jnp_w_blocks(x, w, cap, tile[0], tile[1], prec)
                self.measure(case, "jnp_nonzero_cap", base, xw, ref=ref, tol=tol, note=f"nonzero size = {cap} per {'row' if wl == 'k' else 'column'} block")
                for kind in ("bcoo", "bcsr"):
                    self.sparse_baseline(case, kind, nse, m if wl == "w" else n, xw, ref, tol, sparse_rhs=wl == "w", itemsize=itemsize)
                if self.pit.available:
                    build, call, note, group_by = self.pit.resolve(wl, tile, prec, jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((k, n), dtype))
                    self.measure(case, "pit_jax", self.pit.inside(wl, tile, prec), xw, ref=ref, tol=tol)
                    idx = [jax.jit(build)(s[src]) for s in sets]
                    self.measure(case, "pit_jax_pre", call, [(s["x"], s["w"], i) for s, i in zip(sets, idx)], ref=ref, tol=tol, note=note,
                                 device=True)
                    del idx
                else:
                    for impl in ("pit_jax", "pit_jax_pre"):
                        self.measure(case, impl, None, None, skip=self.pit_skip())
                    group_by = "row" if wl == "k" else "col"
                n_live_tiles = [int(v) for v in live.reshape(len(sets), -1).sum(axis=1)]
                self.measure(
                    case, "index", lambda a: pit_jax.index(a, tile, group_by=group_by).arrays, [(s[src],) for s in sets],
                    count=n_live_tiles[0] if len(set(n_live_tiles)) == 1 else None, note=f"from {src}, group_by={group_by!r}",
                    device=True,
                )
                self.finish_case(self.rows[before:], f"{wl} {pattern} sparsity {sparsity:g}")
                del sets, s0, ref, xw


# ----------------------------------------------------------------------------------
# targets, table, plot

TARGETS = (
    ("m_bf16_f16", "M axis, bf16 and f16: pit_jax.sparse_dense <= 1.10x the oracle", 1.10),
    ("m_f32_tf32", "M axis, float32 with TF32 allowed: <= 1.15x the oracle", 1.15),
    ("kw_oracle", "K axis / weight blocks: <= 1.25x the oracle", 1.25),
    ("kw_vs_dense", "K axis / weight blocks: faster than dense from sparsity 0.5 on (speed-up > 1)", 1.0),
    ("index_share", "index construction <= 5% of the product it feeds, at 90% sparsity", 5.0),
    ("m_bwd", "M axis backward (dx, dw): <= 1.25x the oracle backward", 1.25),
)

# Why a target is missed: what the profiler and the harnesses showed (H100, bf16, the
# notes named). The results file carries this next to the margins (issue 4 asks for both);
# the numbers it quotes are from those notes, not from the run that writes the file.
WHY_MISSED = {
    "m_bf16_f16": (
        "Two costs the oracle does not pay. (1) The product itself (measured_precomputed_index) "
        "also writes the dead rows' zeros, 90 % of a 134 MB output at 10 % live (~25 us of the "
        "sm_90 kernel in a harness diagnostic), and runs whole rounds of tiles on 132 SMs (at 10 %, "
        "128 x 256 tiles made 2 rounds where the work filled 1.7; since 2026-12-01 the kernel takes "
        "128 x 208 tiles there, as cuBLAS does: 114 -> 104 us, cuBLAS 71 us); its consumer warps' cp.async gather of A "
        "runs 3-4 % slower than TMA reads of the same rows made contiguous (harness, H200, "
        "2026-11-29), but packing x first would cost more than that. (2) An index built from x inside the jit "
        "reads every dead row of x whole (a row is dead only once all of it is read) and the "
        "first 512 B of each live row: 121 MB at 10 % live, 41 us at the copy rate; the index "
        "kernel's rows mode takes 44 / 37 / 29 us of device time at 10 / 30 / 50 % live (48 us "
        "before it probed live rows, 2026-11-26; 62-65 us before 2026-11-25). At 10 % live, that "
        "read, the product's read of x's live rows and of w and one write of the whole output "
        "are 300 MB, 102 us at 2.93 TB/s, 1.16x the oracle: nothing that builds its index from x "
        "and returns the full output reaches 1.10x there. Stream-K over the last round (10 %: 1.70 "
        "rounds) was built and measured: its schedule alone saves 9-12 % of the product at 10 %, "
        "and its pieces' exchange through L2 cost as much (harness, H200, 2026-11-29). Running the "
        "index's pass under the product instead (its warps scan x's rows while it multiplies, each "
        "tile starting once its rows are listed) was built and measured in six variants: 1.04-1.14x "
        "the index pass + product at 30-50 % live and 1.4-1.8x at 10 %, its scan latency-bound at "
        "~1 TB/s (harness, H200, 2026-11-30). f16 reads "
        "slower than bf16 here because random f16 operands draw more tensor-core power: in the "
        "harness cuBLAS slows by the same 3.5 %, and with few-bit data both types run equal. "
        "docs/notes/sm90_row_gather.md, docs/notes/index_kernel.md."
    ),
    "m_f32_tf32": (
        "As for bf16 at twice the bytes: the product with a precomputed index pays the dead rows' "
        "zeros and whole rounds of tiles, and an index from f32 x reads its dead rows whole (242 MB "
        "at 10 % live). At 10 % live that read plus the product's reads and one write of the "
        "output are ~600 MB, 206 us at 2.93 TB/s, 1.16x the "
        "oracle. And TF32 wgmma reads B K-major only, so the call transposes w first: 32 us of "
        "kernel time at 4096 x 4096 on the H200, where the product runs at 1.04 / 1.08x the "
        "oracle at 30 / 50 % live and the whole call at 1.22 / 1.19x (kernel-time profile, "
        "2026-11-29; without the transpose 1.15 / 1.14x; a weight stored [N, K] and passed as w.T "
        "spares it: docs/kernels.md). docs/notes/sm90_row_gather.md."
    ),
    "kw_oracle": (
        "The oracle multiplies [M, K_live] by [K_live, N] with one K set for all rows. PIT's 32x1 "
        "strips (and 32x64 / 1x64 weight blocks) give every 32-row group (64-column block) its own "
        "K set, so the kernels re-read each group's live operand rows: 9.1 GB x density (K axis) and "
        "4.8 GB x density (weight blocks) of L2 -> SM traffic against 0.13 GB x density for the "
        "oracle's operands. Nsight Compute at sparsity 0.5 (sm_90 STile kernel): L2 at 33-54 % and "
        "DRAM at 7-35 % of peak; the cp.async gather's per-warp issue is the limit. 32x64 blocks run "
        "on the weight-block kernel since 2026-11-26 (one CTA per 256-row tile and column group, "
        "TMA slabs): 1.06x / 1.24x the oracle at sparsity 0.9 / 0.95 on the H100 (2026-11-26), "
        "0.93x / 1.07x on the H200 (2026-11-29), and at 0.99 a product's fixed cost (its stage "
        "chain, ~20-28 us against the oracle's 19-23) plus the index dominate. An index built from "
        "the operand adds 14-18 us of kernel time on the H200 since the walk modes (2026-11-29; "
        "20-53 us before). docs/notes/sm90_stile.md, docs/notes/sm90_wblock.md, "
        "docs/notes/index_kernel.md."
    ),
    "kw_vs_dense": (
        "At sparsity 0.5 the per-group re-reads (1.2 GB for weight blocks, 2.3 GB for 32x1 strips at "
        "4096^3) exceed what a dense product with 128 x 256 tiles moves from L2 (1.1-1.6 GB by count, "
        "with or without B multicast), so the gathered product is slower than dense there; 32x64 "
        "blocks on the weight-block kernel (2026-11-26) run the product alone at dense's time "
        "(0.99x on the H100, where the index from w's values made it 0.91x; 1.07x with the index "
        "on the H200, 2026-11-29). From sparsity 0.9 on it is at least as fast as dense on every "
        "pattern (1.00x for random 32x1 strips at 0.9 on the H100). "
        "docs/notes/sm90_stile.md, docs/notes/sm90_wblock.md."
    ),
    "index_share": (
        "Shares by device time where an entry's basis is 'device' (the index's kernels against the "
        "product's, from a profiler trace in the same run), else wall-clock upper bounds (~30 us of "
        "dispatch per call; from a row mask the index was 3.6-3.9 us of kernel time + ~1 us of init "
        "against a 124 us product, 4 %, profiler, 2026-11-23). Built from values the index must read "
        "every dead tile of its operand whole: x at 10 % live "
        "rows (121 MB, 41 us at the copy rate, a third of the product), a 4096^2 operand of the K / W "
        "axes (32 MB, 8 us at the H200's copy rate, 6-19 % of products of 0.04-0.14 ms; the "
        "index's two kernels take 14-18 us there, 2026-11-29): 5 % is below one read of the "
        "input. docs/benchmarks.md, docs/notes/index_kernel.md."
    ),
    "m_bwd": (
        "dx runs the row-gather product on dy (about the forward's speed) and writes the dead rows' "
        "zeros. dw = x_live^T dy_live: for K * N >= 2048^2 the live rows of x and dy are packed first "
        "(pit_sread_live: one more read + write of the live bytes, 18 / 45 / 72 us at 10 / 30 / 50 % on "
        "the H200) and the grouped weight-gradient kernel reads them by TMA in stages of 96 tokens "
        "(64 before 2026-11-29: a stage's fixed cost paced it): 0.096 / 0.239 / 0.375 ms against cuBLAS's "
        "0.085 / 0.239 / 0.352 ms on the same rows (harness, H200). What is left at 10 %: the index "
        "built inside the jit reads x's dead rows whole (33 us), the packing (18 us) and a dx at 1.64x "
        "cuBLAS's (13 row tiles of 128 x 256 make 2 rounds where cuBLAS's 128 x 208 fill theirs). "
        "H200 2026-11-29: 1.77 / 1.25 / 1.18x the oracle backward, 1.80 / 1.27 / 1.19x in a rerun and "
        "1.75 / 1.26 / 1.19x in a third "
        "(1.77 / 1.32 / 1.26x before): 30 % sat on the target's edge. Since 2026-11-30 dx reads the "
        "dy the weight gradient packs (one packing, merged by XLA's CSE) by TMA where the JVP saw both "
        "gradients taken (`with_b_grad`): dx 2.5-5 % faster, the call 1.67-1.76 / 1.21-1.27 / "
        "1.15-1.17x in three runs (30 % met in two: still on the edge). The 10 % case stays far "
        "off: the index (33 us), the packing and dx's second "
        "round of tiles. docs/notes/sm90_grouped.md, runs 11 and 21; docs/notes/sm90_row_gather.md, "
        "2026-11-30."
    ),
}


def _index_share(r):
    """An index row's share of the product it feeds, %: by the kernels' device time when both
    rows have it (GPU), else by wall-clock time (an upper bound: ~30 us of dispatch per call)."""
    return r.get("pct_of_product_device", r.get("pct_of_product"))


def _case_label(r):
    if r["workload"] in ("m", "m_bwd"):
        return f"{r['workload']} {r['dtype'].split()[0]} live {r['density']:g}"
    return f"{r['workload']} {r['pattern']} sparsity {r['sparsity']:g}"


def targets(rows, meta) -> list:
    """Each issue-4 target, its cases, whether met and the margin (positive = headroom)."""
    cases = {}
    for r in rows:
        cases.setdefault((r["workload"], r["pattern"], r["dtype"], r["density"]), {})[r["impl"]] = r
    out = []
    meaningful = meta.get("platform") == "gpu" and meta.get("pit_sparse_dense") == "present"
    for tid, text, limit in TARGETS:
        lower_is_better = tid != "kw_vs_dense"
        entries = []
        for (wl, pattern, dtype, density), by in cases.items():
            pit, pre = by.get("pit_jax", {}), by.get("pit_jax_pre", {})
            vals = []  # (variant, measured, measured with precomputed index)
            if tid == "m_bf16_f16" and wl == "m" and "float32" not in dtype:
                vals = [("pit_jax", pit.get("ratio_to_oracle"), pre.get("ratio_to_oracle"))]
            elif tid == "m_f32_tf32" and wl == "m" and "float32" in dtype:
                vals = [("pit_jax", pit.get("ratio_to_oracle"), pre.get("ratio_to_oracle"))]
            elif tid == "kw_oracle" and wl in ("k", "w"):
                vals = [("pit_jax", pit.get("ratio_to_oracle"), pre.get("ratio_to_oracle"))]
            elif tid == "kw_vs_dense" and wl in ("k", "w") and 1 - density >= 0.5 - 1e-9:
                vals = [("pit_jax", pit.get("speedup_vs_dense"), pre.get("speedup_vs_dense"))]
            elif tid == "m_bwd" and wl == "m_bwd":
                vals = [("pit_jax", pit.get("ratio_to_oracle"), pre.get("ratio_to_oracle"))]
            elif tid == "index_share" and wl in ("m", "k", "w") and abs(density - 0.1) < 1e-6:
                # device time where the trace has it (kernels of the index against those of the
                # product it feeds), else the wall-clock upper bound
                vals = [(name, _index_share(by[name]), None) for name in ("index", "index_mask") if name in by]
            for variant, measured, measured_pre in vals:
                e = {"case": _case_label(next(iter(by.values()))), "impl": variant, "measured": measured, "limit": limit}
                if tid == "index_share":
                    e["basis"] = "device" if "pct_of_product_device" in by[variant] else "wall"
                if measured_pre is not None:
                    e["measured_precomputed_index"] = measured_pre
                unspec = by.get("pit_jax_unspecified", {}).get("ratio_to_oracle")
                if tid in ("m_bf16_f16", "m_f32_tf32") and unspec is not None:
                    e["measured_dead_rows_unspecified"] = unspec  # reported beside; `met` is pit_jax's
                    if pit.get("median_ms") is not None and pre.get("median_ms") is not None:
                        e["index_ms_inside_jit"] = pit["median_ms"] - pre["median_ms"]
                if measured is None:
                    e["met"] = None
                elif lower_is_better:
                    e["met"] = measured <= limit
                    e["margin_pct"] = 100.0 * (limit - measured) / limit
                else:
                    e["met"] = measured > limit
                    e["margin_pct"] = 100.0 * (measured - limit) / limit
                entries.append(e)
        verdict = common.target_verdict(entries)
        out.append({
            "id": tid, "target": text, "limit": limit,
            "unit": "% of the product" if tid == "index_share" else ("speed-up over dense" if tid == "kw_vs_dense" else "x oracle"),
            **verdict, "meaningful": meaningful, "entries": entries,
            "why": WHY_MISSED[tid] if verdict["met"] is False and meaningful else None,  # H100 findings
        })
    return out


def rescore(path: str) -> list:
    """Rewrites the `targets` of an existing results file with this module's definitions
    (limits, margins, the reasons for a miss); the measurements are not touched."""
    return common.rescore_file(path, lambda data: targets(data["results"], data["meta"]))


def _cell(r: Optional[dict]) -> str:
    if r is None:
        return ""
    if r.get("median_ms") is None:
        return "err" if r.get("error") else "skip"
    s = f"{r['median_ms']:.4g}"
    return s + "!" if r.get("ok") is False else s


def summary_table(rows) -> str:
    cases = {}
    for r in rows:
        cases.setdefault((r["workload"], r["pattern"], r["dtype"], r["density"]), {})[r["impl"]] = r
    out = []
    for by in cases.values():
        any_r = next(iter(by.values()))
        pit, pre = by.get("pit_jax") or {}, by.get("pit_jax_pre") or {}

        def num(d, key, fmt="{:.3g}"):
            v = d.get(key)
            return "" if v is None else fmt.format(v)

        out.append({
            "case": _case_label(any_r), "dense": _cell(by.get("dense")), "oracle": _cell(by.get("oracle")),
            "pit": _cell(by.get("pit_jax")), "pit_pre": _cell(by.get("pit_jax_pre")),
            "pit/orc": num(pit, "ratio_to_oracle"), "pre/orc": num(pre, "ratio_to_oracle"),
            "xdense": num(pit, "speedup_vs_dense"),
            "index": _cell(by.get("index")), "idx%": num({"v": _index_share(by.get("index") or {})}, "v", "{:.2g}"),
            "pit_mask": _cell(by.get("pit_jax_mask")), "idx_mask": _cell(by.get("index_mask")),
            "jnp_all": _cell(by.get("jnp_nonzero_all")), "jnp_cap": _cell(by.get("jnp_nonzero_cap")),
            "bcoo": _cell(by.get("bcoo")), "bcsr": _cell(by.get("bcsr")),
        })
    cols = ["case", "dense", "oracle", "pit", "pit_pre", "pit/orc", "pre/orc", "xdense", "index", "idx%", "pit_mask", "idx_mask", "jnp_all", "jnp_cap", "bcoo", "bcsr"]
    return common.table(out, cols)


def targets_text(tgts) -> str:
    lines = []
    for t in tgts:
        if t["cases"] == 0:
            continue
        if t["met"] is None and t["worst"] is None:
            status = "NOT MEASURED"
        else:
            status = {True: "MET", False: "NOT MET", None: "PARTIAL DATA"}[t["met"]]
        w = t["worst"]
        worst = f"; worst {w['measured']:.3g} ({w['case']}, {w['impl']}, margin {w['margin_pct']:+.0f}%)" if w else ""
        lines.append(f"{status:13s} {t['target']}: {t['cases_met']}/{t['cases']} cases{worst}")
    return "\n".join(lines)


PLOT_IMPLS = (
    ("oracle", "k", "-", "oracle"),
    ("pit_jax", "tab:red", "-", "pit_jax"),
    ("pit_jax_pre", "tab:red", "--", "pit_jax, precomputed index"),
    ("pit_jax_mask", "tab:orange", ":", "pit_jax, index from mask"),
    ("jnp_nonzero_all", "tab:blue", "-", "jnp.nonzero(size=M)"),
    ("jnp_nonzero_cap", "tab:blue", "--", "jnp.nonzero(size=cap)"),
    ("bcoo", "tab:green", "-", "BCOO"),
    ("bcsr", "tab:green", "--", "BCSR"),
)


def plot_speedups(rows, path, meta):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = {}
    for r in rows:
        panels.setdefault((r["workload"], r["pattern"], r["dtype"]), []).append(r)
    if not panels:
        return
    ncol = min(4, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.4 * nrow), squeeze=False)
    for ax, ((wl, pattern, dtype), prs) in zip(axes.ravel(), panels.items()):
        for impl, color, style, label in PLOT_IMPLS:
            pts = sorted((r["density"], r["speedup_vs_dense"]) for r in prs if r["impl"] == impl and r.get("speedup_vs_dense"))
            if pts:
                ax.plot(*zip(*pts), color=color, linestyle=style, marker="o", markersize=3, label=label)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        dens = sorted({r["density"] for r in prs})
        ax.set_xticks(dens)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("density (live fraction)")
        ax.set_ylabel("speed-up over dense")
        shape = "x".join(str(v) for v in prs[0]["shape"])
        ax.set_title(f"{wl} {pattern} {dtype.split()[0]}\n{shape}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    note = " [pit_jax = STAND-IN]" if "stand-in" in str(meta.get("pit_sparse_dense")) else ""
    fig.suptitle(f"pit_jax.sparse_dense, {meta['device']}, jax {meta['jax']}, {meta['date'][:10]}{note}", fontsize=10)
    common.save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_out_argument(ap)
    ap.add_argument("--small", action="store_true", help="dims 256-512 (CPU smoke run)")
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(WORKLOADS)}")
    ap.add_argument("--stand-in", action="store_true", help="if pit_jax.sparse_dense is missing, use a pure-JAX stand-in (tests the suite; timings meaningless)")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failing rows")
    ap.add_argument(
        "--deadline-s", type=float, default=None,
        help="start no new case after this many seconds (default: 480 at full size, none with --small); "
        "cases not run are listed in the JSON (meta.not_run_deadline); 0 = no deadline",
    )
    ap.add_argument("--rescore", default=None, metavar="JSON",
                    help="only rewrite the targets of an existing results file (no timing, no device)")
    args = ap.parse_args(argv)
    if args.rescore:
        print(targets_text(rescore(args.rescore)))
        return
    if args.deadline_s is None:
        args.deadline_s = 0 if args.small else 480
    only = WORKLOADS
    if args.only:
        only = tuple(w.strip() for w in args.only.split(",") if w.strip())
        bad = [w for w in only if w not in WORKLOADS]
        if bad:
            ap.error(f"--only: unknown workload(s) {bad}; choose from {WORKLOADS}")
    suite = Suite(args)
    print(f"{suite.meta['device']} ({suite.meta['platform']}), jax {suite.meta['jax']}, pit_jax.sparse_dense: {suite.meta['pit_sparse_dense']}", flush=True)
    steps = {"m": suite.m_forward, "m_bwd": suite.m_backward, "k": lambda: suite.kw("k"), "w": lambda: suite.kw("w")}
    for wl in WORKLOADS:
        if wl in only:
            steps[wl]()
            suite.flush(plot=True)
    suite.flush(plot=True)
    print()
    print(summary_table(suite.rows))
    print("ms, median of one call; '!' = result check failed; skip/err: see the JSON ('skipped' / 'error')")
    reasons = sorted({f"{r['impl']}: {r.get('skipped') or r.get('error')}" for r in suite.rows if r.get("median_ms") is None})
    for reason in reasons[:12]:
        print("  " + reason)
    if len(reasons) > 12:
        print(f"  ... and {len(reasons) - 12} more (JSON)")
    print()
    tg = targets(suite.rows, suite.meta)
    print("issue-4 targets" + ("" if tg and tg[0]["meaningful"] else " (NOT meaningful here: CPU or no real pit_jax.sparse_dense)") + ":")
    print(targets_text(tg))
    print(f"wrote {suite.path} (+ .png); {suite.elapsed():.0f} s")


if __name__ == "__main__":
    main()
