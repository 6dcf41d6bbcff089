"""Sparse training with pit_jax (PIT Fig. 14): BERT fine-tuned with block magnitude pruning
whose mask is recomputed every step, inside the jitted step.

Every encoder linear (qkv, attention output, FFN in/out) keeps only the `density`
fraction of its weight blocks with the largest L1 norm; the mask becomes a W-axis
PitIndex and `sparse_dense` computes x @ (w * mask) on the live blocks only, forward
and dx (the weight gradient is zero off the live blocks; on CUDA it is the masked dense
product, which measured faster than kernels over the live blocks). Compares, in one run:
  pit          SparseDense on the W axis with the recomputed index (or, where the
               optimizer expects it faster, the dense product on the masked kernel);
               the mask by pit_jax.block_topk_groups (block norms and a radix select on
               the device, no sort, one call for every kernel shape; the W-axis
               linears' norms half-summed by the last step's optimizer update,
               `pruning.ScoredState`)
  dense_masked nn.Dense on w * mask (the same mask recomputed every step, by XLA's
               block sums and a sort): what a JAX user writes for pruning, and the
               alternative
  dense        nn.Dense, no pruning (the dense model)
checks pit == dense_masked (outputs and gradients of all params) and that the gradients
are zero outside the live blocks, times one fine-tuning step (adamw) per density (pit
with the STile `pit_jax.plan` picks per linear at that density: the W-axis product or
the dense one on the masked kernel), then
fine-tunes with density going from 50% down to the last one (a cubic schedule; the
density is a traced scalar, so a step compiles once per set of routes; the routes are
re-planned when the density has moved by 10 %).

    python examples/sparse_training.py                       # tiny, CPU
    python examples/sparse_training.py --full                # BERT-base, batch 32 x 128 (GPU)
    python examples/sparse_training.py --full --tile 32x1 --densities 0.1,0.02
    python examples/sparse_training.py --full --tied-sums    # every model's layer norms and bias
                                       # adds by pit_models.tied (both twins; docs/workloads.md)
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # pit_jax when not installed

import jax
import jax.numpy as jnp
import numpy as np
import optax

import pit_jax

from pit_models import bert, common, pruning


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="BERT-base (768/12/3072, 12 layers), bf16, batch 32 x 128")
    ap.add_argument("--tile", default="32x64", help="pruning block of the kernels: 32x64, 32x1 or 1x32")
    ap.add_argument("--densities", default=None,
                    help="live fractions of weight blocks to time (default 0.5,0.2,0.1,0.05,0.02; tiny: 0.5,0.02)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--row-norms", action="store_true",
                    help="the pit model's layer norms by pit_jax's row kernels (not a pruning gain)")
    ap.add_argument("--tied-sums", action="store_true",
                    help="both twins' layer norms and bias adds by pit_models.tied (gradient sums tied to their inputs)")
    return ap.parse_args(argv)


ROUTES = ("w", "dense")


def make_steps(cfg, tile, tx, attention="auto", routes=None, row_norms=False, tied_sums=False,
               masked_cast="pit_all"):
    """{variant: step(params, opt_state, tokens, lengths, labels, density) -> (params, opt_state, loss, live)}.

    The pit step also takes a `pruning.ScoredState` as its state (`init_state`), and
    returns one: the next step's block scores of its W-axis linears then come
    half-summed out of the update (no pass over those weights to score them); with a
    plain optimizer state it scores the kernels themselves. The masks are the same
    either way.

    `routes` {linear: "w" | "dense"} (`bert.LINEARS`; default "w" for each) sets the pit
    step's STile per linear: "w" runs the W-axis product on the live blocks' index,
    "dense" multiplies the kernel by its mask and runs the dense product (the choice
    `plan_routes` makes from the optimizer's database). Both compute x @ (w * mask).
    `row_norms`: the pit step's residual adds and layer norms by pit_jax's row kernels
    (`pit_jax.flax.LayerNorm`, every row valid) instead of flax's, the products as before:
    the same values by other kernels, so a gain there is theirs, not the pruning's;
    "dense_rownorm" is the unpruned step on those kernels, the baseline that separates the two.
    `tied_sums`: every model's flax layer norms and dense / W-axis bias adds by
    `pit_models.tied` (`BertClassifier.tied_sums`), in the pit step and its twins alike.
    `masked_cast`: how the pit step masks and casts its kernels. "pit_all" (default): every
    kernel by `pit_jax.mask_blocks` (one call per kernel shape, reading the live blocks
    only); the W-axis products read the live blocks only, so their zeros change nothing,
    and the cast that the model would run on each whole kernel reads a fraction of it
    (H200, 2026-11-29: -0.07 ms a step at 20 %, -0.10 ms at 5 %). "pit": the dense-routed
    kernels only, the W-axis kernels cast whole by the model. "jnp": the dense-routed
    kernels multiplied by their element masks, as the masked twin does (the same values).
    """
    if masked_cast not in ("pit", "jnp", "pit_all"):
        raise ValueError(f"make_steps: masked_cast must be 'pit', 'jnp' or 'pit_all', got {masked_cast!r}")
    routes = dict(routes or {})
    bad = {k: v for k, v in routes.items() if k not in bert.LINEARS or v not in ROUTES}
    if bad:
        raise ValueError(f"make_steps: routes must map {bert.LINEARS} to one of {ROUTES}, got {bad}")
    scored_linears = scored_in_update(routes)
    dense_linears = frozenset(k for k, v in routes.items() if v == "dense")
    pit = bert.BertClassifier(cfg, "pit", attention, skip_padding=False, row_norms=row_norms, tied_sums=tied_sums)
    dense = bert.BertClassifier(cfg, "dense", attention, tied_sums=tied_sums)
    rownorm = bert.BertClassifier(cfg, "pit", attention, skip_padding=False, row_norms=True, tied_sums=tied_sums)

    def finish(p, s, loss, g, live):
        scored = isinstance(s, pruning.ScoredState)
        u, o = tx.update(g, s.opt if scored else s, p)
        p = optax.apply_updates(p, u)
        # the next step's scores, half-summed inside the update's kernels (XLA fuses them)
        return p, pruning.scored_state(p, o, tile, scored_linears) if scored else o, loss, live

    def pit_step(p, s, t, ln, y, density):
        # recomputed from the current weights, by pit_jax.block_topk_groups (no sort, one
        # call for the four kernel shapes): from the partial scores the last update left
        # in a ScoredState, else from the kernels.
        # The masks stay stacked per kernel shape where their consumers take them so (the
        # W-axis indexes, the live fraction): per-kernel slices would be 48 more kernels.
        partials = s.partials if isinstance(s, pruning.ScoredState) else None
        by_shape = pruning.live_blocks_by_shape(p, density, tile, impl="pit", partials=partials)
        shapes = pruning.kernel_shapes(p)
        routed = lambda n: n.split("/", 1)[1] in dense_linears
        w_axis = {k: v for k, v in by_shape.items() if not any(map(routed, v[0]))}
        blocks = pruning.unstack({k: v for k, v in by_shape.items() if k not in w_axis})
        # one index build per shape: the all-W shapes as stacked, the others' W-axis kernels restacked
        w_blocks = {**w_axis, **pruning.stack({n: b for n, b in blocks.items() if not routed(n)}, shapes)}
        wi = pruning.weight_indexes(w_blocks, tile)
        wi.update({n: bert.DENSE_ROUTE for n in blocks if routed(n)})
        if masked_cast in ("pit", "pit_all"):
            # each shape's dense-routed (or all) kernels and their stacked block masks, one call each
            cast_by_shape = {}
            for shape, (names, live) in by_shape.items():
                sel = [i for i, n in enumerate(names) if masked_cast == "pit_all" or routed(n)]
                if sel:
                    cast_by_shape[shape] = ([names[i] for i in sel],
                                             live if len(sel) == len(names) else live[jnp.asarray(sel)])
            masked = lambda q: pruning.masked_kernels(q, cast_by_shape, tile, cfg.dtype)  # noqa: E731
        else:
            ms = pruning.element_masks({n: b for n, b in blocks.items() if routed(n)}, tile, shapes)
            masked = lambda q: pruning.apply_masks(q, ms)  # noqa: E731
        loss, g = jax.value_and_grad(lambda q: bert.loss_fn(pit, masked(q), t, ln, y, wi))(p)
        return finish(p, s, loss, g, pruning.live_fraction(by_shape, tile))

    def masked_step(p, s, t, ln, y, density):
        # The live fraction from the block masks, as pit_step counts it. Summed over the
        # element masks it made this step ~1.1 ms slower (H100, 32x64 at 50 %: 12.03
        # against 10.89 ms), a cost of the bookkeeping, not of masked training.
        by_shape = pruning.live_blocks_by_shape(p, density, tile)
        ms = pruning.element_masks(pruning.unstack(by_shape), tile, pruning.kernel_shapes(p))
        loss, g = jax.value_and_grad(lambda q: bert.loss_fn(dense, pruning.apply_masks(q, ms), t, ln, y))(p)
        return finish(p, s, loss, g, pruning.live_fraction(by_shape, tile))

    def dense_step(p, s, t, ln, y, density):
        loss, g = jax.value_and_grad(lambda q: bert.loss_fn(dense, q, t, ln, y))(p)
        return finish(p, s, loss, g, jnp.float32(1.0))

    def dense_rownorm_step(p, s, t, ln, y, density):
        # Unpruned, every linear dense, the layer norms by pit_jax's row kernels: what those
        # kernels alone give, the baseline that isolates the pruning in a row_norms pit step.
        wi = {n: bert.DENSE_ROUTE for n in pruning.kernel_shapes(p)}
        loss, g = jax.value_and_grad(lambda q: bert.loss_fn(rownorm, q, t, ln, y, wi))(p)
        return finish(p, s, loss, g, jnp.float32(1.0))

    return {"pit": pit_step, "dense_masked": masked_step, "dense": dense_step,
            "dense_rownorm": dense_rownorm_step}, pit, dense


def scored_in_update(routes):
    """The linears whose next block scores the pit step half-sums in the update
    (`pruning.ScoredState`): those on the W axis. A dense-routed linear's 12 kernels get
    their gradients from one kind of product at once, and XLA updates them in one
    kernel per shape; the sums split that into slower reduction kernels (H200, 50 %
    density, every linear dense: those kernels +0.09-0.10 ms, the step +0.05-0.07 ms
    net), so those are scored from the kernels."""
    return tuple(lin for lin in bert.LINEARS if routes.get(lin, "w") == "w")


def init_state(variant, params, opt_state, tile, routes=None):
    """The state `variant`'s step (`make_steps` with `routes`) takes first: for "pit"
    the optimizer's state with the partial block scores of the W-axis linears' kernels
    (`pruning.ScoredState`), else `opt_state` itself. Re-made when the routes change
    (`opt_state` may be a ScoredState then)."""
    if isinstance(opt_state, pruning.ScoredState):
        opt_state = opt_state.opt
    if variant != "pit":
        return opt_state
    return pruning.scored_state(params, opt_state, tile, scored_in_update(dict(routes or {})))


def plan_routes(params, density, tile, tokens, dtype, *, database=None, dense_margin=0.05):
    """{linear: "w" | "dense"}: the STile the optimizer (`pit_jax.plan`, the device's
    database) expects fastest for each linear, from layer 0's mask at this density as the
    sample. Called outside jit (it reads the mask on the host): re-plan when the density
    moves. A "w" linear runs both its forward and its dx on the W axis, so both are
    costed: the forward x @ (w o mask), and the dx dy @ (w o mask)^T as a W-axis product
    on w^T with the same tile (w^T's blocks are the transposed tile, so this coarser cover
    over-prices the dx: the route errs towards dense). "w" only when the two together are
    expected `dense_margin` faster than the two dense products; micro-tiles the database
    does not cost for the W axis go dense. The index is not costed (`include_index=False`):
    the step builds it from the block masks, once per kernel shape (`weight_indexes`), not
    from the weight's values on every call as the database's W-axis entries assume."""
    kernels = pruning.pruned_kernels(params)
    routes = {}
    for lin in bert.LINEARS:
        m = np.asarray(pruning.block_mask(kernels[f"layer_0/{lin}"], density, tile))
        sparse, dense = 0.0, 0.0
        for mask in (m, np.ascontiguousarray(m.T)):  # forward, dx
            plan = pit_jax.plan(mask, dtype=dtype, operand="w", x_shape=(tokens, mask.shape[0]), axes=("w",),
                                include_index=False, database=database, dense_margin=dense_margin)
            same = [c for c in plan.candidates if c.axis == "w" and tuple(c.micro_tile) == tuple(tile)]
            sparse += same[0].expected_ms if same else float("inf")
            dense += plan.dense_ms
        routes[lin] = "w" if sparse < (1 - dense_margin) * dense else "dense"
    return routes


def routed_pit_step(cache, cfg, tile, tx, routes, row_norms=False, tied_sums=False, masked_cast="pit_all"):
    """The jitted pit step for `routes` (`make_steps`), built once per distinct routes in `cache`."""
    key = (tuple(sorted(routes.items())), bool(row_norms), bool(tied_sums), masked_cast)
    if key not in cache:
        cache[key] = jax.jit(make_steps(cfg, tile, tx, routes=routes, row_norms=row_norms,
                                        tied_sums=tied_sums, masked_cast=masked_cast)[0]["pit"])
    return cache[key]


def check(cfg, tile, params, batch_data, density, pit, dense):
    """pit == dense on w * mask (outputs, gradients of all params); zero gradients outside
    the live blocks. Returns (output err, gradient err, max |gradient| outside live blocks)."""
    tokens, lengths, labels = batch_data
    blocks, shapes = pruning.live_blocks(params, density, tile), pruning.kernel_shapes(params)
    ms = pruning.element_masks(blocks, tile, shapes)
    wi = pruning.weight_indexes(blocks, tile, shapes)
    lp = jax.jit(lambda p: pit.apply(p, tokens, lengths, wi))(params)[0]
    ld = jax.jit(lambda p: dense.apply(pruning.apply_masks(p, ms), tokens, lengths))(params)[0]
    gp = jax.jit(jax.grad(lambda p: bert.loss_fn(pit, p, tokens, lengths, labels, wi)))(params)
    gd = jax.jit(jax.grad(lambda p: bert.loss_fn(dense, pruning.apply_masks(p, ms), tokens, lengths, labels)))(params)
    err_out = common.max_rel_err(lp, ld)
    err_grad = max(jax.tree_util.tree_leaves(jax.tree_util.tree_map(common.max_rel_err, gp, gd)))
    gk = pruning.pruned_kernels(gp)
    dead = max(float(jnp.max(jnp.where(m, 0.0, jnp.abs(gk[n].astype(jnp.float32))))) for n, m in ms.items())
    return err_out, err_grad, dead


def schedule(step, steps, start=0.5, end=0.02):
    """Cubic density schedule from `start` to `end` (gradual magnitude pruning)."""
    frac = min(1.0, step / max(1, steps - 1))
    return end + (start - end) * (1.0 - frac) ** 3


def main(argv=None):
    args = parse(argv)
    tile = pruning.parse_tile(args.tile)
    spec = args.densities or ("0.5,0.2,0.1,0.05,0.02" if args.full else "0.5,0.02")
    densities = [float(d) for d in spec.split(",") if d]
    if args.full:
        cfg = bert.BertConfig.base()
        batch, seq, lr, steps = args.batch or 32, args.seq or 128, 1e-4, 20
    else:
        cfg = bert.BertConfig.tiny()
        batch, seq, lr, steps = args.batch or 8, args.seq or 32, 2e-3, 20
    if args.layers:
        cfg = bert.BertConfig(**{**cfg.__dict__, "layers": args.layers})
    steps = args.steps if args.steps is not None else steps
    cfg = bert.BertConfig(**{**cfg.__dict__, "max_len": max(cfg.max_len, seq)})
    print(f"sparse training on {common.describe_device()}: BERT hidden {cfg.hidden}, ffn {cfg.ffn}, {cfg.layers} "
          f"layers, {jnp.dtype(cfg.dtype).name}, batch {batch} x {seq}, blocks {tile[0]}x{tile[1]}, "
          f"densities {densities}")
    rng = np.random.default_rng(args.seed)
    sample = lambda: bert.synthetic_batch(rng, cfg, batch, seq, np.full((batch,), seq, np.int32))
    data = sample()
    tx = optax.adamw(lr)
    steps_fns, pit, dense = make_steps(cfg, tile, tx, row_norms=args.row_norms, tied_sums=args.tied_sums)
    params = dense.init(jax.random.PRNGKey(args.seed), data[0], data[1])
    opt_state = tx.init(params)
    n_timed = 0 if args.no_timing else 1 + 2 * len(densities)
    bar = common.Progress(1 + n_timed + steps, "sparse_training")

    err_out, err_grad, dead = check(cfg, tile, params, data, densities[-1], pit, dense)
    tol = common.tolerance(cfg.dtype)
    ok = err_out <= tol and dead == 0.0 and (err_grad <= tol or cfg.dtype != jnp.float32)
    bar.step(f"check at density {densities[-1]:g}: outputs {err_out:.2e}, gradients {err_grad:.2e}, "
             f"max |grad| outside live blocks {dead:g}")
    result = dict(err_out=err_out, err_grad=err_grad, dead_grad=dead, ok=ok, tile=tile)

    # The pit step per set of routes (the optimizer's STile per linear at a density),
    # jitted once each.
    pit_steps = {}

    def pit_step_for(density, p):
        routes = plan_routes(p, density, tile, batch * seq, cfg.dtype)
        return routed_pit_step(pit_steps, cfg, tile, tx, routes, args.row_norms, args.tied_sums), routes

    times, plans = {}, {}
    if not args.no_timing:
        def timed(name, density):
            try:
                fn, routes = steps_fns[name], None
                if name == "pit":
                    fn, routes = pit_step_for(density, params)
                    plans[density] = routes
                state = init_state(name, params, opt_state, tile, routes)
                return common.train_step_ms(fn, (params, state, *data, jnp.float32(density)))["median_ms"]
            except Exception as e:  # noqa: BLE001 - a failing variant must not stop the others
                print(f"  {name} at density {density:g} failed: {type(e).__name__}: {e}", file=sys.stderr)
                return None

        times["dense"] = timed("dense", 1.0)
        bar.step("step dense")
        for d in densities:
            for name in ("pit", "dense_masked"):
                times[f"{name}@{d:g}"] = timed(name, d)
                bar.step(f"step {name} at density {d:g}")
    result.update(ms=times, routes=plans)

    losses, lives = [], []
    p, s = params, opt_state
    planned_at = None
    for i in range(steps):
        density = schedule(i, steps, 0.5, densities[-1])
        if planned_at is None or abs(density - planned_at) > 0.1 * planned_at:  # re-plan as the density moves
            step, routes = pit_step_for(density, p)
            s = init_state("pit", p, s, tile, routes)
            planned_at = density
        p, s, loss, live = step(p, s, *data, jnp.float32(density))
        losses.append(float(loss))
        lives.append(float(live))
        bar.step(f"loss {losses[-1]:.4f}, live weights {lives[-1]:.1%}")
        data = sample()
    result.update(losses=losses, live=lives)

    print(f"PIT vs dense on w * mask: outputs {err_out:.2e}, gradients {err_grad:.2e}; gradient outside live "
          f"blocks {dead:g} -> {'OK' if ok else 'MISMATCH'}")
    if times:
        print("fine-tuning step (mask recomputed, adamw):")
        for d in densities:
            row = {"dense": times["dense"], "dense_masked": times[f"dense_masked@{d:g}"], "pit": times[f"pit@{d:g}"]}
            common.print_speeds(f" density {d:g}:", row, "dense", "dense_masked")
            if d in plans:
                print(f"   pit's STile per linear (pit_jax.plan): {plans[d]}")
    if losses:
        print(f"loss ({common.loss_trend(losses)}), live weights {lives[0]:.1%} -> {lives[-1]:.1%}")
    return result


if __name__ == "__main__":
    r = main()
    if not r["ok"]:
        raise SystemExit("PIT and dense outputs disagree")
