"""Where a workload's time goes on the GPU: host dispatch and wall per call, kernel time,
span and the heaviest kernels, per variant, from a profiler trace.

    python -m benchmarks.kernel_profile bert                   # BERT b32 inference: dense, dense_cudnn, pit
    python -m benchmarks.kernel_profile bert --bf16w           # the same with the weights stored in bf16
    python -m benchmarks.kernel_profile bert --cast-kernels    # float32 weights cast at the call's start
    python -m benchmarks.kernel_profile bert --grouped-casts   # ... by pit_jax.cast_matrices (bert.cast_kernels)
    python -m benchmarks.kernel_profile prune --tile 32x64 --density 0.02   # pruned training step
    python -m benchmarks.kernel_profile bert --small           # tiny model (CPU: no kernel table)
    python -m benchmarks.kernel_profile bert_train             # BERT b32 fine-tuning step (adamw)
    python -m benchmarks.kernel_profile moe_train --experts 8 --top-k 1   # Switch MoE training step
    python -m benchmarks.kernel_profile moe_first              # issue 5's first FFN matmul: oracle, pit
    python -m benchmarks.kernel_profile opt --d 5120 --density 0.026     # OPT layer inference (issue 7)
    python -m benchmarks.kernel_profile sparse_dense --axis k --tile 32x1 --density 0.1   # issue 4's K-axis case
    python -m benchmarks.kernel_profile sparse_dense --density 0.026 --shape 4096,20480,5120   # OPT d 5120's fc2
    python -m benchmarks.kernel_profile sparse_dense --axis m --dtype tf32 --density 0.5 --shape 16384,4096,4096
    python -m benchmarks.kernel_profile sparse_dense --axis m --bwd --density 0.5 --shape 16384,4096,4096   # its dx, dw
    python -m benchmarks.kernel_profile prune --density 0.2 --only dense,pit --save-hlo /tmp/h   # then:
    python -m benchmarks.hlo_schedule /tmp/h/prune_dense.hlo.txt /tmp/h/prune_pit.hlo.txt --profile /tmp/h/prune.json

dispatch = time for `calls` asynchronous calls to return (the host's work per call); wall =
until their results are ready; kernel = summed kernel durations per call; span = first
kernel start to last kernel end per call (kernel + gaps between kernels). The numbers in
docs/workloads.md and docs/notes/ that cite "a kernel-time profile" come from this tool
(or its one-off predecessors).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from benchmarks import common, hlo_schedule  # noqa: E402


def _bert_batch(small):
    """BERT-base (or tiny), a GLUE-like batch of 32 x 128 (4 x 32), the attention
    implementation and float32 parameters: (cfg, (tokens, lengths, labels), attn, params)."""
    from pit_models import bert, common as mc

    cfg = bert.BertConfig.tiny(dtype=jnp.bfloat16) if small else bert.BertConfig.base(max_len=512)
    batch, seq = (4, 32) if small else (32, 128)
    rng = np.random.default_rng(0)
    data = bert.synthetic_batch(rng, cfg, batch, seq, mc.sample_lengths(rng, batch, **mc.GLUE))
    attn = mc.resolve_attention("auto", batch, seq, cfg.heads, cfg.head_dim, cfg.dtype)
    params = jax.jit(bert.BertClassifier(cfg, "dense", "xla").init)(jax.random.PRNGKey(0), *data[:2])
    return cfg, data, attn, params


def _cast_kernels(params):
    """params with every "kernel" leaf (the linears' weight matrices) cast to bf16: the
    casts all at the start of the call, independent of each other, where XLA may fuse
    them horizontally (the model casts each one where its layer runs)."""
    def cast(path, a):
        return a.astype(jnp.bfloat16) if getattr(path[-1], "key", None) == "kernel" else a
    return jax.tree_util.tree_map_with_path(cast, params)


def _bert(small, bf16w=False, bf16_all=False, cast_kernels=False, grouped_casts=False):
    from pit_models import bert

    from benchmarks.bench_workloads import bert_models, bf16_weights

    cfg, (tokens, lengths, _), attn, params = _bert_batch(small)
    if bf16w:  # bench_workloads' infer_bf16w: weight matrices stored in bf16
        params = bf16_weights(params)
    if bf16_all:  # every parameter in bf16, biases and norm parameters too
        params = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), params)
    pre = _cast_kernels if cast_kernels else (lambda p: p)
    if grouped_casts:  # one pit_mask_blocks launch per kernel shape
        pre = functools.partial(bert.cast_kernels, cfg=cfg)
    return {name: (jax.jit(lambda p, t, ln, m=m: m.apply(pre(p), t, ln)[1]), (params, tokens, lengths))
            for name, m in bert_models(cfg, attn).items()}


def _bert_train(small, grouped_casts=False):
    import optax
    from pit_models import bert

    from benchmarks.bench_workloads import _train_step, bert_models

    cfg, (tokens, lengths, labels), attn, params = _bert_batch(small)
    tx = optax.adamw(1e-4)
    args = (params, jax.jit(tx.init)(params), tokens, lengths, labels)
    # as bench_workloads' BERT "train" rows: pit_xla_norm keeps XLA's norms (live_norm=False)
    models = dict(bert_models(cfg, attn), pit_xla_norm=bert.BertClassifier(cfg, "pit", attn, live_norm=False),
                  pit_dense_rows=bert.BertClassifier(cfg, "pit", attn, dead_rows="dense"))
    # grouped_casts: the pit steps' kernels cast by bert.cast_kernels
    out = {name: (jax.jit(_train_step(functools.partial(bert.loss_fn, m, grouped_casts=grouped_casts and
                                                        name.startswith("pit")), tx)), args)
           for name, m in models.items()}
    # the optimizer update alone (adamw over every parameter), as in the steps above
    grads = jax.tree_util.tree_map(jnp.ones_like, params)

    def update(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    out["adamw_only"] = (jax.jit(update), (params, args[1], grads))
    return out


def _moe_train(small, experts, top_k):
    """The Switch MoE training step (adamw) of bench_workloads' moe rows (its model, batch
    and parameters: bench_workloads.moe_point), for dense, ragged and pit."""
    import optax
    from pit_models import switch

    from benchmarks.bench_workloads import _train_step, moe_point

    cfg, tokens, labels, params = moe_point(small, experts, top_k)
    tx = optax.adamw(1e-4)
    args = (params, jax.jit(tx.init)(params), tokens, labels)
    return {mode: (jax.jit(_train_step(functools.partial(switch.loss_fn, switch.SwitchClassifier(cfg, mode)), tx)),
                   args) for mode in ("dense", "ragged", "pit")}


def _moe_first(small, experts, top_k):
    """Issue 5's first FFN matmul as bench_moe's `first` case runs it (T 16384, D 2048,
    F 8192, skewed routing; --small divides each by 16): the oracle (one dense [T*k, D] @
    [D, F] product, no routing) and pit (moe_index + grouped_matmul, the index built inside
    the call)."""
    from benchmarks.bench_moe import input_sets, pit_first

    s = 16 if small else 1
    ((x, w, ids),) = input_sets(np.random.default_rng(0), 16384 // s, 2048 // s, 8192 // s, experts, top_k, "skewed", 1)
    xa = jnp.repeat(x, top_k, axis=0) if top_k > 1 else x
    return {"oracle": (jax.jit(jnp.matmul), (xa, w[0])), "pit": (jax.jit(pit_first), (x, w, ids))}


def _opt(small, d, density):
    """One OPT decoder layer's inference as bench_workloads' opt rows run it (its model and
    batch: bench_workloads.opt_point), for dense, pit_m and pit."""
    from benchmarks.bench_workloads import opt_point

    models, params, x, lengths, _ = opt_point(small, d, density)
    return {mode: (jax.jit(lambda p, x, ln, m=model: m.apply(p, x, ln)[0]), (params, x, lengths))
            for mode, model in models.items()}


# --dtype of the sparse_dense workload -> (array dtype, precision)
_SD_DTYPES = {"bfloat16": (jnp.bfloat16, None), "float16": (jnp.float16, None),
              "tf32": (jnp.float32, "tensorfloat32"), "float32": (jnp.float32, "highest")}


def _sparse_dense(small, axis, tile_name, density, shape=(4096, 4096, 4096), dtype="bfloat16", bwd=False):
    """One case of issue 4's suite (bench_sparse_dense's data, 4096^3 unless `shape` =
    (M, K, N) says otherwise): dense `x @ w`, pit (sparse_dense building its index inside
    the jit) and pit_pre (the index built outside), and on the M axis (random live rows)
    the oracle on the compacted rows: where the index, the operand transposes and the
    product each go. `bwd` (M axis): the suite's m_bwd instead, (dx, dw) given dy for each
    variant (jax.vjp of pit; dense and oracle as the suite writes them)."""
    import pit_jax
    from benchmarks.bench_sparse_dense import make_kw_set, make_m_set

    m, k, n = (256, 256, 256) if small else shape
    dt, prec = _SD_DTYPES[dtype]

    def mm(a, b):
        return jnp.matmul(a, b, precision=prec)

    matmul = jax.jit(mm)
    oracle = {}  # M axis only: cuBLAS on the compacted rows
    if axis == "m":
        tile = None
        s = make_m_set(jax.random.PRNGKey(0), m=m, k=k, n=n, n_live=max(1, round(m * density)), dtype=dt, grad=bwd)
        idx = jax.jit(lambda a: pit_jax.index(a, "row"))(s["x"])
        oracle["oracle"] = (matmul, (s["x_live"], s["w"]))
        if bwd:
            dense_bwd = jax.jit(lambda x, w, g: (mm(g, w.T), mm(x.T, g)))

            def vjp(*i):
                def run(x, w, g):
                    return jax.vjp(lambda x, w: pit_jax.sparse_dense(x, w, *i, axis="m", precision=prec), x, w)[1](g)
                return run

            pre = jax.jit(lambda x, w, g, i: vjp(i)(x, w, g))
            return {"dense": (dense_bwd, (s["x"], s["w"], s["g"])),
                    "oracle": (dense_bwd, (s["x_live"], s["w"], s["g_live"])),
                    "pit": (jax.jit(vjp()), (s["x"], s["w"], s["g"])), "pit_pre": (pre, (s["x"], s["w"], s["g"], idx))}
    else:
        tile = tuple(int(v) for v in tile_name.split("x"))
        s = make_kw_set(jax.random.PRNGKey(0), m=m, k=k, n=n, density=density, axis=axis, tile=tile,
                        pattern="random", dtype=dt)
        src = s["w"] if axis == "w" else s["x"]
        idx = jax.jit(lambda a: pit_jax.index(a, tile, group_by="col" if axis == "w" else "row"))(src)
    xw = (s["x"], s["w"])
    return {"dense": (matmul, xw), **oracle,
            "pit": (jax.jit(lambda x, w: pit_jax.sparse_dense(x, w, axis=axis, micro_tile=tile, precision=prec)), xw),
            "pit_pre": (jax.jit(lambda x, w, i: pit_jax.sparse_dense(x, w, i, axis=axis, precision=prec)), (*xw, idx)),
            # M axis: the same with the dead rows left unwritten (what the zero-fill costs).
            **({"pit_unspecified": (jax.jit(lambda x, w, i: pit_jax.sparse_dense(
                x, w, i, axis=axis, precision=prec, dead_rows="unspecified")), (*xw, idx))} if axis == "m" else {})}


def _short(name):
    """A kernel's name without its return type, namespaces and parameter list, template
    arguments kept whole: kernels that differ only there (the row gather's forms) stay
    apart in the table."""
    n = re.sub(r"^void ", "", name)
    n = re.sub(r"(?:\(anonymous namespace\)|[A-Za-z_]\w*)::", "", n)
    depth = 0
    for i, ch in enumerate(n):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and i > 0:
            return n[:i]
    return n


def _category(name):
    """A kernel's kind, by its name: what part of a step it belongs to."""
    n = name.lower()
    if "pit" in n:
        return "pit_jax"
    if any(s in n for s in ("gemm", "nvjet", "xmma", "cutlass", "cublas")):
        return "cuBLAS"
    if any(s in n for s in ("cudnn", "fmha", "flash", "sdpa")):
        return "cuDNN"
    if "memcpy" in n or "memset" in n:
        return "memcpy/memset"
    # "wrapped_*": an HLO op XLA left unfused and runs as a kernel of its own
    if any(s in n for s in ("fusion", "loop_", "input_", "reduce", "transpose", "convert", "copy", "wrapped_")):
        return "XLA fusion"
    return "other"


def _prune(small, tile_name, density):
    import optax
    import sparse_training
    from pit_models import bert, pruning

    cfg = bert.BertConfig.tiny(dtype=jnp.bfloat16) if small else bert.BertConfig.base()
    batch, seq = (4, 32) if small else (32, 128)
    tile = pruning.parse_tile(tile_name)
    data = bert.synthetic_batch(np.random.default_rng(1), cfg, batch, seq, np.full((batch,), seq, np.int32))
    tx = optax.adamw(1e-4)
    steps, _, dense = sparse_training.make_steps(cfg, tile, tx)
    params = jax.jit(dense.init)(jax.random.PRNGKey(0), data[0], data[1])
    args = (params, jax.jit(tx.init)(params), *data, jnp.float32(density))
    routes = sparse_training.plan_routes(params, density, tile, batch * seq, cfg.dtype)
    # the pit steps' state carries the partial block scores the last update would have left
    scored = (params, sparse_training.init_state("pit", params, args[1], tile, routes), *args[2:])
    scored_w = (params, sparse_training.init_state("pit", params, args[1], tile), *args[2:])
    cache = {}
    planned = sparse_training.routed_pit_step(cache, cfg, tile, tx, routes)
    rownorm = sparse_training.routed_pit_step(cache, cfg, tile, tx, routes, row_norms=True)
    w_rownorm = sparse_training.routed_pit_step(cache, cfg, tile, tx, {}, row_norms=True)  # {}: W axis everywhere
    # both twins with their parameter-gradient sums tied to their inputs (pit_models.tied)
    tied = sparse_training.routed_pit_step(cache, cfg, tile, tx, routes, tied_sums=True)
    # the dense routes' kernels masked by multiplying with element masks (XLA), as before pit_jax.mask_blocks
    jnp_mask = sparse_training.routed_pit_step(cache, cfg, tile, tx, routes, masked_cast="jnp")
    tied_jnp_mask = sparse_training.routed_pit_step(cache, cfg, tile, tx, routes, tied_sums=True, masked_cast="jnp")
    # only the dense routes' kernels masked and cast by mask_blocks, the W-axis kernels cast whole by the model
    tied_mask_routed = sparse_training.routed_pit_step(cache, cfg, tile, tx, routes, tied_sums=True,
                                                       masked_cast="pit")
    dense_tied = sparse_training.make_steps(cfg, tile, tx, tied_sums=True)[0]["dense"]
    print(f"pit's routes at density {density:g}: {routes}")
    return {"dense": (jax.jit(steps["dense"]), args), "dense_masked": (jax.jit(steps["dense_masked"]), args),
            "dense_tied": (jax.jit(dense_tied), args), "pit_tied": (tied, scored),
            "pit_jnp_mask": (jnp_mask, scored), "pit_tied_jnp_mask": (tied_jnp_mask, scored),
            "pit_tied_mask_routed": (tied_mask_routed, scored),
            "pit_w": (jax.jit(steps["pit"]), scored_w), "pit": (planned, scored), "pit_rownorm": (rownorm, scored),
            "dense_rownorm": (jax.jit(steps["dense_rownorm"]), args), "pit_w_rownorm": (w_rownorm, scored_w),
            # the pit step scoring the kernels themselves (a plain optimizer state)
            "pit_unscored": (planned, args)}


def profile(fn, args, *, calls, top):
    """Prints one variant's line and its `top` heaviest kernels; returns the numbers."""
    jax.block_until_ready(fn(*args))
    disp, wall = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        t1 = time.perf_counter()
        jax.block_until_ready(out)
        disp.append((t1 - t0) / calls * 1e3)
        wall.append((time.perf_counter() - t0) / calls * 1e3)
    res = {"dispatch_ms": statistics.median(disp), "wall_ms": statistics.median(wall)}
    kernels = common.trace_kernels(lambda: fn(*args), calls)
    if kernels:
        tot, cnt, cat = collections.Counter(), collections.Counter(), collections.Counter()
        for name, _, dur in kernels:
            tot[_short(name)] += dur
            cnt[_short(name)] += 1
            cat[_category(name)] += dur
        start = min(ts for _, ts, _ in kernels)
        end = max(ts + dur for _, ts, dur in kernels)
        res.update(kernel_ms=sum(tot.values()) / calls * 1e-3, span_ms=(end - start) / calls * 1e-3,
                   kernels=len(kernels) / calls,
                   categories={k: v / calls * 1e-3 for k, v in cat.most_common()}, top=[(n, tot[n] / calls, cnt[n] / calls) for n, _ in tot.most_common(top)])
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload", choices=("bert", "bert_train", "prune", "moe_train", "moe_first", "opt", "sparse_dense"))
    ap.add_argument("--small", action="store_true", help="tiny model (a CPU smoke run)")
    ap.add_argument("--tile", default=None, help="prune: pruning block (32x64); sparse_dense: micro-tile (32x1)")
    ap.add_argument("--axis", default="k", choices=("m", "k", "w"), help="sparse_dense: the sparse operand's axis")
    ap.add_argument("--dtype", default="bfloat16", choices=tuple(_SD_DTYPES), help="sparse_dense: operands' dtype (tf32: float32, TF32 allowed)")
    ap.add_argument("--shape", default="4096,4096,4096", help="sparse_dense: M,K,N")
    ap.add_argument("--bwd", action="store_true", help="sparse_dense --axis m: the backward (dx, dw given dy)")
    ap.add_argument("--density", type=float, default=None,
                    help="prune: live fraction of blocks (0.02); opt: live 32x1 tiles of fc2's input (0.026); "
                         "sparse_dense: live fraction of micro-tiles (0.1)")
    ap.add_argument("--d", type=int, default=2048, help="opt: model width")
    ap.add_argument("--bf16w", action="store_true", help="bert: weight matrices stored in bf16 (infer_bf16w)")
    ap.add_argument("--bf16-all", action="store_true", help="bert: every parameter stored in bf16")
    ap.add_argument("--cast-kernels", action="store_true",
                    help="bert: float32 parameters, the weight matrices cast to bf16 at the start of the call")
    ap.add_argument("--grouped-casts", action="store_true",
                    help="bert: the weight matrices cast by pit_jax.cast_matrices at the start (bert_train: "
                         "the pit steps')")
    ap.add_argument("--experts", type=int, default=8, help="moe_train, moe_first: experts")
    ap.add_argument("--top-k", type=int, default=1, help="moe_train, moe_first: experts per token")
    ap.add_argument("--only", default=None, help="comma-separated variants")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--save-hlo", default=None, metavar="DIR",
                    help="profile each variant's compiled executable, and write its HLO (<workload>_<variant>.hlo.txt) "
                         "and every kernel's time (<workload>.json) to DIR, for benchmarks.hlo_schedule")
    args = ap.parse_args(argv)
    if args.workload == "bert":
        variants = _bert(args.small, args.bf16w, args.bf16_all, args.cast_kernels, args.grouped_casts)
    elif args.workload == "bert_train":
        variants = _bert_train(args.small, args.grouped_casts)
    elif args.workload == "moe_train":
        variants = _moe_train(args.small, args.experts, args.top_k)
    elif args.workload == "moe_first":
        variants = _moe_first(args.small, args.experts, args.top_k)
    elif args.workload == "opt":
        variants = _opt(args.small, args.d, 0.026 if args.density is None else args.density)
    elif args.workload == "sparse_dense":
        variants = _sparse_dense(args.small, args.axis, args.tile or "32x1", 0.1 if args.density is None else args.density,
                                 tuple(int(v) for v in args.shape.split(",")), args.dtype, args.bwd)
    else:
        variants = _prune(args.small, args.tile or "32x64", 0.02 if args.density is None else args.density)
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only.split(",")}
    print(f"{args.workload} on {common.device_info()['device']}, jax {jax.__version__}")
    results = {}
    for name, (fn, fargs) in variants.items():
        if args.save_hlo:
            # The executable whose HLO is written is the one profiled (fusion names match).
            fn = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*fargs).compile()
            os.makedirs(args.save_hlo, exist_ok=True)
            text = fn.as_text()
            with open(os.path.join(args.save_hlo, f"{args.workload}_{name}.hlo.txt"), "w") as f:
                f.write(text)
            print(f"== {name}: column sums {hlo_schedule.placement(text)}")
        r = results[name] = profile(fn, fargs, calls=args.calls, top=10**6 if args.save_hlo else args.top)
        line = f"== {name}: dispatch {r['dispatch_ms']:.3f} ms, wall {r['wall_ms']:.3f} ms per call"
        if "kernel_ms" in r:
            line += f", kernel {r['kernel_ms']:.3f} ms, span {r['span_ms']:.3f} ms, {r['kernels']:.0f} kernels"
        print(line, flush=True)
        if "categories" in r:
            print("  by kind (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in r["categories"].items()))
        for kname, us, n in r.get("top", [])[:args.top]:
            print(f"  {us:9.1f} us  x{n:5.0f}  {kname}")
    if args.save_hlo:
        with open(os.path.join(args.save_hlo, f"{args.workload}.json"), "w") as f:
            json.dump({"device": common.device_info()["device"], "jax": jax.__version__, **results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
