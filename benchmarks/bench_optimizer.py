"""Calibration of the STile optimizer (issue 6): does `pit_jax.plan` pick the fastest STile?

    python -m benchmarks.bench_optimizer [--out DIR] [--smoke] [--database PATH] [--dtype bfloat16|float16|tf32|float32]
                                         [--compare-database PATH] [--deadline-s S] [--verbose]

For every pattern of the sweep it plans from a sample (the operand itself, copied to the
host), then times EVERY candidate the plan costed (dense, and each PIT axis and
micro-tile that fits the sparse operand) with the index built inside the timed call, as
`sparse_dense(x, w, plan=p)` runs it. Reported per pattern: the optimizer's choice and
its measured time, the best measured time over all candidates in hindsight, dense, the
predicted times and the planning time. Targets (docs/optimizer.md):
  - the choice is within 10 % of the hindsight best on >= 90 % of the patterns,
  - the choice is never more than 5 % slower than dense,
  - planning a 4096 x 4096 sample takes < 50 ms on the host.
Patterns (4096^3, sparsity 0.5 / 0.9 / 0.95 / 0.99 of the pattern's blocks):
  x_<h>x<w>   random live h x w blocks of x (PIT Fig. 15/16 granularities 1x1 .. 32x64)
  rows        random live token rows of x
  neuron      neuron-structured 32x1 blocks of x (ReLU-FFN-like, see bench_sparse_dense)
  w_<h>x<w>   random live h x w blocks of the weight
--compare-database also plans every pattern with a second database (e.g. another GPU
model's file) and scores its choice against the same measurements, so one sweep tells
whether a device needs a database of its own. Writes JSON (and a PNG) under
benchmarks/results/ after every pattern; --smoke is a tiny CPU run (the numbers mean
nothing there).
"""

from __future__ import annotations

import argparse
import sys
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
from pit_jax.optimizer import database as dbm
from pit_jax.optimizer.plan import describe

DTYPES = {"bfloat16": (jnp.bfloat16, None, 2e-2), "float16": (jnp.float16, None, 4e-3), "tf32": (jnp.float32, "tensorfloat32", 8e-3),
          "float32": (jnp.float32, "highest", 1e-4)}  # float32: exact (the H200 file has it; elsewhere the heuristic plans it)

# (name, operand, generator, micro-tile of the pattern)
# Ordered so that a run cut by the deadline still covers every kind of pattern.
PATTERNS_FULL = (
    ("x_1x1", "x", "random", (1, 1)),
    ("x_32x1", "x", "random", (32, 1)),
    ("x_32x64", "x", "random", (32, 64)),
    ("rows", "x", "rows", None),
    ("w_32x64", "w", "random", (32, 64)),
    ("neuron", "x", "neuron_32x1", (32, 1)),
    ("w_1x64", "w", "random", (1, 64)),
    ("x_8x8", "x", "random", (8, 8)),
    ("x_1x64", "x", "random", (1, 64)),
    ("x_32x32", "x", "random", (32, 32)),
)
PATTERNS_SMOKE = (
    ("x_1x1", "x", "random", (1, 1)),
    ("x_32x1", "x", "random", (32, 1)),
    ("rows", "x", "rows", None),
    ("neuron", "x", "neuron_32x1", (32, 1)),
    ("w_32x64", "w", "random", (32, 64)),
)
WITHIN = 1.10  # chosen <= 1.10 x hindsight best
VS_DENSE = 1.05  # chosen <= 1.05 x dense
PLAN_MS = 50.0  # planning a 4096 x 4096 sample


class Sweep:
    def __init__(self, args):
        self.args = args
        self.smoke = args.smoke
        self.shape = (256, 256, 256) if self.smoke else (4096, 4096, 4096)
        self.sparsities = (0.5, 0.9) if self.smoke else (0.5, 0.9, 0.95, 0.99)
        self.patterns = PATTERNS_SMOKE if self.smoke else PATTERNS_FULL
        self.reps, self.target_s, self.max_sets = (2, 0.001, 2) if self.smoke else (7, 0.01, 4)
        self.dtype_key = args.dtype
        self.t0 = time.perf_counter()
        self.key = jax.random.key(1)
        self.n = 0
        self.rows: list[dict] = []
        self.not_run: list[str] = []
        self.db = dbm.get(args.database)
        self.other_db = dbm.get(args.compare_database) if args.compare_database else None
        self.meta = common.device_info()
        self.meta.update(
            suite="optimizer", smoke=self.smoke, argv=sys.argv[1:], database=self.db.describe(),
            database_source=self.db.source, dtype=self.dtype_key, shape=list(self.shape),
            timing="benchmarks/common.py time_op: median ms of one call, index built inside the timed call",
        )
        if self.other_db is not None:
            self.meta.update(compare_database=self.other_db.describe(), compare_database_source=self.other_db.source)
        self.path = None

    def elapsed(self):
        return time.perf_counter() - self.t0

    def next_key(self):
        self.n += 1
        return jax.random.fold_in(self.key, self.n)

    def sets(self, operand, gen, tile, sparsity, dtype):
        m, k, n = self.shape
        density = round(1 - sparsity, 6)
        item = jnp.dtype(dtype).itemsize
        count = common.rotations(item * (m * k + k * n), self.max_sets)
        if gen == "rows":
            n_live = max(1, round(m * density))
            return [make_m_set(self.next_key(), m=m, k=k, n=n, n_live=n_live, dtype=dtype, grad=False) for _ in range(count)]
        axis = "w" if operand == "w" else "k"
        return [
            make_kw_set(self.next_key(), m=m, k=k, n=n, density=density, axis=axis, tile=tile, pattern=gen, dtype=dtype)
            for _ in range(count)
        ]

    def time(self, fn, sets, **kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return common.time_op(fn, sets, reps=self.reps, target_s=self.target_s, budget_s=2.0, **kw)

    def pattern(self, name, operand, gen, tile, sparsity):
        dtype, prec, tol = DTYPES[self.dtype_key]
        m, k, n = self.shape
        sets = self.sets(operand, gen, tile, sparsity, dtype)
        owner = np.asarray(jax.device_get(sets[0][operand]))

        def plan(db):
            if operand == "x":
                return pit_jax.plan(owner, (k, n), dtype, precision=prec, database=db)
            return pit_jax.plan(owner, dtype=dtype, operand="w", x_shape=(m, k), precision=prec, database=db)

        t0 = time.perf_counter()
        p = plan(self.db)
        plan_ms = (time.perf_counter() - t0) * 1e3
        other = None if self.other_db is None else plan(self.other_db)
        ref = f32_product(sets[0]["x"], sets[0]["w"])
        xw = [(s["x"], s["w"]) for s in sets]
        measured = []
        for c in p.candidates:
            label = describe(c.axis, c.micro_tile)
            entry = {"stile": label, "axis": c.axis, "micro_tile": None if c.micro_tile is None else list(c.micro_tile),
                     "predicted_ms": c.expected_ms, "density": c.density}
            try:
                if c.is_dense:
                    fn = lambda x, w: dense_product(x, w, prec)  # noqa: E731
                else:
                    fn = lambda x, w, c=c: pit_jax.sparse_dense(x, w, axis=c.axis, micro_tile=c.micro_tile, precision=prec)  # noqa: E731
                t = self.time(fn, xw, keep_output=True)
                err = float(rel_err(t.pop("output"), ref))
                entry.update(measured_ms=t["median_ms"], min_ms=t["min_ms"], max_ms=t["max_ms"], max_rel_err=err, ok=err <= tol)
            except Exception as e:  # noqa: BLE001 - one failing candidate must not stop the sweep
                msg = str(e).strip().splitlines()
                entry.update(measured_ms=None, error=f"{type(e).__name__}: {msg[0][:300] if msg else ''}")
                if self.args.verbose:
                    traceback.print_exc()
            measured.append(entry)
        del sets, xw, ref
        ok = [e for e in measured if e.get("measured_ms") is not None and e.get("ok")]

        def measured_choice(plan):  # the entry measured for `plan`'s choice (None: not a candidate of p)
            return next((e for e, c in zip(measured, p.candidates) if (c.axis, c.micro_tile) == (plan.axis, plan.micro_tile)), None)

        chosen = measured_choice(p)
        dense = next((e for e in measured if e["axis"] is None), None)
        row = {
            "pattern": name, "operand": operand, "pattern_tile": None if tile is None else list(tile),
            "sparsity": sparsity, "shape": list(self.shape), "dtype": self.dtype_key,
            "plan_ms": plan_ms, "plan": str(p), "chosen": chosen["stile"], "candidates": measured,
        }
        if ok and chosen.get("measured_ms") is not None and chosen.get("ok"):
            best = min(ok, key=lambda e: e["measured_ms"])
            row.update(
                chosen_ms=chosen["measured_ms"], best=best["stile"], best_ms=best["measured_ms"],
                ratio_to_best=chosen["measured_ms"] / best["measured_ms"],
                within_10pct=chosen["measured_ms"] <= WITHIN * best["measured_ms"],
            )
            if dense and dense.get("measured_ms"):
                row.update(dense_ms=dense["measured_ms"], ratio_to_dense=chosen["measured_ms"] / dense["measured_ms"],
                           not_slower_than_dense=chosen["measured_ms"] <= VS_DENSE * dense["measured_ms"])
            if other is not None:
                # The same candidates were measured whatever the database; only its costs differ.
                pick = measured_choice(other)
                row["compare"] = {"chosen": describe(other.axis, other.micro_tile)}
                if pick is not None and pick.get("measured_ms") is not None and pick.get("ok"):
                    row["compare"].update(chosen_ms=pick["measured_ms"], ratio_to_best=pick["measured_ms"] / best["measured_ms"],
                                          within_10pct=pick["measured_ms"] <= WITHIN * best["measured_ms"])
        else:
            row["error"] = "the chosen candidate failed or gave a wrong result" if ok else "no candidate ran"
        return row

    def run(self):
        print(f"{self.meta['device']} ({self.meta['platform']}), jax {self.meta['jax']}, database: {self.db.describe()}", flush=True)
        for name, operand, gen, tile in self.patterns:
            for sparsity in self.sparsities:
                label = f"{name} sparsity {sparsity:g}"
                if self.args.deadline_s and self.elapsed() > self.args.deadline_s:
                    self.not_run.append(label)
                    print(f"[{self.elapsed():6.1f}s] {label}: not run (past --deadline-s)", flush=True)
                    continue
                try:
                    row = self.pattern(name, operand, gen, tile, sparsity)
                except Exception as e:  # noqa: BLE001
                    msg = str(e).strip().splitlines()
                    row = {"pattern": name, "operand": operand, "sparsity": sparsity, "error": f"{type(e).__name__}: {msg[0][:300] if msg else ''}"}
                    if self.args.verbose:
                        traceback.print_exc()
                self.rows.append(row)
                print(f"[{self.elapsed():6.1f}s] {label}: {line(row)}", flush=True)
                self.flush()
        self.flush(plot=True)
        print()
        print(common.table([table_row(r) for r in self.rows], ["case", "chosen", "ms", "best", "best_ms", "dense_ms", "x_best", "x_dense", "plan_ms"]))
        print()
        print(targets_text(summary(self.rows, self.shape)))
        print(f"wrote {self.path} (+ .png); {self.elapsed():.0f} s")

    def flush(self, plot=False):
        payload = {
            "meta": {**self.meta, "wall_s": round(self.elapsed(), 1), "not_run_deadline": self.not_run},
            "summary": summary(self.rows, self.shape),
            "results": self.rows,
        }
        self.path = common.write_results("optimizer_smoke" if self.smoke else "optimizer", payload, self.args.out)
        if plot:
            try:
                plot_results(self.rows, self.path[: -len(".json")] + ".png", self.meta)
            except Exception as e:  # noqa: BLE001 - a plot problem must not lose the numbers
                print(f"plot failed: {type(e).__name__}: {e}", file=sys.stderr)


def line(r):
    if "chosen_ms" not in r:
        return f"ERROR {r.get('error')}"
    return (
        f"chose {r['chosen']} {r['chosen_ms']:.4g} ms; best {r['best']} {r['best_ms']:.4g} ms (x{r['ratio_to_best']:.2f}); "
        f"dense {r.get('dense_ms', float('nan')):.4g} ms; plan {r['plan_ms']:.1f} ms"
    )


def table_row(r):
    return {
        "case": f"{r['pattern']} {r['sparsity']:g}", "chosen": r.get("chosen"), "ms": r.get("chosen_ms"),
        "best": r.get("best"), "best_ms": r.get("best_ms"), "dense_ms": r.get("dense_ms"),
        "x_best": r.get("ratio_to_best"), "x_dense": r.get("ratio_to_dense"), "plan_ms": r.get("plan_ms"),
    }


def summary(rows, shape):
    done = [r for r in rows if "chosen_ms" in r]
    within = [r for r in done if r["within_10pct"]]
    vs_dense = [r for r in done if "not_slower_than_dense" in r]
    slower = [r for r in vs_dense if not r["not_slower_than_dense"]]
    plan_ms = [r["plan_ms"] for r in rows if "plan_ms" in r]
    big = tuple(shape[:2]) == (4096, 4096)
    rate = len(within) / len(done) if done else None
    return {
        "patterns": len(rows), "measured": len(done), "errors": len(rows) - len(done),
        "within_10pct": len(within), "within_10pct_rate": rate, "within_10pct_met": None if rate is None else rate >= 0.9,
        "slower_than_dense_by_5pct": [f"{r['pattern']} {r['sparsity']:g}: x{r['ratio_to_dense']:.3f}" for r in slower],
        "never_slower_than_dense_met": None if not vs_dense else not slower,
        "plan_ms_max": max(plan_ms) if plan_ms else None, "plan_ms_median": float(np.median(plan_ms)) if plan_ms else None,
        "plan_ms_met": (max(plan_ms) < PLAN_MS) if plan_ms and big else None,
        "misses": [f"{r['pattern']} {r['sparsity']:g}: chose {r['chosen']} x{r['ratio_to_best']:.2f} of {r['best']}" for r in done if not r["within_10pct"]],
        **compare_summary(done),
    }


def compare_summary(done):
    """The --compare-database choices scored on the same measurements (empty without it)."""
    scored = [r for r in done if "within_10pct" in r.get("compare", {})]
    if not scored:
        return {}
    return {
        "compare_within_10pct": sum(r["compare"]["within_10pct"] for r in scored), "compare_measured": len(scored),
        "compare_differs": [f"{r['pattern']} {r['sparsity']:g}: {r['chosen']} x{r['ratio_to_best']:.2f} / "
                            f"{r['compare']['chosen']} x{r['compare']['ratio_to_best']:.2f}"
                            for r in scored if r["compare"]["chosen"] != r["chosen"]],
    }


def targets_text(s):
    def status(v):
        return {True: "MET", False: "NOT MET", None: "NOT MEASURED"}[v]

    rate = "-" if s["within_10pct_rate"] is None else f"{s['within_10pct_rate']:.0%}"
    out = [
        f"{status(s['within_10pct_met']):12s} choice within 10% of the hindsight best on >= 90% of patterns: "
        f"{s['within_10pct']}/{s['measured']} ({rate})",
        f"{status(s['never_slower_than_dense_met']):12s} never > 5% slower than dense"
        + (f": {'; '.join(s['slower_than_dense_by_5pct'])}" if s["slower_than_dense_by_5pct"] else ""),
        f"{status(s['plan_ms_met']):12s} planning a 4096x4096 sample < {PLAN_MS:g} ms: max "
        + ("-" if s["plan_ms_max"] is None else f"{s['plan_ms_max']:.1f} ms"),
    ]
    out += [f"  miss: {m}" for m in s["misses"][:20]]
    if "compare_measured" in s:
        out.append(f"{'':12s} --compare-database's choice within 10% of the best: {s['compare_within_10pct']}/{s['compare_measured']}")
        out += [f"  differs (this / compared database): {d}" for d in s["compare_differs"]]
    if s["errors"]:
        out.append(f"  {s['errors']} pattern(s) with errors: see the JSON")
    return "\n".join(out)


def plot_results(rows, path, meta):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
    pts = [(e["predicted_ms"], e["measured_ms"]) for r in rows for e in r.get("candidates", []) if e.get("measured_ms")]
    if pts:
        p, m = map(np.array, zip(*pts))
        a.loglog(p, m, ".", alpha=0.6)
        lo, hi = min(p.min(), m.min()), max(p.max(), m.max())
        a.plot([lo, hi], [lo, hi], "k-", linewidth=0.8)
    a.set_xlabel("predicted ms")
    a.set_ylabel("measured ms")
    a.set_title("every candidate: cost model vs measurement", fontsize=9)
    done = [r for r in rows if "chosen_ms" in r]
    labels = [f"{r['pattern']} {r['sparsity']:g}" for r in done]
    b.bar(range(len(done)), [r["ratio_to_best"] for r in done], color=["tab:green" if r["within_10pct"] else "tab:red" for r in done])
    b.plot(range(len(done)), [r.get("ratio_to_dense", np.nan) for r in done], "k.", label="chosen / dense")
    b.axhline(WITHIN, color="gray", linestyle="--", linewidth=0.8)
    b.set_xticks(range(len(done)))
    b.set_xticklabels(labels, rotation=90, fontsize=6)
    b.set_ylabel("chosen / hindsight best")
    b.set_title("optimizer choice (green: within 10%)", fontsize=9)
    b.legend(fontsize=7)
    fig.suptitle(f"pit_jax.plan calibration, {meta['device']}, {meta['dtype']}, database {meta['database'][:80]}", fontsize=9)
    common.save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_out_argument(ap)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, few patterns (CPU)")
    ap.add_argument("--database", default=None, help="STile database JSON (default: the one pit_jax resolves for this GPU)")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--compare-database", default=None, help="also score a second database's choices on the same measurements")
    ap.add_argument("--deadline-s", type=float, default=None, help="start no new pattern after S seconds (default 420; --smoke: none; 0 = none)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.deadline_s is None:
        args.deadline_s = 0 if args.smoke else 420
    sweep = Sweep(args)
    sweep.run()
    return sweep.rows


if __name__ == "__main__":
    main()
