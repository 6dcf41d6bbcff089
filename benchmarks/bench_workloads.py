"""PIT's workloads as Flax models (issue 7), against the dense JAX model and the best
JAX alternative, in one run on the GPU.

    python -m benchmarks.bench_workloads [--out DIR] [--small] [--only bert,bert_long,opt,prune,moe]
                                         [--moe E:k,...] [--deadline-s S] [--verbose]

Workloads (bf16; `--small`: tiny models for a CPU smoke run, numbers meaningless):
  bert       BERT-base (768, 12 heads, 3072, 12 layers), batch 32, max length 128,
             GLUE-like lengths (clipped log-normal, mean ~40): inference (mode "infer":
             float32 parameters cast per call; "infer_bf16w": weight matrices stored in
             bf16) and one fine-tuning step (adamw).
  bert_long  the same with long documents: batch 8, max length 2048 (mean ~600).
  opt        one OPT decoder layer, d in 2048/2560/4096/5120 (FFN 4d), batch 32 x 128
             left-padded GLUE-like lengths, fc1 biases set for 10 % and 2 % live 32x1
             tiles of the fc2 input (see examples/pit_models/opt.py): inference.
  prune      BERT-base fine-tuning step with block magnitude pruning recomputed every
             step, batch 32 x 128 (no padding): 32x64 blocks at density 0.5 / 0.2 / 0.1 /
             0.05 / 0.02, 32x1 and 1x32 blocks at 0.1 / 0.02.
  moe        a Switch-style encoder stack (PIT Fig. 8; examples/pit_models/switch.py):
             hidden 768, 12 heads, 4 layers with an MoE FFN (3072 per expert) in every
             other one, 4096 tokens (32 x 128); 8 / 64 / 128 experts, top-1 and top-2:
             inference and one training step (adamw).
Variants (`impl`):
  dense         nn.Dense + XLA attention with the padding mask (the dense JAX model;
                prune: no pruning at all)
  dense_cudnn   nn.Dense + cuDNN attention with sequence lengths (bert: the best JAX
                alternative) / dense_masked: nn.Dense on w * mask, mask recomputed (prune)
  pit           the PIT model (examples/pit_models): M-axis linears with one row index
                per batch (+ K-axis fc2 for opt; W-axis linears for prune); bert: residual
                adds and layer norms on the valid rows (their gradient too:
                pit_row_layer_norm_bwd), attention by pit_jax.varlen_attention where its
                kernels take the shapes (batch 32 x 128; the long documents' inference
                too, their training keeps cuDNN, whose backward is the faster)
  pit_unspecified  (bert, inference) the PIT model with dead_rows="unspecified": the
                products after the attention and the live-row layer norms leave the
                padding rows unwritten (q, k, v too where the attention is
                pit_jax.varlen_attention, which reads the valid rows only)
  pit_train_attention  (bert_long, inference) pit with training's attention (cuDNN)
  *_grouped_casts  (bert, float32 parameters: "infer" and training) dense and
                pit_unspecified with their kernels cast to bf16 by pit_jax.cast_matrices
                (one launch per kernel shape) where Flax casts each in its layer
  pit_xla_norm  (bert, training) the PIT model with XLA's residual adds and layer norms
                over every row (live_norm=False)
  pit_rownorm   (prune) pit's routes with the residual adds and layer norms by pit_jax's
                row kernels (every row valid): those kernels' gain, not the pruning's
  dense_rownorm (prune) the unpruned step with those row kernels: pit_rownorm's baseline
  pit_tied / dense_tied  (prune) pit and the unpruned step, both with their layer norms
                and bias adds by examples/pit_models/tied.py (gradient column sums tied
                to their inputs, so XLA's schedule cannot defer them): one model, two twins
  pit_m         (opt) M axis everywhere, fc2 included: what the K axis adds
  ragged        (moe) sort by expert + jax.lax.ragged_dot + unsort: the best JAX alternative;
                for moe, `dense` is every expert on every token (E x the FLOPs, same outputs)
Each variant is compiled ONCE (`jit(...).lower(...).compile()`): the memory numbers are
that executable's XLA memory plan (arguments + outputs + temporaries, `mem_mb`), and the
timing is of that executable called back to back (median of `reps` runs of ~20 ms each;
the weights of these models overflow L2, so there is no rotation); bert and prune time
each case's variants in interleaved rounds (`Suite.run_interleaved`: a host-bound step
drifted by 10-30 % within one sequential run on the H100, and BERT's training step
read 7.2 and 8.2 ms in two runs whose kernel time differed by 0.15 ms). `peak_mb` is the
device allocator's process-wide peak after the variant ran (never reset: it only grows;
read it as an upper bound). Outputs of pit are checked against dense (valid tokens) /
dense_masked (prune) in the same run. JSON and a PNG are (re)written after every case.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import common

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from pit_models import bert, common as mcommon, opt, pruning, switch  # noqa: E402

WORKLOADS = ("bert", "bert_long", "opt", "prune", "moe")


def time_compiled(call, *, reps=7, target_s=0.02, budget_s=20.0, min_calls=20):
    """Median ms of `call()` (a compiled variant, see Suite._caller), called back to back
    (common.time_calls)."""
    jax.block_until_ready(call())
    t = common.time_calls(call, reps=reps, target_s=target_s, budget_s=budget_s, min_calls=min_calls,
                          max_calls=200)
    s = t["samples"]
    return {"median_ms": statistics.median(s), "min_ms": min(s), "reps": t["reps"], "calls_per_rep": t["calls_per_rep"]}


def time_round(call):
    """ms a call of one interleaved round (Suite.run_interleaved): `call` back to back for
    ~0.2 s and at least 20 calls, after three waited-for ones (common.time_calls)."""
    return common.time_calls(call, reps=1, target_s=0.2, min_calls=20, max_calls=200)["samples"][0]


class Suite:
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.rows, self.not_run = [], []
        self.meta = dict(common.device_info(), argv=sys.argv[1:], small=args.small, pool_mb=device_limit_mb())
        self.meta["memory_method"] = (
            "mem_mb: XLA memory plan of the variant's executable compiled alone (argument + output + temp - "
            "alias bytes, Compiled.memory_analysis()); peak_mb: device allocator peak_bytes_in_use after the "
            "variant ran (process-wide, never reset)")
        self.path = None
        # one file per --only selection, so split runs into one folder do not overwrite each other
        self.suite = "workloads" + ("_" + "-".join(args.only.split(",")) if args.only else "") + (
            "_small" if args.small else "")

    def left(self):
        return None if not self.args.deadline_s else self.args.deadline_s - (time.time() - self.t0)

    def run(self, case, impl, fn, args, check=None):
        """Compiles fn(*args), records its memory plan, times it; returns its first output.
        Training rows (mode "train": fn a step (p, s, *batch) -> (p, s, ...)) run as a
        training loop, p and s donated and carried from call to call (Suite._caller)."""
        row, compiled = self._compile(case, impl, fn, args)
        out = None
        if compiled is not None:
            try:
                call = self._caller(case, compiled, args)
                out = call()
                self._after(row, out, check)
                row.update(time_compiled(call, budget_s=min(20.0, max(3.0, (self.left() or 60) / 4))))
            except Exception as e:  # noqa: BLE001 - a failing variant does not stop the run
                self._failed(row, e)
            del compiled
        self.rows.append(row)
        self._print(row)
        return out

    def run_interleaved(self, case, variants, rounds=7):
        """Like `run` for each (impl, fn, args, check) of `variants`, but timed in `rounds`
        interleaved rounds (each times every variant once, >= 20 back-to-back calls), the
        median per variant: a host-bound step (the pruned training step issues ~800
        kernels) drifts by 10-30 % over a run on a shared machine, which timing the
        variants one after another turned into differences between them."""
        ready = []
        for impl, fn, args, check in variants:  # first calls (and checks) in this order
            row, compiled = self._compile(case, impl, fn, args)
            if compiled is not None:
                try:
                    call = self._caller(case, compiled, args)
                    self._after(row, call(), check)
                    ready.append((row, call))
                    continue
                except Exception as e:  # noqa: BLE001
                    self._failed(row, e)
            self.rows.append(row)
            self._print(row)
        samples = {id(row): [] for row, _ in ready}
        for _ in range(rounds):
            for row, call in ready:
                samples[id(row)].append(time_round(call))
        for row, _ in ready:
            s = samples[id(row)]
            row.update(median_ms=statistics.median(s), min_ms=min(s), max_ms=max(s), reps=len(s), interleaved=True)
            self.rows.append(row)
            self._print(row)

    def _caller(self, case, compiled, args):
        """How a variant is called: a training row as a training loop (mcommon.ChainedStep,
        its p and s donated by _compile), anything else on `args` every time."""
        if self._chained(case):
            return mcommon.ChainedStep(compiled, args)
        return lambda: compiled(*args)

    @staticmethod
    def _chained(case):
        """Training rows run as a training loop (ChainedStep)."""
        return case.get("mode") == "train"

    def _compile(self, case, impl, fn, args):
        """(row, compiled executable or None: skipped or failed, the row says why). A
        training step's p and s (its first two arguments) are donated, as a training loop
        donates them."""
        left = self.left()
        row = dict(case, impl=impl)
        if left is not None and left <= 0:
            row["note"] = "skipped: deadline"
            self.not_run.append(f"{case['workload']} {case.get('label', '')} {impl}")
            return row, None
        try:
            t = time.perf_counter()
            donate = (0, 1) if self._chained(case) else ()
            compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
            row["compile_s"] = time.perf_counter() - t
            try:
                ma = compiled.memory_analysis()
                row["mem_mb"] = (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
                                 - ma.alias_size_in_bytes) / 2**20
                row["temp_mb"] = ma.temp_size_in_bytes / 2**20
            except Exception:  # noqa: BLE001 - not every backend reports it
                pass
            limit = device_limit_mb()
            if limit and row.get("mem_mb", 0) > limit:  # would not fit: record why instead of an OOM
                row["note"] = f"skipped: XLA memory plan {row['mem_mb']:.0f} MB > device pool {limit:.0f} MB"
                return row, None
            return row, compiled
        except Exception as e:  # noqa: BLE001 - a failing variant does not stop the run
            self._failed(row, e)
            return row, None

    @staticmethod
    def _after(row, out, check):
        """The allocator's peak and the variant's check, after its first call."""
        peak = mcommon.peak_bytes_in_use()
        row["peak_mb"] = None if peak is None else peak / 2**20
        if check is not None:
            row.update(check(out))

    def _failed(self, row, e):
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        if "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower():
            # fits the plan but not the allocator: earlier variants' freed buffers fragment it
            row["note"] = (f"out of memory: XLA memory plan {row.get('mem_mb', float('nan')):.0f} MB, "
                           f"device pool {device_limit_mb() or float('nan'):.0f} MB")
        if self.args.verbose:
            traceback.print_exc()

    def _print(self, r):
        # The timed rows of r's case (workload, label, mode): its dense row and alternative.
        same = [x for x in self.rows if x.get("workload") == r["workload"] and x.get("label") == r.get("label")
                and x.get("mode") == r.get("mode") and x.get("median_ms")]
        base = [x for x in same if x["impl"] == "dense"]
        if base and r.get("median_ms"):
            r["speedup_vs_dense"] = base[0]["median_ms"] / r["median_ms"]
        alt_name = r.get("alternative")
        alt = [x for x in same if x["impl"] == alt_name]
        if alt and r.get("median_ms") and r["impl"] != alt_name:
            r["speedup_vs_alternative"] = alt[0]["median_ms"] / r["median_ms"]
        if r["impl"] == alt_name and r.get("median_ms"):  # the alternative ran after some variants
            for x in same:
                if x["impl"] not in (alt_name, "dense"):
                    x["speedup_vs_alternative"] = r["median_ms"] / x["median_ms"]
        msg = "; ".join(r[k] for k in ("error", "note") if r.get(k)) if "median_ms" not in r else (
            f"{r['median_ms']:9.3f} ms" + (f"  x{r['speedup_vs_dense']:.2f} vs dense" if "speedup_vs_dense" in r else "")
            + (f"  x{r['speedup_vs_alternative']:.2f} vs {alt_name}" if "speedup_vs_alternative" in r else "")
            + (f"  mem {r['mem_mb']:.0f} MB" if r.get("mem_mb") is not None else "")
            + ("" if r.get("ok", True) else f"  CHECK FAILED (err {r.get('max_rel_err'):.3g})"))
        print(f"[{time.time() - self.t0:6.1f}s] {r['workload']:<9} {r.get('label', ''):<28} {r.get('mode', ''):<6} "
              f"{r['impl']:<13} {msg}", flush=True)
        self.write()

    def write(self):
        payload = {"meta": dict(self.meta, wall_s=time.time() - self.t0, not_run_deadline=self.not_run),
                   "results": self.rows}
        payload["meta"]["date"] = self.meta["date"]
        if self.path is None:
            self.path = common.write_results(self.suite, payload, self.args.out)
        else:
            common.write_results(self.suite, payload, self.args.out)
        try:
            plot(self.rows, self.path.replace(".json", ".png"), self.meta)
        except Exception as e:  # noqa: BLE001 - the plot is optional
            if self.args.verbose:
                print(f"plot failed: {e}", file=sys.stderr)


def device_limit_mb():
    """The device allocator's pool (MB), or None (CPU)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001
        return None
    return stats["bytes_limit"] / 2**20 if stats and stats.get("bytes_limit") else None


BERT_VARIANTS = ("dense", "dense_cudnn", "pit", "pit_unspecified")  # bert_models' keys


def bert_models(cfg, attn):
    """The BERT variants that bench_workloads, kernel_profile and train_loop compare, by
    name (BERT_VARIANTS): "dense" (the dense twin: XLA attention over the padded batch),
    "dense_cudnn" (the best JAX alternative: attention `attn`, e.g. cuDNN's with sequence
    lengths), "pit" and "pit_unspecified" (the padding rows of every op after the attention
    left unwritten)."""
    models = (bert.BertClassifier(cfg, "dense", "xla"), bert.BertClassifier(cfg, "dense", attn),
              bert.BertClassifier(cfg, "pit", attn), bert.BertClassifier(cfg, "pit", attn, dead_rows="unspecified"))
    return dict(zip(BERT_VARIANTS, models))


def _train_step(loss_fn, tx):
    """One jitted-able optimizer step on loss_fn(params, *batch): (params, state, loss)."""

    def step(p, s, *batch):
        loss, g = jax.value_and_grad(loss_fn)(p, *batch)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    return step


def _check_loss(tol, ref_loss):
    """A training step's loss (output 2) against the reference variant's."""
    if ref_loss is None:
        return None
    return lambda out: {"max_rel_err": abs(float(out[2]) - ref_loss) / max(abs(ref_loss), 1e-6),
                        "ok": abs(float(out[2]) - ref_loss) <= tol * max(abs(ref_loss), 1.0)}


def _check_rows(tol, ref, valid=None):
    def check(out):
        err = mcommon.max_rel_err(out, ref, valid)
        return {"max_rel_err": err, "ok": bool(err <= tol)}

    return check


def bf16_weights(params):
    """params with every matrix (ndim >= 2: kernels, embedding tables) in bfloat16 and the
    vectors (biases, layer-norm scales and offsets) left in float32."""
    return jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16) if a.ndim >= 2 else a, params)


def bert_case(suite, workload, small):
    long = workload == "bert_long"
    dist = dict(mcommon.LONG_DOC if long else mcommon.GLUE)
    if small:
        cfg = bert.BertConfig.tiny(dtype=jnp.bfloat16, max_len=256)
        batch = 4
        dist = dict(max_len=256 if long else 64, mean=(600 / 8) if long else 20.0, sigma=dist["sigma"], min_len=4)
    else:
        cfg = bert.BertConfig.base(max_len=max(512, dist["max_len"]))
        batch = 8 if long else 32
    seq = dist["max_len"]
    rng = np.random.default_rng(0)
    tokens, lengths, labels = bert.synthetic_batch(rng, cfg, batch, seq, mcommon.sample_lengths(rng, batch, **dist))
    density = float(np.asarray(lengths).sum()) / (batch * seq)
    attn = mcommon.resolve_attention("auto", batch, seq, cfg.heads, cfg.head_dim, cfg.dtype)
    models = bert_models(cfg, attn)
    params = jax.jit(models["dense"].init)(jax.random.PRNGKey(0), tokens, lengths)
    tx = optax.adamw(1e-4)
    opt_state = jax.jit(tx.init)(params)
    valid = np.asarray(mcommon.right_padding_mask(lengths, seq)).reshape(-1)
    label = f"b{batch} s{seq} valid {density:.0%}"
    tol = mcommon.tolerance(cfg.dtype)
    base = dict(workload=workload, label=label, batch=batch, max_len=seq, valid_fraction=density, attention=attn,
                alternative="dense_cudnn", dtype=jnp.dtype(cfg.dtype).name)
    # "infer": the float32 parameters of training, cast to bf16 inside every call (Flax's
    # mixed precision); "infer_bf16w": the weight matrices (kernels, embeddings) stored in
    # bf16 once, as a server holds them, with biases and norm parameters left in float32.
    # Inference calls pass train=False (the attention past 128 tokens: the kernels, whose
    # forward is the faster); bert_long's "pit_train_attention" is "pit" with training's
    # choice (cuDNN there), for comparison.
    # "*_grouped_casts" (float32 parameters only): the kernels cast by `bert.cast_kernels`
    # (pit_jax.cast_matrices, one launch per kernel shape) instead of Flax's cast in each
    # layer (one XLA convert per kernel); the dense twin's tells what the grouped casts
    # give apart from what skipping padding gives.
    variants = [(impl, models[impl], False, False) for impl in ("dense", "dense_cudnn", "pit", "pit_unspecified")]
    if long:
        variants.append(("pit_train_attention", models["pit"], True, False))
    grouped = [(impl + "_grouped_casts", models[impl], False, True) for impl in ("dense", "pit_unspecified")]
    for mode, p_in in (("infer", params), ("infer_bf16w", bf16_weights(params))):
        store, check = _reference_check(lambda ref: _check_rows(tol, ref, valid))
        suite.run_interleaved(dict(base, mode=mode), [
            (impl, lambda p, t, ln, m=m, tr=tr, c=c: m.apply(bert.cast_kernels(p, cfg) if c else p, t, ln,
                                                              train=tr)[1],
             (p_in, tokens, lengths), store if impl == "dense" else check)
            for impl, m, tr, c in variants + (grouped if mode == "infer" else [])])
    # Training: "pit" is the inference model (live-row norms, whose gradient runs the
    # backward target on the valid rows); "pit_unspecified" the same with the padding rows
    # left unwritten (the same gradients); "pit_xla_norm" keeps XLA's residual adds and
    # layer norms over every row, for comparison.
    models["pit_xla_norm"] = bert.BertClassifier(cfg, "pit", attn, live_norm=False)
    store, check = _reference_check(lambda ref: _check_loss(tol, float(ref[2])))
    train = [(impl, models[impl], False) for impl in ("dense", "dense_cudnn", "pit", "pit_unspecified", "pit_xla_norm")]
    suite.run_interleaved(dict(base, mode="train"), [
        (impl, _train_step(functools.partial(bert.loss_fn, m, grouped_casts=c), tx),
         (params, opt_state, tokens, lengths, labels), store if impl == "dense" else check)
        for impl, m, c in train + [("pit_unspecified_grouped_casts", models["pit_unspecified"], True)]])


def _reference_check(make_check):
    """(store, check) for `Suite.run_interleaved`, which runs its variants' checks in
    order after their first calls: `store` keeps the reference variant's output, `check`
    compares a later variant's with it through make_check(reference) (nothing without a
    reference: the reference failed)."""
    ref = {}

    def store(out):
        ref["out"] = out
        return {}

    def check(out):
        return make_check(ref["out"])(out) if "out" in ref else {}

    return store, check


def opt_point(small, d, target):
    """One point of the opt rows: (models, params, x, lengths, attention) of the OPT layer
    of width d (tiny when small) on a batch of 32 x 128 tokens (tiny: 4 x 64), left-padded,
    fc1's biases set for `target` live 32x1 tiles of the fc2 input (opt_activation.build)."""
    import opt_activation

    cfg, batch, seq = (opt.OPTConfig.tiny(dtype=jnp.bfloat16), 4, 64) if small else (opt.OPTConfig.of(d), 32, 128)
    return opt_activation.build(cfg, batch, seq, target, 0)


def opt_case(suite, small, widths=None):
    default_widths, densities = ((None,), (0.1,)) if small else ((2048, 2560, 4096, 5120), (0.1, 0.02))
    widths = default_widths if small or not widths else widths
    for d in widths:
        for target in densities:
            models, params, x, lengths, attn = opt_point(small, d, target)
            cfg = models["dense"].cfg
            batch, seq = x.shape[:2]
            valid = np.asarray(mcommon.left_padding_mask(lengths, seq)).reshape(-1)
            h = jax.jit(models["dense"].apply)(params, x, lengths)[1]
            tiles, elems = opt.tile_density(h), float(jnp.mean(h != 0))
            del h
            label = f"d{cfg.d} tiles {tiles:.1%}"
            # the pit modes' attention (examples/pit_models/opt.py): the kernels where they apply
            use_kernels = mcommon.varlen_kernels_apply(batch, seq, cfg, causal=True)
            pit_attn = "pit_jax.varlen_attention" if use_kernels else attn
            base = dict(workload="opt", label=label, d=cfg.d, batch=batch, max_len=seq, mode="infer",
                        target_tile_density=target, tile_density=tiles, element_density=elems,
                        valid_fraction=float(valid.mean()), attention=attn, pit_attention=pit_attn, alternative="pit_m",
                        dtype=jnp.dtype(cfg.dtype).name)
            ref = None
            for impl in ("dense", "pit_m", "pit"):
                m = models[impl]
                chk = None if ref is None else _check_rows(mcommon.tolerance(cfg.dtype), ref, valid)
                out = suite.run(base, impl, lambda p, x, ln, m=m: m.apply(p, x, ln)[0], (params, x, lengths), chk)
                if impl == "dense" and out is not None:
                    ref = out
            del models, params, x, ref


def prune_case(suite, small, tiles=None):
    import sparse_training

    if small:
        cfg = bert.BertConfig.tiny(dtype=jnp.bfloat16)
        batch, seq = 4, 64
        plan = [("32x64", (0.5, 0.1)), ("32x1", (0.1,)), ("1x32", (0.1,))]
    else:
        cfg = bert.BertConfig.base()
        batch, seq = 32, 128
        plan = [("32x64", (0.5, 0.2, 0.1, 0.05, 0.02)), ("32x1", (0.1, 0.02)), ("1x32", (0.1, 0.02))]
    rng = np.random.default_rng(1)
    data = bert.synthetic_batch(rng, cfg, batch, seq, np.full((batch,), seq, np.int32))
    tx = optax.adamw(1e-4)
    if tiles:
        plan = [(t, ds) for t, ds in plan if t in tiles]
    for tile_name, densities in plan:
        tile = pruning.parse_tile(tile_name)
        steps, _, dense = sparse_training.make_steps(cfg, tile, tx)
        # pit_tied / dense_tied: both twins with their parameter-gradient sums tied to their
        # inputs (pit_models.tied), so that XLA's schedule cannot defer them in either
        tied_steps = sparse_training.make_steps(cfg, tile, tx, tied_sums=True)[0]
        routed = {}
        params = jax.jit(dense.init)(jax.random.PRNGKey(0), data[0], data[1])
        opt_state = jax.jit(tx.init)(params)
        for d in densities:
            label = f"{tile_name} density {d:g}"
            base = dict(workload="prune", label=label, tile=tile_name, density=d, batch=batch, max_len=seq,
                        mode="train", alternative="dense_masked", dtype=jnp.dtype(cfg.dtype).name)
            args = (params, opt_state, *data, jnp.float32(d))
            # The masked twin's loss, taken from its first call (before the pit variants'),
            # is the reference of their check; none if the twin failed.
            twin = {}

            def twin_loss(out, twin=twin):
                twin["loss"] = float(out[2])
                return {}

            def chk(out, twin=twin):
                if "loss" not in twin:
                    return {}
                r = twin["loss"]
                return {"max_rel_err": abs(float(out[2]) - r) / max(abs(r), 1e-6),
                        "ok": abs(float(out[2]) - r) <= mcommon.tolerance(cfg.dtype) * max(abs(r), 1.0),
                        "live_fraction": float(out[3])}

            # pit: the STile per linear that the optimizer picks at this density (W axis or
            # the dense product on the masked kernel); pit_w: the W axis everywhere. The
            # unpruned dense step in every case, so that each case's ratios come from the
            # same interleaved rounds.
            routes = sparse_training.plan_routes(params, d, tile, batch * seq, cfg.dtype)
            # the pit steps' state: with the partial block scores the last update would have left
            scored = (params, sparse_training.init_state("pit", params, opt_state, tile, routes), *args[2:])
            scored_w = (params, sparse_training.init_state("pit", params, opt_state, tile), *args[2:])
            # pit_rownorm: pit's routes with the layer norms by pit_jax's row kernels (a
            # gain of those kernels, not of the pruning; issue 7 counts pit);
            # dense_rownorm: the unpruned step on those kernels, pit_rownorm's own baseline.
            variants = [("dense", steps["dense"], args, None), ("dense_masked", steps["dense_masked"], args, twin_loss),
                        ("pit", sparse_training.routed_pit_step(routed, cfg, tile, tx, routes), scored, chk),
                        ("pit_rownorm", sparse_training.routed_pit_step(routed, cfg, tile, tx, routes, True), scored,
                         chk), ("dense_rownorm", steps["dense_rownorm"], args, None),
                        ("pit_tied", sparse_training.routed_pit_step(routed, cfg, tile, tx, routes, tied_sums=True),
                         scored, chk), ("dense_tied", tied_steps["dense"], args, None)]
            if any(r != "w" for r in routes.values()):
                variants.append(("pit_w", steps["pit"], scored_w, chk))
            suite.run_interleaved(dict(base, routes=routes), variants)


def _check_tokens(tol, ref):
    """MoE hidden states: per token, a few may be rerouted (see switch.token_agreement)."""
    return lambda out: switch.token_agreement(out, ref, tol)


def moe_case(suite, small, only=None):
    plan = [(4, 1), (4, 2)] if small else [(8, 1), (64, 1), (128, 1), (8, 2), (64, 2), (128, 2)]
    if only:  # "E:k,E:k"
        plan = [tuple(int(v) for v in c.split(":")) for c in only.split(",")]
    tx = optax.adamw(1e-4)
    for experts, top_k in plan:
        try:
            _moe_config(suite, small, experts, top_k, tx)
        except Exception as e:  # noqa: BLE001 - e.g. an out-of-memory surfacing late: go on with the next
            print(f"moe E{experts} top-{top_k}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            suite.rows.append(dict(workload="moe", label=f"E{experts} top-{top_k}", impl="setup",
                                   error=f"{type(e).__name__}: {str(e)[:300]}"))


def moe_point(small, experts, top_k):
    """The Switch model of one (experts, top_k) point of the moe rows and its batch (32 x
    128 tokens; tiny: 4 x 16): (cfg, tokens, labels, params)."""
    if small:
        cfg = switch.SwitchConfig.tiny(experts=experts, top_k=top_k, dtype=jnp.bfloat16)
    else:
        cfg = switch.SwitchConfig.base(experts=experts, top_k=top_k)
    tokens, labels = switch.synthetic_batch(np.random.default_rng(2), cfg, *((4, 16) if small else (32, 128)))
    params = jax.jit(switch.SwitchClassifier(cfg, "pit").init)(jax.random.PRNGKey(0), tokens)
    return cfg, tokens, labels, params


def _moe_config(suite, small, experts, top_k, tx):
    """One (experts, top_k) point: inference and a training step of dense, ragged and pit."""
    cfg, tokens, labels, params = moe_point(small, experts, top_k)
    models = {m: switch.SwitchClassifier(cfg, m) for m in ("dense", "ragged", "pit")}
    opt_state = jax.jit(tx.init)(params)
    n_moe = sum(cfg.is_moe(i) for i in range(cfg.layers))
    label = f"E{experts} top-{top_k} {tokens.size} tok"
    base = dict(workload="moe", label=label, experts=experts, top_k=top_k, tokens=tokens.size,
                layers=cfg.layers, moe_layers=n_moe, alternative="ragged", dtype=jnp.dtype(cfg.dtype).name)
    tol = mcommon.tolerance(cfg.dtype)
    ref = None
    for impl in ("dense", "ragged", "pit"):
        m = models[impl]
        chk = None if ref is None else _check_tokens(tol, ref)
        out = suite.run(dict(base, mode="infer"), impl, lambda p, t, m=m: m.apply(p, t)[1], (params, tokens), chk)
        if ref is None and out is not None:
            ref = out  # dense, or ragged where dense failed
    del ref
    ref_loss = None
    # pit before ragged: ragged_dot's autodiff can spend minutes failing out of memory at
    # E = 128 (the XLA plan fits the pool, the allocator does not), which must not cost
    # the pit row its place before the deadline.
    for impl in ("dense", "pit", "ragged"):
        step = _train_step(functools.partial(switch.loss_fn, models[impl]), tx)
        out = suite.run(dict(base, mode="train"), impl, step, (params, opt_state, tokens, labels),
                        _check_loss(tol, ref_loss))
        if ref_loss is None and out is not None:
            ref_loss = float(out[2])
        del out
    del params, opt_state


def plot(rows, path, meta):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("median_ms") and r["impl"] != "dense" and "speedup_vs_dense" in r]
    if not timed:
        return
    impls = sorted({r["impl"] for r in timed}, key=lambda s: (s != "pit", s))
    groups = list(dict.fromkeys(f"{r['workload']} {r.get('mode', '')}\n{r.get('label', '')}" for r in timed))
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(groups) * len(impls)), 5))
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        ys = []
        for g in groups:
            m = [r for r in timed if r["impl"] == impl and f"{r['workload']} {r.get('mode', '')}\n{r.get('label', '')}" == g]
            ys.append(m[0]["speedup_vs_dense"] if m else 0.0)
        ax.bar(np.arange(len(groups)) + j * width, ys, width, label=impl)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2)
    ax.set_xticklabels(groups, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("speed-up over the dense JAX model")
    ax.set_title(f"pit_jax workloads on {meta['device']} ({meta['date'][:10]})")
    ax.legend()
    common.save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_out_argument(ap)
    ap.add_argument("--only", default=None, help="comma-separated subset of " + ",".join(WORKLOADS))
    ap.add_argument("--small", action="store_true", help="tiny models (CPU smoke run)")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no new variant after S seconds (default 540 at full size, none with --small; 0 = none)")
    ap.add_argument("--moe", default=None, help="moe: just these E:top_k configurations, e.g. 64:2,128:2")
    ap.add_argument("--prune", default=None, type=lambda v: tuple(t.strip() for t in v.split(",") if t.strip()),
                    help="prune: just these pruning tiles, e.g. 32x64")
    ap.add_argument("--opt-d", default=None, type=lambda v: tuple(int(t) for t in v.split(",") if t.strip()),
                    help="opt: just these widths, e.g. 2048")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    # moe E=128 training plans 45-57 GB: more than JAX's default pool (75 % of an 80 GB card).
    # Takes effect when the backend is not started yet (run as a program); a user's value wins.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    if args.deadline_s is None:
        args.deadline_s = 0.0 if args.small else 540.0
    only = WORKLOADS if not args.only else tuple(args.only.split(","))
    bad = [w for w in only if w not in WORKLOADS]
    if bad:
        ap.error(f"--only: unknown workloads {bad}; choose from {WORKLOADS}")
    suite = Suite(args)
    print(f"workloads on {suite.meta['device']} ({suite.meta['platform']}), jax {jax.__version__}: {', '.join(only)}")
    for w in only:
        try:
            if w in ("bert", "bert_long"):
                bert_case(suite, w, args.small)
            elif w == "opt":
                opt_case(suite, args.small, args.opt_d)
            elif w == "moe":
                moe_case(suite, args.small, args.moe)
            else:
                prune_case(suite, args.small, args.prune)
        except Exception as e:  # noqa: BLE001 - a failing workload does not stop the others
            print(f"{w}: FAILED {type(e).__name__}: {e}", flush=True)
            if args.verbose:
                traceback.print_exc()
            suite.rows.append(dict(workload=w, impl="setup", error=f"{type(e).__name__}: {e}"))
    suite.write()
    cols = ["workload", "mode", "label", "impl", "median_ms", "speedup_vs_dense", "speedup_vs_alternative",
            "mem_mb", "peak_mb", "ok", "note"]
    print(common.table(suite.rows, cols))
    print(f"wrote {suite.path} ({time.time() - suite.t0:.0f} s)")
    failed = [r for r in suite.rows if r.get("ok") is False]
    if failed:
        print(f"{len(failed)} CHECK FAILED rows", flush=True)
    return suite


if __name__ == "__main__":
    main()
