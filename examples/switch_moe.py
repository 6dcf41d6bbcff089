"""A Switch-style MoE encoder with pit_jax (PIT Fig. 8): dropless experts at the cost of
the routed tokens only.

Compares, in one run, on the same parameters and batch:
  pit     pit_jax.flax.MoE: routing index on the device, gathered grouped products
  ragged  sort by expert + jax.lax.ragged_dot + unsort (the best plain-JAX dropless MoE)
  dense   every expert on every token, gates folded in (the dense twin: E x the FLOPs)
checks that pit's outputs and gradients match dense, times inference and a training step
(adamw, jitted) of each, then trains a few steps with pit. Synthetic data: random tokens
and labels, every token valid (the sparsity is in the routing).

    python examples/switch_moe.py                       # tiny model on the CPU, seconds
    python examples/switch_moe.py --full                # 768/12/3072, 4 layers, batch 32 x 128 (GPU)
    python examples/switch_moe.py --full --experts 128 --top-k 2
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # pit_jax when not installed

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pit_models import common, switch


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="hidden 768, 12 heads, FFN 3072, 4 layers, bf16, 32 x 128")
    ap.add_argument("--experts", type=int, default=None, help="default 64 (--full) / 8")
    ap.add_argument("--top-k", type=int, default=1)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--moe-every", type=int, default=2, help="an MoE FFN in every n-th layer (Switch: 2)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="training steps after the checks")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def setup(args):
    kw = dict(top_k=args.top_k, moe_every=args.moe_every)
    if args.layers:
        kw["layers"] = args.layers
    if args.full:
        cfg = switch.SwitchConfig.base(experts=args.experts or 64, **kw)
        batch, seq, lr, steps = args.batch or 32, args.seq or 128, 1e-4, 10
    else:
        cfg = switch.SwitchConfig.tiny(experts=args.experts or 8, **kw)
        batch, seq, lr, steps = args.batch or 8, args.seq or 16, 3e-3, 20
    return cfg, batch, seq, lr, args.steps if args.steps is not None else steps


def train_step(model, tx):
    def step(p, s, t, y):
        loss, g = jax.value_and_grad(functools.partial(switch.loss_fn, model))(p, t, y)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    return step


def main(argv=None):
    args = parse(argv)
    cfg, batch, seq, lr, steps = setup(args)
    rng = np.random.default_rng(args.seed)
    n_moe = sum(cfg.is_moe(i) for i in range(cfg.layers))
    print(f"Switch MoE encoder on {common.describe_device()}: hidden {cfg.hidden}, heads {cfg.heads}, "
          f"{cfg.layers} layers ({n_moe} MoE), {cfg.experts} experts x FFN {cfg.ffn}, top-{cfg.top_k}, "
          f"{jnp.dtype(cfg.dtype).name}, {batch} x {seq} tokens")
    tokens, labels = switch.synthetic_batch(rng, cfg, batch, seq)
    models = {m: switch.SwitchClassifier(cfg, m) for m in ("pit", "ragged", "dense")}
    params = models["pit"].init(jax.random.PRNGKey(args.seed), tokens)
    tx = optax.adamw(lr)
    n_timed = 0 if args.no_timing else 2 * len(models)
    bar = common.Progress(3 + n_timed + steps, "switch_moe")
    result = {"config": cfg.__dict__ | {"dtype": jnp.dtype(cfg.dtype).name}}

    # 1. outputs, 2. gradients of every parameter: pit == dense (== ragged).
    tol = common.tolerance(cfg.dtype)
    out = {n: jax.jit(models[n].apply)(params, tokens) for n in ("pit", "dense")}
    agree = switch.token_agreement(out["pit"][1], out["dense"][1], tol)
    err_out = agree["max_rel_err"]
    bar.step(f"outputs: hidden err {err_out:.2e}, {agree['tokens_over_tol']:.1%} of tokens over {tol:g}")
    grads = {n: jax.jit(jax.grad(functools.partial(switch.loss_fn, models[n])))(params, tokens, labels)
             for n in ("pit", "dense")}
    errs = jax.tree_util.tree_map(common.max_rel_err, grads["pit"], grads["dense"])
    err_grad = max(jax.tree_util.tree_leaves(errs))
    bar.step(f"gradients of {len(jax.tree_util.tree_leaves(errs))} params: worst err {err_grad:.2e}")
    # float32: every token and gradient within tolerance. bf16/f16: a near-tied router score
    # may send a few tokens elsewhere (switch.MAX_REROUTED), and their gradients with them.
    exact = cfg.dtype == jnp.float32
    ok = (err_out <= tol and err_grad <= tol) if exact else agree["ok"]
    result.update(err_out=err_out, err_grad=err_grad, tokens_over_tol=agree["tokens_over_tol"], ok=ok)
    bar.step("agreement " + ("OK" if result["ok"] else f"MISMATCH (tolerance {tol:g})"))

    # 3. latency of inference and of one training step (as a training loop: state donated
    # and chained), all variants, same run.
    opt_state = tx.init(params)
    infer, train = {}, {}
    if not args.no_timing:
        for name, model in models.items():
            for what, times, timer, fn, fargs in (
                ("inference", infer, common.latency_ms, lambda p, t, m=model: m.apply(p, t), (params, tokens)),
                ("training step", train, common.train_step_ms, train_step(model, tx), (params, opt_state, tokens, labels)),
            ):
                try:
                    times[name] = timer(fn, fargs)["median_ms"]
                except Exception as e:  # noqa: BLE001 - a failing variant must not stop the others
                    times[name] = None
                    print(f"  {name} {what} failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                bar.step(f"{what} {name}")
    result.update(infer_ms=infer, train_ms=train)

    # 4. train with pit (on the one batch: the loss must go down).
    step = jax.jit(train_step(models["pit"], tx))
    losses, p, s = [], params, opt_state
    for _ in range(steps):
        p, s, loss = step(p, s, tokens, labels)
        losses.append(float(loss))
        bar.step(f"loss {losses[-1]:.4f}")
    result["losses"] = losses

    print(f"PIT vs dense: hidden {err_out:.2e} ({agree['tokens_over_tol']:.1%} of tokens over {tol:g}), "
          f"gradients {err_grad:.2e} -> {'OK' if result['ok'] else 'MISMATCH'}")
    if infer:
        common.print_speeds(f"inference ({cfg.experts} experts, top-{cfg.top_k}):", infer, "dense", "ragged")
        common.print_speeds("training step (adamw):", train, "dense", "ragged")
    if losses:
        print(f"training loss on one batch ({common.loss_trend(losses)}) over {steps} steps")
    return result


if __name__ == "__main__":
    r = main()
    if not r["ok"]:
        raise SystemExit("PIT and dense outputs disagree")
