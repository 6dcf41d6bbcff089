"""The benchmarks' timing and profiling helpers (CPU smoke runs; the suites themselves run
on the GPU by hand, docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

from benchmarks import common  # noqa: E402


def test_time_calls_floor_and_budget():
    calls = []
    t = common.time_calls(lambda: calls.append(1) or jnp.ones(()), reps=4, target_s=0.0, min_calls=7, max_calls=50)
    assert t["calls_per_rep"] == 7 and t["reps"] == 4 and len(t["samples"]) == 4
    assert len(calls) == 3 + 4 * 7  # 3 to estimate one call, then the repeats
    assert all(v > 0 for v in t["samples"])
    capped = common.time_calls(lambda: jnp.ones(()), reps=50, target_s=1.0, budget_s=0.0, min_calls=2, max_calls=5)
    assert capped["reps"] == 3 and capped["calls_per_rep"] == 5


def test_time_op_reports_per_op_over_rotations():
    sets = [(jnp.full((8,), float(i)),) for i in range(3)]
    t = common.time_op(lambda x: x * 2.0, sets, reps=3, keep_output=True, min_calls=2)
    assert t["rotations"] == 3 and t["calls_per_rep"] >= 2 and t["median_ms"] > 0
    assert float(t["output"][0]) == 0.0


@pytest.mark.parametrize("argv", [["bert", "--small", "--calls", "2", "--only", "dense,pit"],
                                  ["bert_train", "--small", "--calls", "2", "--only", "pit,adamw_only"],
                                  ["prune", "--small", "--calls", "2", "--density", "0.3", "--only", "pit,pit_w"],
                                  ["moe_train", "--small", "--calls", "2", "--top-k", "2", "--only", "dense,pit"],
                                  ["moe_first", "--small", "--calls", "2", "--top-k", "2", "--only", "oracle,pit"],
                                  ["opt", "--small", "--calls", "2", "--density", "0.1", "--only", "pit,pit_m"],
                                  ["sparse_dense", "--small", "--calls", "2", "--only", "dense,pit,pit_pre"],
                                  ["sparse_dense", "--small", "--calls", "2", "--axis", "w", "--tile", "1x64",
                                   "--only", "pit,pit_pre"],
                                  ["sparse_dense", "--small", "--calls", "2", "--axis", "m", "--dtype", "tf32",
                                   "--density", "0.3", "--only", "oracle,pit,pit_pre"],
                                  ["sparse_dense", "--small", "--calls", "2", "--axis", "m", "--bwd",
                                   "--density", "0.5", "--only", "dense,oracle,pit,pit_pre"]])
def test_kernel_profile_smoke(argv):
    from benchmarks import kernel_profile

    res = kernel_profile.main(argv)
    assert set(res) == set(argv[argv.index("--only") + 1].split(","))
    for r in res.values():
        assert r["wall_ms"] > 0 and r["dispatch_ms"] > 0


def test_kernel_profile_saves_the_profiled_programs(tmp_path, capsys):
    from benchmarks import hlo_schedule, kernel_profile

    kernel_profile.main(["prune", "--small", "--calls", "2", "--density", "0.3", "--only", "dense,pit_w",
                         "--save-hlo", str(tmp_path)])
    for v in ("dense", "pit_w"):
        text = (tmp_path / f"prune_{v}.hlo.txt").read_text()
        assert hlo_schedule.fusions(text) and hlo_schedule.placement(text)["reductions"] > 0
    saved = json.loads((tmp_path / "prune.json").read_text())
    assert {"dense", "pit_w"} <= set(saved) and saved["pit_w"]["wall_ms"] > 0
    hlo_schedule.main([str(tmp_path / "prune_dense.hlo.txt"), str(tmp_path / "prune_pit_w.hlo.txt"),
                       "--profile", str(tmp_path / "prune.json")])
    assert "column sums" in capsys.readouterr().out


def test_hlo_schedule_matches_a_fusion_across_programs():
    """The same fused computation under other names in two programs is one row of the diff."""
    from benchmarks import hlo_schedule

    def f(x, y):
        return jnp.sum(jnp.tanh(x) * y, axis=0)

    def g(x, y):  # more ops around the same sum: other fusion names
        return jnp.sum(jnp.tanh(x) * y, axis=0) + jnp.max(jnp.exp(y))

    args = (jnp.ones((64, 32)), jnp.ones((64, 32)))
    texts = [jax.jit(h).lower(*args).compile().as_text() for h in (f, g)]
    tables = [hlo_schedule.fusions(t) for t in texts]
    shared = {v[0] for v in tables[0].values()} & {v[0] for v in tables[1].values()}
    assert shared, "the tanh-multiply-sum fusion is found in both"
    name_a = next(k for k, v in tables[0].items() if v[0] in shared)
    name_b = next(k for k, v in tables[1].items() if v[0] in shared)
    rows = hlo_schedule.diff([[name_a, 5.0, 1]], texts[0], [[name_b, 7.0, 1], ["other_kernel", 1.0, 1]], texts[1])
    matched = [r for r in rows if r[0] == 5.0]
    assert len(matched) == 1 and matched[0][1] == 7.0 and matched[0][2] == 2.0
    assert any(r[5] == "kernel other_kernel" and r[2] == 1.0 for r in rows)


def test_hlo_schedule_reduction_distances():
    from benchmarks import hlo_schedule

    text = """HloModule m, is_scheduled=true

ENTRY %main (p: f32[8,4]) -> (f32[4], f32[4]) {
  %p = f32[8,4]{1,0} parameter(0)
  %loop_fusion = f32[8,4]{1,0} fusion(%p), kind=kLoop, calls=%c0
  %input_reduce_fusion = f32[4]{0} fusion(%loop_fusion), kind=kInput, calls=%c1
  %custom-call.1 = (f32[8,4]{1,0}, s8[16]{0}) custom-call(%p), custom_call_target="x"
  %get-tuple-element.1 = f32[8,4]{1,0} get-tuple-element(%custom-call.1), index=0
  %loop_fusion.2 = f32[8,4]{1,0} fusion(%p), kind=kLoop, calls=%c0
  %loop_fusion.3 = f32[8,4]{1,0} fusion(%p), kind=kLoop, calls=%c0
  %input_reduce_fusion.2 = f32[4]{0} fusion(%get-tuple-element.1), kind=kInput, calls=%c1
  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%input_reduce_fusion, %input_reduce_fusion.2)
}
"""
    assert hlo_schedule.reduction_distances(text) == [1, 3]
    assert hlo_schedule.placement(text) == {"reductions": 2, "near": 1, "median_distance": 3}


def test_device_ab_smoke():
    from benchmarks import device_ab

    rows = device_ab.main(["--small", "--only", "index,moe"])
    assert [r["group"] for r in rows] == ["index"] * 4 + ["moe"] * 2
    assert all(r["wall_us"] > 0 for r in rows)
    with pytest.raises(SystemExit):
        device_ab.main(["--only", "stile,nope"])


def test_train_loop_smoke():
    from benchmarks import train_loop

    res = train_loop.main(["dense", "pit_unspecified", "--small", "--warmup", "1", "--steps", "2", "--rounds", "1"])
    assert set(res) == {"dense", "pit_unspecified"}
    for rounds, loss in res.values():
        assert len(rounds) == 1 and rounds[0][1] > 0 and np.isfinite(loss)
    with pytest.raises(SystemExit):
        train_loop.main(["dense_xla"])
    with pytest.raises(SystemExit):
        train_loop.main(["dense", "--steps", "0"])


@pytest.mark.parametrize("via", ["aot", "suite"])
def test_train_loop_via_smoke(via):
    from benchmarks import train_loop

    res = train_loop.main(["pit_unspecified", "dense", "--small", "--warmup", "1", "--steps", "2", "--rounds", "2",
                           "--via", via, "--interleave"])
    assert set(res) == {"dense", "pit_unspecified"}
    for rounds, loss in res.values():
        assert len(rounds) == 2 and all(w > 0 for _, w in rounds) and np.isfinite(loss)


def test_bench_wblock_smoke(tmp_path):
    from benchmarks import bench_wblock

    rows = bench_wblock.main(["--small", "--densities", "0.0,0.5", "--check", "--out", str(tmp_path)])
    assert len(rows) == 4 and all(r["pit_fwd_ms"] > 0 and r["err_fwd"] < 2e-2 and r["err_dx"] < 2e-2 for r in rows)
    assert len(list(tmp_path.glob("wblock_*.json"))) == 1


@pytest.mark.parametrize("axis", ["w", "k", "m", "moe"])
def test_bench_shared_weight_smoke(tmp_path, axis):
    from benchmarks import bench_shared_weight

    rows = bench_shared_weight.main(["--small", "--axis", axis, "--densities", "0.0,0.5", "--out", str(tmp_path)])
    n = len(bench_shared_weight.MOE_CASES) if axis == "moe" else 2
    assert len(rows) == n and all(r["shared_ms"] > 0 and r["max_rel_diff"] < 2e-2 for r in rows)
    assert len(list(tmp_path.glob("shared_weight_*.json"))) == 1


def test_bench_attention_smoke(tmp_path):
    from benchmarks import bench_attention

    rows = bench_attention.main(["--small", "--out", str(tmp_path)])
    pit = [r for r in rows if r["impl"] == "pit_jax"]
    assert len(pit) == 22 and all(r["median_ms"] > 0 for r in pit)  # 11 cases x forward, forward + backward
    xla = [r for r in rows if r["impl"] in ("xla", "pit_jax_repeat") and r["pass"] == "forward+backward"]
    assert all(r["max_rel_diff_vs_pit"] < 5e-2 for r in xla), xla
    assert {r["case"] for r in xla if r["impl"] == "pit_jax_repeat"} == {"document_gqa", "decoder_gqa", "document_window",
                                                                         "document_window_left"}
    assert len(list(tmp_path.glob("attention_*.json"))) == 1


def test_bench_optimizer_compare_database_smoke(tmp_path):
    """--compare-database scores a second database's choice on the sweep's own measurements."""
    from benchmarks import bench_optimizer

    db = os.path.join(ROOT, "pit_jax", "stile_db", "nvidia-h100-80gb-hbm3.json")
    rows = bench_optimizer.main(["--smoke", "--database", "heuristic", "--compare-database", db, "--out", str(tmp_path)])
    scored = [r for r in rows if "chosen_ms" in r]
    assert scored and all("within_10pct" in r["compare"] for r in scored)
    for r in scored:  # the compared choice is one of the measured candidates, timed once for both
        times = {c["stile"]: c["measured_ms"] for c in r["candidates"]}
        assert r["compare"]["chosen_ms"] == times[r["compare"]["chosen"]]
    (path,) = tmp_path.glob("optimizer_smoke_*.json")
    import json

    doc = json.loads(path.read_text())
    assert doc["meta"]["compare_database_source"] == db and doc["summary"]["compare_measured"] == len(scored)


def test_write_results_takes_a_folder_or_a_json_path(tmp_path):
    """--out is a folder (the file named by suite, device and date) or a .json file path;
    either folder is created."""
    payload = {"meta": {"device": "Some GPU", "date": "2026-11-28T10:00:00"}, "rows": []}
    folder = common.write_results("moe", payload, str(tmp_path / "a"))
    assert folder == str(tmp_path / "a" / "moe_Some_GPU_2026-11-28.json") and os.path.isfile(folder)
    named = common.write_results("moe", payload, str(tmp_path / "b" / "fig8.json"))
    assert named == str(tmp_path / "b" / "fig8.json") and os.path.isfile(named)


def test_bf16_weights_casts_matrices_only():
    from benchmarks import bench_workloads

    params = {"dense": {"kernel": jnp.ones((4, 3)), "bias": jnp.ones((3,))}, "ln": {"scale": jnp.ones((3,))},
              "embed": {"embedding": jnp.ones((7, 4))}}
    out = bench_workloads.bf16_weights(params)
    assert out["dense"]["kernel"].dtype == jnp.bfloat16 and out["embed"]["embedding"].dtype == jnp.bfloat16
    assert out["dense"]["bias"].dtype == jnp.float32 and out["ln"]["scale"].dtype == jnp.float32


def test_run_interleaved_rows(tmp_path):
    """Suite.run_interleaved: one row per variant, timed in the same rounds, ratios against
    the case's dense row and its alternative, checks on the first output; a failing variant
    gets its error row and does not stop the others."""
    import argparse

    from benchmarks import bench_workloads

    args = argparse.Namespace(out=str(tmp_path), only="prune", small=True, deadline_s=None, moe=None, verbose=False)
    suite = bench_workloads.Suite(args)
    case = dict(workload="prune", label="toy", mode="infer", alternative="twin")
    x = jnp.ones((64, 64))

    def broken(v):
        raise ValueError("no such variant")

    suite.run_interleaved(case, [("dense", lambda v: v @ v, (x,), None), ("twin", lambda v: v @ v + 1.0, (x,), None),
                                 ("pit", lambda v: v * 2.0, (x,), lambda out: {"ok": bool(out[0, 0] == 2.0)}),
                                 ("bad", broken, (x,), None)], rounds=3)
    rows = {r["impl"]: r for r in suite.rows}
    assert set(rows) == {"dense", "twin", "pit", "bad"}
    for impl in ("dense", "twin", "pit"):
        assert rows[impl]["interleaved"] and rows[impl]["reps"] == 3 and rows[impl]["median_ms"] > 0
    assert rows["pit"]["ok"] and "speedup_vs_dense" in rows["pit"] and "speedup_vs_alternative" in rows["pit"]
    assert "no such variant" in rows["bad"]["error"] and "median_ms" not in rows["bad"]
    assert os.path.exists(suite.path)


def test_reference_check_compares_with_the_stored_output():
    """_reference_check: run_interleaved runs checks in variant order, so the reference
    variant's `store` comes first; without a stored reference `check` reports nothing."""
    from benchmarks import bench_workloads

    store, check = bench_workloads._reference_check(lambda ref: lambda out: {"ok": bool(abs(out - ref) < 0.5)})
    assert check(1.0) == {}
    assert store(1.0) == {}
    assert check(1.2) == {"ok": True} and check(3.0) == {"ok": False}


def test_training_rows_run_as_a_training_loop(tmp_path):
    """Training rows: the step's p and s are donated and carried from call to call (the
    first call on copies, so the caller's arrays stay valid), checks on the first output."""
    import argparse

    from benchmarks import bench_workloads

    args = argparse.Namespace(out=str(tmp_path), only="bert", small=True, deadline_s=None, moe=None, verbose=False)
    suite = bench_workloads.Suite(args)
    p0, s0, x = jnp.zeros((8,)), jnp.zeros((), jnp.int32), jnp.ones((8,))

    def step(p, s, x):
        return p + x, s + 1, jnp.sum(p)

    case = dict(workload="bert", label="toy", mode="train", alternative="dense")
    out = suite.run(case, "dense", step, (p0, s0, x), lambda o: {"ok": bool(o[2] == 0.0)})
    assert float(out[2]) == 0.0 and suite.rows[-1]["ok"] and suite.rows[-1]["median_ms"] > 0
    assert float(jnp.sum(p0)) == 0.0 and int(s0) == 0  # the caller's state was not donated

    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(p0, s0, x).compile()
    call = bench_workloads.mcommon.ChainedStep(compiled, (p0, s0, x))
    for _ in range(3):
        call()
    assert int(call.state[1]) == 3 and float(call.state[0][0]) == 3.0 and int(s0) == 0


def test_index_share_prefers_device_time(tmp_path):
    """The index_share target compares kernel time where an index row has it (GPU runs),
    and falls back to the wall-clock share (an upper bound) where it does not."""
    import types

    from benchmarks import bench_sparse_dense as sd

    args = types.SimpleNamespace(small=True, stand_in=False, out=str(tmp_path), deadline_s=None, verbose=False)
    suite = sd.Suite(args)
    case = {"workload": "m", "pattern": "rows", "dtype": "bfloat16", "shape": [64, 64, 64], "density": 0.1}
    rows = [
        {**case, "impl": "pit_jax_pre", "median_ms": 0.13, "device_ms": 0.124},
        {**case, "impl": "index", "median_ms": 0.05, "device_ms": 0.048},
        {**case, "impl": "index_mask", "median_ms": 0.035, "device_ms": 0.0046},
    ]
    suite.rows = rows
    suite.finish_case(rows, "m bfloat16 live 10%")
    assert abs(rows[2]["pct_of_product"] - 100 * 0.035 / 0.13) < 1e-9
    assert abs(rows[2]["pct_of_product_device"] - 100 * 0.0046 / 0.124) < 1e-9
    share = next(t for t in sd.targets(rows, {"platform": "gpu"}) if t["id"] == "index_share")
    by = {e["impl"]: e for e in share["entries"]}
    assert by["index_mask"]["basis"] == "device" and by["index_mask"]["met"]
    assert by["index"]["basis"] == "device" and not by["index"]["met"]
    del rows[2]["pct_of_product_device"]  # a trace without GPU kernels: the wall-clock share
    share = next(t for t in sd.targets(rows, {"platform": "gpu"}) if t["id"] == "index_share")
    wall = next(e for e in share["entries"] if e["impl"] == "index_mask")
    assert wall["basis"] == "wall" and wall["measured"] == rows[2]["pct_of_product"] and not wall["met"]


def test_profile_stiles_update_and_refit(tmp_path):
    """One dtype per run with --update keeps the others; --refit fits again from the
    stored timings at this version's shapes (M/K variants: the large shapes only)."""
    import json

    from benchmarks import profile_stiles
    from pit_jax.optimizer import database as dbm

    out = str(tmp_path / "db.json")
    profile_stiles.main(["--smoke", "--out", out, "--dtypes", "bfloat16"])
    profile_stiles.main(["--smoke", "--out", out, "--dtypes", "float16", "--update"])
    doc = json.load(open(out))
    assert {v["dtype"] for v in doc["variants"]} == {"bfloat16", "float16"}
    by_kind = {(v["kind"], v["dtype"]): v for v in doc["variants"]}
    shapes = lambda v: {tuple(r["shape"]) for r in v["timings"]}  # noqa: E731
    small, w_extra = profile_stiles.SMOKE.shapes, profile_stiles.SMOKE.w_shapes
    assert shapes(by_kind[("w", "bfloat16")]) == set(small) | set(w_extra)
    assert shapes(by_kind[("m", "bfloat16")]) == set(small)
    row = by_kind[("w", "float16")]["timings"][0]
    assert row["product_wall_ms"] > 0 and row["index_wall_ms"] > 0  # CPU: the fit's ms are the wall times
    assert row["product_ms"] == row["product_wall_ms"]

    profile_stiles.main(["--smoke", "--out", out, "--refit"])
    again = json.load(open(out))
    assert len(again["variants"]) == len(doc["variants"]) and "refit_of" in again["profile"]
    for v, w in zip(doc["variants"], again["variants"]):
        assert v["kind"] == w["kind"] and v["dtype"] == w["dtype"]
        assert w["product"] == pytest.approx(v["product"])  # same timings, same fit
    dbm.parse(again, out)


def test_profile_stiles_refit_recounts_m_features_at_the_kernels_tile(tmp_path):
    """--refit of an M-axis entry fit at another compute tile than its dtype runs (exact
    float32: the generic kernel's 128 x 128) counts its features again from each timing's
    shape and live rows; the fit then matches times made at that tile. Entries of other
    kinds at a stale tile are kept as they are (they need their patterns)."""
    import json

    import numpy as np

    from benchmarks import profile_stiles
    from pit_jax.optimizer import cost_model
    from pit_jax.optimizer import database as dbm

    m_spec, k_spec, d_spec = dbm.spec_for("m", (1, None)), dbm.spec_for("k", (32, 8)), dbm.spec_for("dense", None)
    true_tile = dbm.compute_tile(m_spec, "float32")
    assert true_tile != m_spec.compute_tile
    true = dbm.Variant("m", (1, None), true_tile, "float32", (0, 0, 0), (0, 0, 0))
    stale = dbm.Variant("m", (1, None), m_spec.compute_tile, "float32", (0, 0, 0), (0, 0, 0))
    rows = []
    for m, k, n in profile_stiles.FULL.shapes:
        for density in (0.5, 0.1, 0.01):
            mask = np.zeros((m, 1), bool)
            mask[: round(density * m)] = True
            prob = cost_model.Problem("x", 1, m, k, n, 4)
            pf, xf, _ = cost_model.features(true, cost_model.Coverage(mask), prob, 132)
            stale_pf, _, _ = cost_model.features(stale, cost_model.Coverage(mask), prob, 132)
            rows.append({"shape": [m, k, n], "sparsity": 1 - density, "density": density,
                         "product_ms": 0.01 + 0.05 * pf[1], "index_ms": 0.01 + 0.3 * xf[1],
                         "product_features": list(stale_pf), "index_features": list(xf)})
    dense_rows = [{"shape": [s, s, s], "sparsity": 0.0, "product_ms": 1.0 + s / 1e3, "product_features": [1.0, s / 1e3, 0.0]}
                  for s in (1024, 2048)]
    entries = [profile_stiles.fit_entry("dense", None, list(d_spec.compute_tile), "float32", "", dense_rows),
               profile_stiles.fit_entry("m", [1, None], list(m_spec.compute_tile), "float32", "", rows),
               profile_stiles.fit_entry("k", [32, 8], [32, 32, 32], "float32", "", rows)]
    assert entries[1]["fit"]["product"]["rel_rms"] > 0.1  # the stale tile's features miss the times
    out = str(tmp_path / "db.json")
    doc = dbm.document("Synthetic GPU", entries, date="2026-01-01T00:00:00+00:00")
    doc["parallel_slots"] = 132
    json.dump(doc, open(out, "w"))

    profile_stiles.main(["--out", out, "--refit"])
    doc = json.load(open(out))
    assert doc["profile"]["retiled"] == [f"m/1xK/float32: features recounted at {list(true_tile)} (was {list(m_spec.compute_tile)})"]
    again = {v["kind"]: v for v in doc["variants"]}
    assert again["m"]["compute_tile"] == list(true_tile)
    assert again["m"]["fit"]["product"]["rel_rms"] < 1e-6
    assert again["m"]["product"]["ms_per_gmac"] == pytest.approx(0.05)
    assert again["k"]["compute_tile"] == [32, 32, 32] and again["k"]["product"] == entries[2]["product"]
    dbm.parse(json.load(open(out)), out)


def test_mark_dominated():
    """A sparse variant never below 0.8x dense's time at the same shape is marked (the
    planner skips it); one that beats dense clearly once is not, and a stale mark goes."""
    from benchmarks import profile_stiles

    def entry(kind, dtype, times, **extra):
        return {"kind": kind, "dtype": dtype, **extra,
                "timings": [{"shape": [s, s, s], "product_ms": t} for s, t in zip((64, 128), times)]}

    entries = [entry("dense", "tf32", [1.0, 2.0]), entry("k", "tf32", [0.95, 1.7]),
               entry("w", "tf32", [0.9, 0.5], dominated_by_dense="stale"), entry("k", "bfloat16", [5.0, 5.0])]
    profile_stiles.mark_dominated(entries)
    assert "0.85x dense's time in all 2" in entries[1]["dominated_by_dense"]
    assert "dominated_by_dense" not in entries[2]
    assert "dominated_by_dense" not in entries[3]  # no dense entry of its dtype to compare with
    assert "dominated_by_dense" not in entries[0]


def test_shipped_databases_carry_their_dominated_marks():
    """Every shipped STile database is marked as its own timings imply (refit after a rule change)."""
    import copy
    import json

    from benchmarks import profile_stiles
    from pit_jax.optimizer import database as dbm

    for slug in dbm.shipped():
        doc = json.load(open(os.path.join(dbm.DB_DIR, slug + ".json")))
        entries = copy.deepcopy(doc["variants"])
        profile_stiles.mark_dominated(entries)
        assert [e.get("dominated_by_dense") for e in entries] == [e.get("dominated_by_dense") for e in doc["variants"]], slug


def test_bench_block_topk_smoke(tmp_path):
    from benchmarks import bench_block_topk

    rows = bench_block_topk.main(["--small", "--out", str(tmp_path)])
    assert len(rows) == 9 and all(r["median_ms"] > 0 for r in rows)
    assert {r["impl"] for r in rows} == {"pit_jax", "pit_jax one call", "jnp sums+sort"}
    assert len(list(tmp_path.glob("block_topk_*.json"))) == 1


def test_bench_index_smoke(tmp_path):
    from benchmarks import bench_index

    rows = bench_index.main(["--small", "--out", str(tmp_path)])
    assert len(rows) == 14 and all(r["median_ms"] > 0 for r in rows)
    assert len(list(tmp_path.glob("index_*.json"))) == 1


def test_bench_index_baseline_lists_the_live_tiles():
    """The plain-JAX baseline builds the same flat and grouped lists as pit_jax.index."""
    import pit_jax
    from benchmarks import bench_index

    x = bench_index.matrix_sets(jax.random.PRNGKey(3), 128, (32, 64), 0.3, jnp.float32, 1)[0][0]
    for by in ("row", "col"):
        flat, count, lists, counts = bench_index.jnp_tile_index(x != 0, 32, True, 64, by)
        idx = pit_jax.index(x, (32, 64), group_by=by)
        assert int(count) == int(idx.count)
        assert sorted(np.asarray(flat)[: int(count)].tolist()) == sorted(np.asarray(idx.tiles)[: int(count)].tolist())
        ours = np.asarray(idx.row_count if by == "row" else idx.col_count)
        np.testing.assert_array_equal(np.asarray(counts), ours)


def test_moe_targets_scoring(tmp_path):
    """bench_moe scores issue 5's targets from its rows: first / ffn by the wall-time ratio
    to the oracle, fig8 by weight reads against the copy in device time where a row has it;
    `why` only for a meaningful (full-size GPU) miss; --rescore adds them to a file."""
    import json

    from benchmarks import bench_moe

    def case(workload, t, e, k, routing):
        return {"workload": workload, "T": t, "D": 768, "F": 3072, "E": e, "k": k, "routing": routing}

    first, ffn = case("first", 16384, 8, 1, "skewed"), case("ffn_fwd_bwd", 16384, 8, 2, "skewed")
    f8a, f8b = case("fig8", 4096, 64, 1, "uniform"), case("fig8", 4096, 128, 1, "uniform")
    rows = [
        {**first, "impl": "oracle", "ms": 0.8}, {**first, "impl": "pit_jax", "ms": 1.04},
        {**ffn, "impl": "oracle", "ms": 10.0}, {**ffn, "impl": "pit_jax", "ms": 12.0},
        {**f8a, "impl": "pit_jax", "ms": 0.12, "weight_gbs": 3000.0, "device_weight_gbs": 3100.0},
        {**f8b, "impl": "pit_jax", "ms": 0.2, "weight_gbs": 3400.0},
        {**f8b, "impl": "ragged_dot_sort", "ms": None},
    ]
    meta = {"platform": "gpu", "copy_bandwidth_gbs": 4000.0}
    by = {t["id"]: t for t in bench_moe.targets(rows, meta)}
    assert by["first"]["met"] is False and by["first"]["worst"]["measured"] == pytest.approx(1.3)
    assert by["first"]["why"] and by["first"]["meaningful"]
    assert by["ffn"]["met"] is True and by["ffn"]["why"] is None
    fig8 = {e["case"]: e for e in by["fig8"]["entries"]}
    assert fig8["fig8 T4096 E64 k1 uniform"]["basis"] == "device"
    assert fig8["fig8 T4096 E64 k1 uniform"]["measured"] == pytest.approx(77.5)
    assert fig8["fig8 T4096 E128 k1 uniform"]["basis"] == "wall" and fig8["fig8 T4096 E128 k1 uniform"]["met"]
    assert by["fig8"]["met"] is False and by["fig8"]["cases_met"] == 1
    small = bench_moe.targets(rows, {**meta, "small": True})
    assert not any(t["meaningful"] or t["why"] for t in small)
    path = tmp_path / "moe.json"
    path.write_text(json.dumps({"suite": "moe", "meta": meta, "rows": rows}))
    assert bench_moe.main(["--rescore", str(path)]) == 0
    data = json.loads(path.read_text())
    assert [t["id"] for t in data["targets"]] == ["first", "ffn", "fig8"] and data["meta"]["rescored"]


def test_attention_launch_model():
    """The long attention backward's launch model: no span beats a perfect packing, and
    numbering the causal dK / dV blocks from the first keys (the kernel's order) shortens
    the bench's documents' span, while the bidirectional grid is unchanged."""
    from benchmarks import attention_launch_model as model

    docs = [1439, 816, 672, 579, 517, 393, 384, 258]
    spans = {}
    for causal in (False, True):
        for first in (False, True):
            costs = model.backward_costs(docs, 12, 12, causal, first)
            assert len(costs) == 2 * 12 * 12 * len(docs)
            spans[causal, first] = model.span(costs, 264)
            assert spans[causal, first] >= sum(costs) / 264 - 1e-9
    assert spans[True, True] < spans[True, False]
    assert spans[False, True] == spans[False, False]
    model.main([])  # the bench's documents, as docs/notes/varlen_attention.md quotes


def test_attention_order_ab_small():
    """The launch-order probe runs (tiny batch on the CPU: the timing path, not the order)."""
    from benchmarks import attention_order_ab

    rows = attention_order_ab.main(["--small"])
    assert [r[0] for r in rows] == ["glue seed 0"] and all(t > 0 for r in rows for t in r[1:])
