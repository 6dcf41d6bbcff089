"""Regenerate the STile database for this GPU: time every variant, fit its costs, write JSON.

    python -m benchmarks.profile_stiles [--out PATH] [--smoke] [--dtypes bfloat16,tf32,float16]
                                        [--update] [--refit] [--deadline-s S] [--verbose]

The one command behind `pit_jax/stile_db/<gpu-model>.json` (docs/optimizer.md). For each
dtype and each variant of `pit_jax.optimizer.database.CATALOG` it times, on random
patterns at the variant's own micro-tile (exactly round(density * tiles) live):
  - the index, `pit_jax.index(operand, micro_tile, group_by=...)` as sparse_dense builds it,
  - the product with that index precomputed, `pit_jax.sparse_dense(x, w, index, ...)`,
  - the dense product (`x @ w` as a dense plan runs it) on a few shapes,
with the timing helpers of `benchmarks/common.py` (on a GPU the device time: see
`Profiler.time`), then fits each variant's cost terms (non-negative least squares on
relative error, over the cost model's features) and writes the database with the raw
timings it was fit from. The JSON is rewritten after every variant, so an interrupted
run leaves what it finished (variants with no timing are left out: the optimizer then
never picks them). No new case starts after --deadline-s (default 230 s; one dtype takes
about 260 s on an H100, so profile one dtype per run with --update, which keeps the
file's other dtypes). --refit times nothing: it fits the file's entries again from their
stored timings (an M-axis entry whose dtype now runs another compute tile,
`database.compute_tile`, gets its features counted again at that tile). Every write
marks the sparse variants that never ran below 0.8x dense's time (`dominated_by_dense`:
the planner never picks them). `--smoke`: tiny shapes, for the CPU (exercises the code;
the numbers mean nothing; written under /tmp by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import pit_jax
from benchmarks import common
from benchmarks.bench_sparse_dense import f32_product, make_kw_set, make_m_set, rel_err
from pit_jax.ops.sparse_dense import dense_product
from pit_jax.optimizer import cost_model
from pit_jax.optimizer import database as dbm

# database dtype -> (array dtype, precision passed to the products, relative tolerance)
RUN_DTYPES = {
    "bfloat16": (jnp.bfloat16, None, 2e-2),
    "float16": (jnp.float16, None, 4e-3),
    "tf32": (jnp.float32, "tensorfloat32", 8e-3),
    "float32": (jnp.float32, "highest", 1e-4),
}


@dataclasses.dataclass(frozen=True)
class Config:
    shapes: tuple  # (M, K, N) for every variant
    w_shapes: tuple  # extra shapes for the weight-block (W axis) variants and the dense fit
    dense_shapes: tuple  # extra shapes for the dense fit
    sparsities: tuple
    dtypes: tuple
    reps: int
    target_s: float
    max_sets: int


FULL = Config(
    shapes=((4096, 4096, 4096), (8192, 2048, 2048)),
    # Two BERT-base training products (4096 tokens: qkv, ffn_out) for the W axis, whose
    # plans choose per pruned linear at that size: a fixed cost fit at 4096^3 alone was
    # extrapolated to products 10x smaller. Not for the M and K axes: their features do
    # not model the row-gather kernel's split-K or its rounds of tiles, and a fit over
    # both sizes underestimated a 4096^3 product with every row live by 35 % (H100,
    # 2026-11-26; docs/optimizer.md).
    w_shapes=((4096, 768, 2304), (4096, 3072, 768)),
    dense_shapes=((2048, 2048, 2048), (16384, 4096, 4096), (1024, 1024, 4096)),
    sparsities=(0.5, 0.9, 0.99),
    dtypes=("bfloat16", "tf32", "float16"),
    reps=7,
    target_s=0.01,
    max_sets=4,
)
SMOKE = Config(
    shapes=((128, 256, 256),),
    w_shapes=((64, 128, 256),),
    dense_shapes=((64, 128, 128),),
    sparsities=(0.5, 0.9),
    dtypes=("bfloat16",),
    reps=2,
    target_s=0.001,
    max_sets=2,
)


def fit(features: np.ndarray, ms: np.ndarray):
    """Non-negative cost terms minimising the relative error of features @ terms vs ms."""
    a = features / ms[:, None]
    b = np.ones(len(ms))
    try:
        from scipy.optimize import nnls

        terms, _ = nnls(a, b)
    except Exception:  # noqa: BLE001 - no scipy: least squares, clipped
        terms = np.clip(np.linalg.lstsq(a, b, rcond=None)[0], 0, None)
    rel = features @ terms / ms - 1
    return terms, {"rel_rms": float(np.sqrt(np.mean(rel**2))), "max_rel_err": float(np.abs(rel).max()), "n": int(len(ms))}


def fit_entry(kind, micro_tile, compute_tile, dtype_key, description, rows):
    """A database entry: the variant's cost terms fit to its timing rows (kept in it)."""
    ms = np.array([r["product_ms"] for r in rows])
    p_terms, p_fit = fit(np.array([r["product_features"] for r in rows]), ms)
    entry = {
        "kind": kind, "micro_tile": micro_tile, "compute_tile": compute_tile, "dtype": dtype_key,
        "description": description,
        "product": dict(zip(dbm.PRODUCT_TERMS, map(float, p_terms))),
        "fit": {"product": p_fit},
    }
    if kind != "dense":
        i_terms, i_fit = fit(np.array([r["index_features"] for r in rows]), np.array([r["index_ms"] for r in rows]))
        entry["index"] = dict(zip(dbm.INDEX_TERMS, map(float, i_terms)))
        entry["fit"]["index"] = i_fit
    entry["timings"] = rows
    return entry


# A sparse variant whose product never ran below this fraction of dense's time at the
# same shape, even at its sparsest profiled case, is marked dominated: the planner never
# picks it. Real STiles reach 0.1-0.5x dense at 99 % sparsity; a variant that CUDA runs
# as a masked dense product (float32 K-axis 32x1, 1x64 weight strips) stays at ~0.9-1.0x,
# and fitting density-scaled cost terms to its flat times predicts it fast.
DOMINATED_RATIO = 0.8


def mark_dominated(entries):
    """Sets (or clears) each sparse entry's "dominated_by_dense" from its timings and
    the dense entry of its dtype (the same shapes are profiled for both)."""
    dense = {e["dtype"]: {tuple(r["shape"]): r["product_ms"] for r in e["timings"]} for e in entries if e["kind"] == "dense"}
    for e in entries:
        e.pop("dominated_by_dense", None)
        if e["kind"] == "dense":
            continue
        ref = dense.get(e["dtype"], {})
        ratios = [r["product_ms"] / ref[tuple(r["shape"])] for r in e["timings"] if ref.get(tuple(r["shape"]))]
        if ratios and min(ratios) >= DOMINATED_RATIO:
            e["dominated_by_dense"] = (f"its product took >= {min(ratios):.2f}x dense's time in all {len(ratios)} "
                                       f"profiled cases (threshold {DOMINATED_RATIO})")


class Profiler:
    def __init__(self, args):
        self.args = args
        self.cfg = SMOKE if args.smoke else FULL
        if args.dtypes:
            self.cfg = dataclasses.replace(self.cfg, dtypes=tuple(d.strip() for d in args.dtypes.split(",") if d.strip()))
        self.t0 = time.perf_counter()
        self.meta = common.device_info()
        dev = jax.devices()[0]
        self.slots = int(getattr(dev, "core_count", 0) or dbm.DEFAULT_PARALLEL_SLOTS)
        slug = dbm.device_slug(self.meta["device"])
        if args.out:
            self.path = args.out
        elif args.smoke:
            self.path = os.path.join(tempfile.gettempdir(), f"stile_db_smoke_{slug}.json")
        else:
            self.path = os.path.join(dbm.DB_DIR, slug + ".json")
        self.entries: list[dict] = []
        self.not_run: list[str] = []
        self.errors: list[str] = []
        self.key = jax.random.key(0)
        self.n = 0
        self.profile_extra = {}

    def elapsed(self):
        return time.perf_counter() - self.t0

    def log(self, text):
        print(f"[{self.elapsed():6.1f}s] {text}", flush=True)

    def should_run(self, label):
        if self.args.deadline_s and self.elapsed() > self.args.deadline_s:
            self.not_run.append(label)
            return False
        return True

    def next_key(self):
        self.n += 1
        return jax.random.fold_in(self.key, self.n)

    def time(self, fn, sets, **kw):
        """time_op's result, its "ms" the device time on a GPU (else the wall time).

        A small op jitted alone is bound by the host: at BERT-base sizes a weight-block
        product of ~14 us of kernel time read ~30 us of wall time per call, and its index
        ~40 us (H100, 2026-11-26). Inside a model's jitted step, whose kernels XLA
        replays from command buffers, an op costs about its kernels' time, so that is
        what the database is fit to: the summed kernel durations of a profiler trace
        ("device_ms"), with the wall time kept beside it ("wall_ms")."""
        device_calls = self.args.device_calls if jax.default_backend() == "gpu" else 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = common.time_op(fn, sets, reps=self.cfg.reps, target_s=self.cfg.target_s, budget_s=2.0,
                               device_calls=device_calls, **kw)
        t["wall_ms"] = t["median_ms"]
        t["ms"] = t.get("device_ms") or t["median_ms"]
        return t

    def fail(self, label, e):
        msg = str(e).strip().splitlines()
        self.errors.append(f"{label}: {type(e).__name__}: {msg[0][:300] if msg else ''}")
        self.log(f"{label}: FAILED {self.errors[-1]}")
        if self.args.verbose:
            traceback.print_exc()

    # -- dense -------------------------------------------------------------------------
    def dense(self, dtype_key):
        dtype, prec, _ = RUN_DTYPES[dtype_key]
        spec = dbm.spec_for("dense", None)
        template = dbm.Variant("dense", None, dbm.compute_tile(spec, dtype_key), dtype_key, (0, 0, 0), (0, 0, 0))
        rows = []
        for m, k, n in self.shapes_for("dense"):
            label = f"{dtype_key} dense {m}x{k}x{n}"
            if not self.should_run(label):
                continue
            try:
                item = jnp.dtype(dtype).itemsize
                sets = [
                    (common.random_normal(self.next_key(), (m, k), dtype), common.random_normal(self.next_key(), (k, n), dtype))
                    for _ in range(common.rotations(item * (m * k + k * n), self.cfg.max_sets))
                ]
                t = self.time(lambda x, w: dense_product(x, w, prec), sets)
                prob = cost_model.Problem("x", 1, m, k, n, item)
                pf, _, _ = cost_model.features(template, None, prob, self.slots)
                rows.append({"shape": [m, k, n], "sparsity": 0.0, "product_ms": t["ms"], "product_wall_ms": t["wall_ms"],
                             "product_features": list(pf)})
                self.log(f"{label}: {t['ms']:.4g} ms (wall {t['wall_ms']:.4g})")
                del sets
            except Exception as e:  # noqa: BLE001 - one failing case must not stop the run
                self.fail(label, e)
        self.add(spec, dtype_key, rows)

    def shapes_for(self, kind):
        cfg = self.cfg
        if kind == "dense":
            return (*cfg.shapes, *cfg.w_shapes, *cfg.dense_shapes)
        return (*cfg.shapes, *cfg.w_shapes) if kind == "w" else cfg.shapes

    # -- sparse variants ---------------------------------------------------------------
    def variant(self, spec, dtype_key):
        dtype, prec, tol = RUN_DTYPES[dtype_key]
        item = jnp.dtype(dtype).itemsize
        template = dbm.Variant(spec.kind, spec.micro_tile, dbm.compute_tile(spec, dtype_key), dtype_key, (0, 0, 0), (0, 0, 0))
        rows = []
        for m, k, n in self.shapes_for(spec.kind):
            for sparsity in self.cfg.sparsities:
                label = f"{dtype_key} {dbm.variant_id(spec.kind, spec.micro_tile, dtype_key)} {m}x{k}x{n} sparsity {sparsity:g}"
                if not self.should_run(label):
                    continue
                try:
                    rows.append(self.case(spec, template, dtype, prec, tol, item, (m, k, n), sparsity, label))
                except Exception as e:  # noqa: BLE001
                    self.fail(label, e)
        self.add(spec, dtype_key, rows)

    def case(self, spec, template, dtype, prec, tol, item, shape, sparsity, label):
        m, k, n = shape
        density = round(1 - sparsity, 6)
        n_sets = common.rotations(item * (m * k + k * n), self.cfg.max_sets)
        h, w = spec.micro_tile
        if spec.kind == "m":
            n_live = max(1, round(m / h * density))
            sets = [make_m_set(self.next_key(), m=m, k=k, n=n, n_live=n_live, dtype=dtype, grad=False) for _ in range(n_sets)]
            tile, group_by = (h, None), None
        else:
            sets = [
                make_kw_set(self.next_key(), m=m, k=k, n=n, density=density, axis=spec.kind, tile=spec.micro_tile,
                            pattern="random", dtype=dtype)
                for _ in range(n_sets)
            ]
            tile, group_by = spec.micro_tile, "both"
        src = "w" if spec.kind == "w" else "x"
        owners = [s[src] for s in sets]
        build = jax.jit(lambda a: pit_jax.index(a, "row" if spec.kind == "m" else tile, group_by=group_by))
        t_index = self.time(lambda a: build(a).arrays, [(o,) for o in owners])
        idx = [build(o) for o in owners]
        call = lambda x, w, i: pit_jax.sparse_dense(x, w, i, axis=spec.kind, precision=prec)  # noqa: E731
        t_prod = self.time(call, [(s["x"], s["w"], i) for s, i in zip(sets, idx)], keep_output=True)
        err = float(rel_err(t_prod.pop("output"), f32_product(sets[0]["x"], sets[0]["w"])))
        mask = cost_model.nonzero_mask(np.asarray(jax.device_get(owners[0])))
        if spec.kind == "w":
            prob = cost_model.Problem("w", 1, m, k, n, item)
        else:
            prob = cost_model.Problem("x", 1, m, k, n, item)
        pf, xf, dens = cost_model.features(template, cost_model.Coverage(mask), prob, self.slots)
        row = {
            "shape": [m, k, n], "sparsity": sparsity, "density": dens,
            "product_ms": t_prod["ms"], "index_ms": t_index["ms"],
            "product_wall_ms": t_prod["wall_ms"], "index_wall_ms": t_index["wall_ms"],
            "product_features": list(pf), "index_features": list(xf),
            "max_rel_err": err, "ok": bool(err <= tol),
        }
        check = "" if row["ok"] else f"  CHECK FAILED (rel err {err:.2g})"
        self.log(f"{label}: product {row['product_ms']:.4g} ms (wall {row['product_wall_ms']:.4g}), index "
                 f"{row['index_ms']:.4g} ms (wall {row['index_wall_ms']:.4g}), {dens:.1%} live{check}")
        del sets, owners, idx
        return row

    # -- fitting and output ----------------------------------------------------------------
    def add(self, spec, dtype_key, rows):
        rows = [r for r in rows if r.get("ok", True)]
        if not rows:
            self.log(f"{dtype_key} {spec.kind} {spec.micro_tile}: no timings, left out of the database")
            return
        entry = fit_entry(spec.kind, None if spec.micro_tile is None else list(spec.micro_tile),
                          list(dbm.compute_tile(spec, dtype_key)), dtype_key, spec.description, rows)
        self.entries.append(entry)
        fits = ", ".join(f"{k} rel rms {v['rel_rms']:.1%}" for k, v in entry["fit"].items())
        self.log(f"fit {dbm.variant_id(spec.kind, spec.micro_tile, dtype_key)}: {fits}")
        self.flush()

    def refit(self):
        """--refit: every entry of the output file fit again from its stored timings, at
        the shapes this version profiles for its kind (no GPU needed)."""
        with open(self.path) as f:
            old = json.load(f)
        for v in old["variants"]:
            shapes = {tuple(s) for s in self.shapes_for(v["kind"])}
            rows = [r for r in v["timings"] if tuple(r["shape"]) in shapes and r.get("ok", True)]
            if not rows:
                self.log(f"{v['kind']} {v['micro_tile']} {v['dtype']}: no timings at these shapes, left out")
                continue
            spec = dbm.spec_for(v["kind"], v["micro_tile"])
            tile = list(dbm.compute_tile(spec, v["dtype"])) if spec else v["compute_tile"]
            if tile != list(v["compute_tile"]):
                rows = self.retiled(v, tile, rows)
                if rows is None:
                    self.entries.append(v)
                    continue
            self.entries.append(fit_entry(v["kind"], v["micro_tile"], tile, v["dtype"], v.get("description", ""), rows))
            dropped = len(v["timings"]) - len(rows)
            self.log(f"refit {dbm.variant_id(v['kind'], v['micro_tile'], v['dtype'])} from {len(rows)} timings"
                     + (f" ({dropped} at other shapes left out)" if dropped else ""))
        # The file describes the profiled GPU, not this machine.
        self.meta = {**self.meta, **{k: old[k] for k in ("device", "platform", "date", "host", "jax", "jaxlib", "pit_jax",
                                                         "pit_jax_build") if k in old}}
        self.slots = int(old.get("parallel_slots", self.slots))
        self.profile_extra = {"refit_of": old.get("profile"), **self.profile_extra}
        self.flush()
        self.log(f"wrote {self.path}: {len(self.entries)} variants")
        return self.path

    def retiled(self, v, tile, rows):
        """`rows` with their product features counted at the compute tile `tile` (the
        catalog's for this dtype changed since the profile). An M-axis timing's features
        follow from its shape and live-row count alone; other kinds need their patterns,
        so their entries are kept as they are (None) until profiled again."""
        label = dbm.variant_id(v["kind"], v["micro_tile"], v["dtype"])
        if v["kind"] != "m":
            self.log(f"{label}: compute tile {v['compute_tile']} -> {tile} needs a new profile; entry kept as it is")
            return None
        item = jnp.dtype(RUN_DTYPES[v["dtype"]][0]).itemsize
        template = dbm.Variant("m", tuple(v["micro_tile"]), tuple(tile), v["dtype"], (0, 0, 0), (0, 0, 0))
        out = []
        for r in rows:
            m, k, n = r["shape"]
            mask = np.zeros((m, 1), bool)  # an M-axis product's features count live rows only
            mask[: round(r["density"] * m)] = True
            pf, _, _ = cost_model.features(template, cost_model.Coverage(mask), cost_model.Problem("x", 1, m, k, n, item),
                                           self.slots)
            out.append({**r, "product_features": list(pf)})
        self.log(f"{label}: features recounted at compute tile {tile} (was {v['compute_tile']})")
        self.profile_extra.setdefault("retiled", []).append(f"{label}: features recounted at {tile} (was {v['compute_tile']})")
        return out

    def flush(self):
        if not any(e["kind"] == "dense" for e in self.entries):
            return  # a database without dense is invalid; written once dense is in
        mark_dominated(self.entries)
        meta = {k: v for k, v in self.meta.items() if k != "device"}
        doc = dbm.document(
            self.meta["device"],
            self.entries,
            **meta,
            profile={
                "argv": sys.argv[1:], "smoke": bool(self.args.smoke), "config": dataclasses.asdict(self.cfg),
                "wall_s": round(self.elapsed(), 1), "not_run_deadline": self.not_run, "errors": self.errors,
                "timing": ("benchmarks/common.py time_op over rotated input sets; *_ms: on a GPU the summed kernel "
                           f"durations per op of a profiler trace of {self.args.device_calls} calls (device_ms), else "
                           "the median wall ms of one call; *_wall_ms: the wall time"),
                "patterns": "random live micro-tiles of the variant's own shape (m: random live rows)",
                **self.profile_extra,
            },
        )
        doc["parallel_slots"] = self.slots
        dbm.parse(json_roundtrip(doc), self.path)  # never write a file the optimizer cannot read
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, self.path)

    def keep_other_dtypes(self):
        """--update: the existing file's entries of the dtypes not profiled now stay."""
        if not (self.args.update and os.path.exists(self.path)):
            return
        with open(self.path) as f:
            old = json.load(f)
        kept = [v for v in old.get("variants", []) if v.get("dtype") not in self.cfg.dtypes]
        self.entries.extend(kept)
        self.log(f"--update: kept {len(kept)} entries of other dtypes from {self.path}")

    def run(self):
        self.log(f"{self.meta['device']} ({self.meta['platform']}), jax {self.meta['jax']}, {self.slots} parallel slots -> {self.path}")
        self.keep_other_dtypes()
        for dtype_key in self.cfg.dtypes:
            self.dense(dtype_key)
            for spec in dbm.CATALOG:
                if spec.kind != "dense":
                    self.variant(spec, dtype_key)
        self.flush()
        self.log(
            f"wrote {self.path}: {len(self.entries)} variants, {len(self.not_run)} cases past the deadline, "
            f"{len(self.errors)} errors"
        )
        return self.path


def json_roundtrip(doc):
    return json.loads(json.dumps(doc))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="output file (default pit_jax/stile_db/<gpu-model>.json; --smoke: /tmp)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes for the CPU: exercises the code, numbers meaningless")
    ap.add_argument("--dtypes", default=None, help=f"comma-separated subset of {','.join(RUN_DTYPES)}")
    ap.add_argument("--deadline-s", type=float, default=None, help="start no new case after S seconds (default 230; --smoke: none; 0 = none)")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failing cases")
    ap.add_argument("--device-calls", type=int, default=5,
                    help="calls traced per timing for the device time (GPU; 0: fit the wall time)")
    ap.add_argument("--refit", action="store_true",
                    help="no timing: fit the output file's entries again from their stored timings (at this version's shapes)")
    ap.add_argument("--update", action="store_true",
                    help="keep the output file's entries of the dtypes not in --dtypes (profile one dtype at a time)")
    args = ap.parse_args(argv)
    if args.deadline_s is None:
        args.deadline_s = 0 if args.smoke else 230
    if args.dtypes:
        bad = [d for d in args.dtypes.split(",") if d.strip() and d.strip() not in RUN_DTYPES]
        if bad:
            ap.error(f"--dtypes: unknown {bad}; choose from {list(RUN_DTYPES)}")
    profiler = Profiler(args)
    return profiler.refit() if args.refit else profiler.run()


if __name__ == "__main__":
    main()
