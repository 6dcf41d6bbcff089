"""PIT MoE (issue 5) against what a JAX user has today, in one run on the GPU.

    python -m benchmarks.bench_moe [--out DIR] [--only first,ffn,fig8] [--small] [--deadline-s S]

Workloads (bf16; `--small` shrinks them for a CPU smoke run):
  first  T=16384, D=2048, F=8192, 8 experts, skewed routing (expert shares ~ 1/(e+1)),
         top-1: the FIRST FFN matmul only, routing index built inside the timed jit.
  ffn    the same shape, top-2: the whole FFN (w_in, ReLU, w_out, gate-weighted combine),
         forward + backward (d x, d gates, d w_in, d w_out).
  fig8   PIT Fig. 8 shapes, first matmul, top-1: T in {1024, 4096}, D=768, F=3072,
         E in {64, 128, 256}, uniform and Zipf routing. Bound by reading the expert
         weights: reported as GB/s of weight reads against the measured copy bandwidth,
         in wall time (weight_gbs) and in device time (device_ms, device_weight_gbs:
         the index and product kernels alone, from a profiler trace); also every byte
         the product moves (W + x + y, like the copy's reads + writes: moved_gbs,
         device_moved_gbs).
Implementations:
  oracle          one dense [T*k, D] @ [D, F] product: the same FLOPs, no routing.
  ragged_dot      jax.lax.ragged_dot on tokens already sorted by expert (no sort, no unsort).
  ragged_dot_sort argsort of the expert ids + gather + ragged_dot + unsort (a user's full path).
  capacity_cfX    GShard / Tutel capacity-padded einsum dispatch at capacity factor X
                  (one-hot dispatch and combine einsums; tokens past capacity are dropped).
  expert_loop     a loop over experts, each a dense product over all tokens, masked.
  pit_jax         pit_jax.moe_index + grouped_matmul (first, fig8) or moe_ffn (ffn).
Writes JSON (and a PNG) under benchmarks/results/ after every case.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import pit_jax
from benchmarks import common

DTYPE = jnp.bfloat16
TOL = 3e-2


def routing(rng, t, e, k, kind):
    if kind == "uniform":
        p = np.full(e, 1.0 / e)
    elif kind == "skewed":  # shares ~ 1 / (rank + 1)
        p = 1.0 / np.arange(1, e + 1)
        p /= p.sum()
    elif kind == "zipf":  # Zipf s = 1.2 over a random permutation of experts
        p = 1.0 / np.arange(1, e + 1) ** 1.2
        p = rng.permutation(p / p.sum())
    else:
        raise ValueError(kind)
    if k == 1:
        return rng.choice(e, size=(t, 1), p=p).astype(np.int32)
    # top-k without replacement: Gumbel top-k on log p
    g = np.log(p)[None, :] - np.log(-np.log(rng.random((t, e))))
    return np.argsort(-g, axis=1)[:, :k].astype(np.int32)


def input_sets(rng, t, d, f, e, k, kind, n):
    """`n` rotated (x [t, d], w [e, d, f], expert ids [t, k]) sets, random normal (w scaled
    by 1 / sqrt(d)) and routed by `kind`, all drawn from `rng`."""
    out = []
    for _ in range(n):
        key = jax.random.PRNGKey(int(rng.integers(2**31)))
        kx, kw = jax.random.split(key)
        x = common.random_normal(kx, (t, d), DTYPE)
        w = (common.random_normal(kw, (e, d, f), jnp.float32) / math.sqrt(d)).astype(DTYPE)
        out.append((x, w, jnp.asarray(routing(rng, t, e, k, kind))))
    return out


# -- baselines ----------------------------------------------------------------------------


def ragged_sorted(xs, w, group_sizes):
    return jax.lax.ragged_dot(xs, w, group_sizes, preferred_element_type=jnp.float32).astype(xs.dtype)


def ragged_sort(x, w, ids):
    e = w.shape[0]
    k = ids.shape[-1]
    flat = ids.reshape(-1)
    order = jnp.argsort(flat)
    xs = jnp.take(x, order // k, axis=0)
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
    ys = ragged_sorted(xs, w, sizes)
    return jnp.zeros_like(ys).at[order].set(ys)  # unsort to assignment order


def capacity_einsum(x, w, ids, cf):
    e = w.shape[0]
    t, k = ids.shape
    cap = max(1, math.ceil(cf * t * k / e))
    onehot = jax.nn.one_hot(ids.reshape(-1), e, dtype=jnp.int32)  # [A, E]
    pos = jnp.cumsum(onehot, axis=0) * onehot - 1
    keep = (pos < cap) & (onehot > 0)
    dispatch = (jax.nn.one_hot(jnp.where(keep, pos, -1), cap, dtype=x.dtype))  # [A, E, C]
    xa = jnp.repeat(x, k, axis=0) if k > 1 else x
    xe = jnp.einsum("aec,ad->ecd", dispatch, xa)
    he = jnp.einsum("ecd,edf->ecf", xe, w, preferred_element_type=jnp.float32).astype(x.dtype)
    return jnp.einsum("aec,ecf->af", dispatch, he)


def expert_loop(x, w, ids):
    k = ids.shape[-1]
    xa = jnp.repeat(x, k, axis=0) if k > 1 else x
    flat = ids.reshape(-1)
    out = jnp.zeros((xa.shape[0], w.shape[-1]), jnp.float32)
    for e in range(w.shape[0]):
        out = jnp.where((flat == e)[:, None], jnp.matmul(xa, w[e], preferred_element_type=jnp.float32), out)
    return out.astype(x.dtype)


def pit_first(x, w, ids):
    return pit_jax.grouped_matmul(x, w, pit_jax.moe_index(ids, w.shape[0]))


def reference_first(x, w, ids):
    """float32 reference of the first matmul in assignment order."""
    k = ids.shape[-1]
    xa = np.repeat(np.asarray(x, np.float32), k, axis=0)
    wf = np.asarray(jnp.asarray(w, jnp.float32))
    flat = np.asarray(ids).reshape(-1)
    out = np.zeros((xa.shape[0], wf.shape[-1]), np.float32)
    for e in range(wf.shape[0]):
        sel = flat == e
        out[sel] = xa[sel] @ wf[e]
    return out


def rel_err(out, ref):
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    if np.isnan(out).any():
        return float("nan")
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))


def cudnn_fired(fn, *args) -> bool:
    """Whether XLA lowered the function to a cuDNN custom call (ragged_dot's fusion)."""
    try:
        text = jax.jit(fn).lower(*args).compile().as_text()
    except Exception:  # noqa: BLE001
        return False
    return "cudnn" in text.lower()


# -- the suite ----------------------------------------------------------------------------


class Suite:
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.rows = []
        self.meta = common.device_info()
        self.meta["copy_bandwidth_gbs"] = None
        self.rng = np.random.default_rng()
        self.path = None

    def left(self):
        return self.args.deadline_s - (time.time() - self.t0)

    def flush(self):
        payload = {"suite": "moe", "meta": self.meta, "rows": self.rows, "targets": targets(self.rows, self.meta)}
        self.path = common.write_results("moe", payload, self.args.out)

    def measure(self, case, impl, fn, sets, *, ref=None, extra=None, bounded=False, device=False):
        if self.left() < 10:
            self.rows.append(dict(case, impl=impl, ms=None, note="skipped: deadline"))
            return None
        row = dict(case, impl=impl)
        try:
            if bounded:
                t = common.time_bounded(fn, sets, budget_s=3.0, keep_output=ref is not None)
            else:
                t = common.time_op(fn, sets, reps=9, keep_output=ref is not None, device_calls=10 if device else 0)
            row["ms"] = t["median_ms"]
            row.update({key: t[key] for key in ("device_ms", "kernels_per_op") if key in t})
            if ref is not None:
                row["rel_err"] = rel_err(t["output"], ref)
        except common.TooSlow as err:
            row["ms"], row["note"] = None, str(err)
        except Exception as err:  # noqa: BLE001
            row["ms"], row["note"] = None, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            if self.args.verbose:
                traceback.print_exc()
        if extra:
            row.update(extra)
        self.rows.append(row)
        print(f"  {impl:<18} {row['ms'] if row['ms'] is None else round(row['ms'], 4)!s:>10} ms"
              f"  {row.get('rel_err', '')!s:.8}  {row.get('note', '')}", flush=True)
        self.flush()
        return row

    def sets(self, t, d, f, e, k, kind, n):
        return input_sets(self.rng, t, d, f, e, k, kind, n)

    def first(self, t, d, f, e, k, kind, label, impls):
        case = dict(workload=label, T=t, D=d, F=f, E=e, k=k, routing=kind)
        print(f"{label}: T={t} D={d} F={f} E={e} k={k} {kind}", flush=True)
        per_set = 2 * (t * d + e * d * f + t * k * f)
        n = common.rotations(per_set, max_sets=4)
        sets = self.sets(t, d, f, e, k, kind, n)
        x0, w0, ids0 = sets[0]
        ref = reference_first(x0, w0, ids0)
        counts = np.bincount(np.asarray(ids0).reshape(-1), minlength=e)
        case["max_expert_share"] = float(counts.max() / counts.sum())
        case["experts_used"] = int((counts > 0).sum())
        weight_bytes = e * d * f * 2
        used_bytes = int((counts > 0).sum()) * d * f * 2
        # Everything the product must move (W read, x rows read, y written), as the copy
        # bandwidth counts reads + writes: the weight-only figure is the target.
        moved_bytes = weight_bytes + 2 * (t * d + t * k * f)
        oracle_sets = [(jnp.repeat(x, k, axis=0) if k > 1 else x, w[0]) for x, w, _ in sets]
        # The oracle and pit_jax first and back to back: a long run of heavy baselines
        # lowers the clock under sustained load, which would penalise whichever runs later.
        self.measure(case, "oracle", lambda x, w: jnp.matmul(x, w), oracle_sets)
        # Fig. 8 also in device time (its kernels only, index included): the wall time also
        # holds the host's gap between jitted calls.
        row = self.measure(case, "pit_jax", pit_first, sets, ref=ref, device=label == "fig8")
        if row and row.get("ms"):
            row["weight_gbs"] = weight_bytes / (row["ms"] * 1e-3) / 1e9
            row["used_weight_gbs"] = used_bytes / (row["ms"] * 1e-3) / 1e9
            row["moved_gbs"] = moved_bytes / (row["ms"] * 1e-3) / 1e9
            if row.get("device_ms"):
                row["device_weight_gbs"] = weight_bytes / (row["device_ms"] * 1e-3) / 1e9
                row["device_moved_gbs"] = moved_bytes / (row["device_ms"] * 1e-3) / 1e9
        if "ragged_dot" in impls:
            sorted_sets = []
            for x, w, ids in sets:
                flat = np.asarray(ids).reshape(-1)
                order = np.argsort(flat, kind="stable")
                sorted_sets.append((jnp.take(x, jnp.asarray(order // k), axis=0), w,
                                    jnp.asarray(np.bincount(flat, minlength=e), jnp.int32)))
            self.measure(case, "ragged_dot", ragged_sorted, sorted_sets, bounded=True,
                         extra={"cudnn_fusion": cudnn_fired(ragged_sorted, *sorted_sets[0])})
        self.measure(case, "ragged_dot_sort", ragged_sort, sets, ref=ref, bounded=True)
        for cf in impls.get("capacity", ()):
            self.measure(case, f"capacity_cf{cf:g}", lambda x, w, ids, cf=cf: capacity_einsum(x, w, ids, cf), sets,
                         bounded=True)
        if "expert_loop" in impls:
            self.measure(case, "expert_loop", expert_loop, sets, ref=ref, bounded=True)
        idx_sets = [(ids,) for _, _, ids in sets]
        self.measure(case, "index_only", lambda ids: pit_jax.moe_index(ids, e).counts, idx_sets)

    def ffn(self, t, d, f, e, k, kind):
        case = dict(workload="ffn_fwd_bwd", T=t, D=d, F=f, E=e, k=k, routing=kind)
        print(f"ffn fwd+bwd: T={t} D={d} F={f} E={e} k={k} {kind}", flush=True)
        sets = []
        for _ in range(2):
            key = jax.random.PRNGKey(int(self.rng.integers(2**31)))
            k1, k2, k3, k4, k5 = jax.random.split(key, 5)
            x = common.random_normal(k1, (t, d), DTYPE)
            w_in = (common.random_normal(k2, (e, d, f), jnp.float32) / math.sqrt(d)).astype(DTYPE)
            w_out = (common.random_normal(k3, (e, f, d), jnp.float32) / math.sqrt(f)).astype(DTYPE)
            gates = jax.random.uniform(k4, (t, k), jnp.float32)
            ids = jnp.asarray(routing(self.rng, t, e, k, kind))
            dy = common.random_normal(k5, (t, d), DTYPE)
            sets.append((x, gates, w_in, w_out, ids, dy))

        def pit(x, gates, w_in, w_out, ids, dy):
            def f_(x, gates, w_in, w_out):
                return pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, e), w_in, w_out)

            y, vjp = jax.vjp(f_, x, gates, w_in, w_out)
            return y, vjp(dy)

        def oracle(x, gates, w_in, w_out, ids, dy):
            xa = jnp.repeat(x, k, axis=0)

            def f_(xa, w1, w2):
                return jnp.matmul(jax.nn.relu(jnp.matmul(xa, w1)), w2)

            y, vjp = jax.vjp(f_, xa, w_in[0], w_out[0])
            return y, vjp(jnp.repeat(dy, k, axis=0))

        def ragged(x, gates, w_in, w_out, ids, dy):
            def f_(x, gates, w_in, w_out):
                flat = ids.reshape(-1)
                order = jnp.argsort(flat)
                xs = jnp.take(x, order // k, axis=0)
                sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
                h = jax.nn.relu(ragged_sorted(xs, w_in, sizes))
                o = ragged_sorted(h, w_out, sizes)
                o = jnp.zeros_like(o).at[order].set(o).reshape(t, k, d).astype(jnp.float32)
                return jnp.einsum("tkd,tk->td", o, gates).astype(x.dtype)

            y, vjp = jax.vjp(f_, x, gates, w_in, w_out)
            return y, vjp(dy)

        self.measure(case, "oracle", oracle, sets)
        self.measure(case, "pit_jax", pit, sets)
        self.measure(case, "ragged_dot_sort", ragged, sets, bounded=True)

    def run(self):
        a = self.args
        only = set(a.only.split(",")) if a.only else {"first", "ffn", "fig8"}
        s = 16 if a.small else 1
        self.meta["small"] = bool(a.small)
        if not a.small:
            self.meta["copy_bandwidth_gbs"] = common.copy_bandwidth_gbs()
            print(f"copy bandwidth {self.meta['copy_bandwidth_gbs']:.0f} GB/s", flush=True)
        if "first" in only:
            self.first(16384 // s, 2048 // s, 8192 // s, 8, 1, "skewed", "first",
                       {"ragged_dot": 1, "capacity": (1.0, 1.25, 2.0), "expert_loop": 1})
        if "ffn" in only:
            self.ffn(16384 // s, 2048 // s, 8192 // s, 8, 2, "skewed")
        if "fig8" in only:
            for t in (1024, 4096):
                for e in (64, 128, 256):
                    for kind in ("uniform", "zipf"):
                        if t == 1024 and e > 64 and kind == "zipf":
                            continue
                        self.first(t // s, 768 // s, 3072 // s, e, 1, kind, "fig8", {})
        self.flush()
        plot(self.rows, self.path.replace(".json", ".png"), self.meta)
        print(summary(self.rows, self.meta))
        print(targets_text(targets(self.rows, self.meta)))
        print(f"wrote {self.path}")


# Issue 5's targets (written for the H100; scored on the device that ran). "first" and
# "ffn": pit_jax's wall time against the oracle's; "fig8": each case's weight reads per
# second against the copy bandwidth measured in the same run, in device time where the
# row has it (the index and product kernels) else in wall time.
TARGETS = (
    ("first", "first FFN matmul (T 16384, D 2048, F 8192, 8 experts, skewed, top-1), index included: "
              "<= 1.25x the oracle", 1.25),
    ("ffn", "whole FFN forward + backward, top-2, same shape: <= 1.4x the oracle's forward + backward", 1.4),
    ("fig8", "PIT Fig. 8 shapes: weight reads >= 80 % of the measured copy bandwidth", 80.0),
)

# The suite's workload each target scores.
_TARGET_WORKLOAD = {"first": "first", "ffn": "ffn_fwd_bwd", "fig8": "fig8"}

# Why a target is missed: what the profiler and the harness showed (the notes named).
WHY_MISSED = {
    "first": (
        "The grouped product itself: on the H200 it takes 846 us of kernel time against cuBLAS's "
        "671 us for the dense product of the same FLOPs, the index 3.6 us (2026-11-29). Its "
        "epilogue is ~6 % of it (the harness's no-store variant, whose wgmma count ncu showed "
        "equal): ~1.5-2 % the global stores, the rest not found. Pacing one consumer warpgroup "
        "behind the other (epilogues out of phase), stmatrix staging and stores from the "
        "fragments were all no faster; ncu shows neither shared memory nor L2 saturated. The "
        "epilogue's row lookup, moved out of the tile's start, gained 1-1.5 % in the harness "
        "(2026-11-29). Met on the H100 (1.23x, 2026-11-22). docs/notes/sm90_grouped.md, runs "
        "3-4, 22 and 23."
    ),
    "ffn": (
        "Met on the H100 (1.17x, 2026-11-26) and the H200 (1.24x, 2026-11-29). Inside it the "
        "experts' weight gradients over gathered rows are the slowest part (1.47x cuBLAS at this "
        "shape in the harness, H200). docs/notes/sm90_grouped.md, runs 7-11 and 22."
    ),
    "fig8": (
        "T 4096 with 64 experts: 768 tiles of 128 x 256 on 132 SMs are 5.82 rounds. The steady "
        "state moves 91 % of the copy, but the first W stage lands 7-8 us after the launch and "
        "5.3 % of the SM time idles in the last round (uniform; 9.6 % with Zipf routing, whose hot "
        "experts' extra row tiles find W in L2 and cost math, not bandwidth). Without any idle "
        "time the product plus the index would still reach ~79 % on the H200. "
        "docs/notes/sm90_grouped.md, runs 9-13 and 20."
    ),
}


def targets(rows, meta) -> list:
    """Each issue-5 target, its cases, whether met and the margin (positive = headroom).
    `meaningful` only for a full-size GPU run with the copy bandwidth measured."""
    keys = ("workload", "T", "D", "F", "E", "k", "routing")
    cases = {}
    for r in rows:
        cases.setdefault(tuple(r.get(key) for key in keys), {})[r["impl"]] = r
    copy = meta.get("copy_bandwidth_gbs")
    meaningful = bool(meta.get("platform") == "gpu" and not meta.get("small") and copy)
    out = []
    for tid, text, limit in TARGETS:
        entries = []
        for key, by in cases.items():
            case = dict(zip(keys, key))
            if case["workload"] != _TARGET_WORKLOAD[tid]:
                continue
            pit, oracle = by.get("pit_jax", {}), by.get("oracle", {})
            e = {"case": f"{case['workload']} T{case['T']} E{case['E']} k{case['k']} {case['routing']}",
                 "measured": None, "limit": limit, "met": None}
            if tid == "fig8":
                e["basis"] = "device" if pit.get("device_weight_gbs") else "wall"
                gbs = pit.get("device_weight_gbs") or pit.get("weight_gbs")
                if gbs and copy:
                    e["measured"] = pct = 100.0 * gbs / copy
                    e["met"], e["margin_pct"] = pct >= limit, 100.0 * (pct - limit) / limit
            elif pit.get("ms") and oracle.get("ms"):
                e["measured"] = ratio = pit["ms"] / oracle["ms"]
                e["met"], e["margin_pct"] = ratio <= limit, 100.0 * (limit - ratio) / limit
            entries.append(e)
        verdict = common.target_verdict(entries)
        out.append({
            "id": tid, "target": text, "limit": limit,
            "unit": "% of copy (weight reads)" if tid == "fig8" else "x oracle",
            **verdict, "meaningful": meaningful, "entries": entries,
            "why": WHY_MISSED[tid] if verdict["met"] is False and meaningful else None,
        })
    return out


def rescore(path: str) -> list:
    """Adds (or rewrites) the `targets` of an existing results file with this module's
    definitions; the measurements are not touched."""
    return common.rescore_file(path, lambda data: targets(data["rows"], data["meta"]))


def targets_text(tgts) -> str:
    lines = ["", "issue 5's targets:"]
    for t in tgts:
        state = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        worst = t["worst"]
        w = f"; worst {worst['case']}: {worst['measured']:.3g} (limit {t['limit']:g})" if worst else ""
        note = "" if t["meaningful"] else " (not a full-size GPU run: not meaningful)"
        lines.append(f"  {t['id']:<6} {state}, {t['cases_met']}/{t['cases']} cases{w}{note}")
    return "\n".join(lines)


def _ms(rows, case, impl):
    for r in rows:
        if r["impl"] == impl and all(r.get(key) == v for key, v in case.items()):
            return r.get("ms")
    return None


def summary(rows, meta) -> str:
    keys = ("workload", "T", "D", "F", "E", "k", "routing")
    cases = []
    for r in rows:
        c = {key: r.get(key) for key in keys}
        if c not in cases:
            cases.append(c)
    lines = ["", "pit_jax against the oracle and ragged_dot (ms; ratio = pit / oracle):"]
    for c in cases:
        pit, oracle, rag = _ms(rows, c, "pit_jax"), _ms(rows, c, "oracle"), _ms(rows, c, "ragged_dot_sort")
        ratio = f"{pit / oracle:.2f}x oracle" if pit and oracle else "-"
        vs = f"{rag / pit:.1f}x faster than ragged_dot+sort" if pit and rag else ""
        prow = next((r for r in rows if r["impl"] == "pit_jax" and all(r.get(key) == v for key, v in c.items())), {})
        copy, bw = meta.get("copy_bandwidth_gbs"), ""
        for key, what in (("weight_gbs", "wall"), ("device_weight_gbs", "device time")):
            if prow.get(key) and copy:
                bw += f", weights {prow[key]:.0f} GB/s in {what} ({prow[key] / copy:.0%} of copy)"
        if prow.get("device_moved_gbs") and copy:
            bw += f", all bytes {prow['device_moved_gbs']:.0f} GB/s in device time ({prow['device_moved_gbs'] / copy:.0%})"
        lines.append(f"  {c['workload']:<11} T={c['T']} E={c['E']} k={c['k']} {c['routing']:<7}: pit {pit} ms, "
                     f"oracle {oracle} ms, {ratio}; {vs}{bw}")
    return "\n".join(lines)


def plot(rows, path, meta):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    keys = ("workload", "T", "E", "k", "routing")
    cases, labels = [], []
    for r in rows:
        c = {key: r.get(key) for key in keys}
        if c not in cases:
            cases.append(c)
            labels.append(f"{c['workload']}\nT{c['T']} E{c['E']} k{c['k']}\n{c['routing']}")
    impls = [i for i in ("pit_jax", "ragged_dot_sort", "ragged_dot", "capacity_cf1.25", "expert_loop")
             if any(r["impl"] == i for r in rows)]
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(cases)), 4.5))
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        vals = []
        for c in cases:
            o, v = _ms(rows, c, "oracle"), _ms(rows, c, impl)
            vals.append(o / v if o and v else 0)
        ax.bar(np.arange(len(cases)) + j * width, vals, width, label=impl)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(cases)) + 0.4 - width / 2, labels, fontsize=7)
    ax.set_ylabel("speed relative to the oracle (higher is better)")
    ax.set_title(f"MoE, bf16 — {meta['device']}, jax {meta['jax']}, {meta['date'][:10]}")
    ax.legend(fontsize=8)
    common.save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_out_argument(ap)
    ap.add_argument("--only", default=None, help="comma-separated subset of first,ffn,fig8")
    ap.add_argument("--small", action="store_true", help="shrunk shapes (CPU smoke run)")
    ap.add_argument("--deadline-s", type=float, default=480.0)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--rescore", default=None, metavar="FILE",
                    help="only add / rewrite the targets of an existing results file (no run)")
    args = ap.parse_args(argv)
    if args.rescore:
        print(targets_text(rescore(args.rescore)))
        return 0
    Suite(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
