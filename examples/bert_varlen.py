"""BERT on variable-length batches with pit_jax (PIT Fig. 10, 13): padding costs nothing.

Every linear skips the padding rows through the M axis, with ONE row index of the valid
tokens built per batch from the padding mask; attention runs on the valid tokens only
(`pit_jax.varlen_attention` where its kernels take the shapes: 16-bit, head_dim 64, 80,
96 or 128; past max length 128 cuDNN with sequence lengths where it works, its backward
being the faster there; else XLA with the mask).
Compares, in one run, on the same parameters and batch:
  pit         SparseDense (M axis) + attention on the valid tokens; the padding rows
              are left unwritten (dead_rows="unspecified": nothing reads them, and
              the gradients are those of zeros there)
  dense       nn.Dense + XLA attention with the padding mask (the padded JAX model)
  dense_cudnn nn.Dense + the same attention as pit (the best plain-JAX alternative)
checks that pit's outputs (valid tokens) and gradients match dense, times inference
and a fine-tuning step (adamw, jitted) of each, then fine-tunes a few steps with pit.
Synthetic data: random tokens, lengths ~ a clipped log-normal like GLUE's (mean ~40 of
128) or, with --long, long documents (mean ~600 of 2048).

    python examples/bert_varlen.py            # tiny model, runs on the CPU in seconds
    python examples/bert_varlen.py --full     # BERT-base, batch 32, max length 128 (GPU)
    python examples/bert_varlen.py --full --long
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

from pit_models import bert, common


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="BERT-base (768/12/3072, 12 layers), bf16, batch 32")
    ap.add_argument("--long", action="store_true", help="long documents: max length 2048 (batch 8 with --full)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="fine-tuning steps after the checks")
    ap.add_argument("--attention", default="auto", choices=common.ATTENTION_IMPLS)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def setup(args):
    dist = dict(common.LONG_DOC if args.long else common.GLUE)
    if args.full:
        cfg = bert.BertConfig.base(max_len=max(512, dist["max_len"]))
        batch = args.batch or (8 if args.long else 32)
        lr, steps = 1e-4, 20
    else:
        cfg = bert.BertConfig.tiny(max_len=max(64, dist["max_len"] // 2 if args.long else 64))
        batch = args.batch or 8
        lr, steps = 2e-3, 30
        scale = (256 if args.long else 64) / dist["max_len"]
        dist = dict(max_len=int(dist["max_len"] * scale), mean=dist["mean"] * scale, sigma=dist["sigma"],
                    min_len=max(2, int(dist["min_len"] * scale)))
    if args.max_len:
        dist["mean"] *= args.max_len / dist["max_len"]
        dist["max_len"] = args.max_len
    if args.layers:
        cfg = bert.BertConfig(**{**cfg.__dict__, "layers": args.layers})
    cfg = bert.BertConfig(**{**cfg.__dict__, "max_len": max(cfg.max_len, dist["max_len"])})
    return cfg, batch, dist, lr, args.steps if args.steps is not None else steps


def main(argv=None):
    args = parse(argv)
    cfg, batch, dist, lr, steps = setup(args)
    seq = dist["max_len"]
    rng = np.random.default_rng(args.seed)
    print(f"BERT varlen on {common.describe_device()}: hidden {cfg.hidden}, heads {cfg.heads}, ffn {cfg.ffn}, "
          f"{cfg.layers} layers, {jnp.dtype(cfg.dtype).name}, batch {batch} x max {seq}")

    def sample():
        return bert.synthetic_batch(rng, cfg, batch, seq, common.sample_lengths(rng, batch, **dist))

    tokens, lengths, labels = sample()
    density = float(np.asarray(lengths).sum()) / (batch * seq)
    attn = common.resolve_attention(args.attention, batch, seq, cfg.heads, cfg.head_dim, cfg.dtype)
    kernels = {mode: common.varlen_kernels_apply(batch, seq, cfg, attn, train=mode == "train")
               for mode in ("infer", "train")}
    pit_attn = {mode: "pit_jax.varlen_attention" if k else attn for mode, k in kernels.items()}
    print(f"valid tokens {density:.1%} (mean length {float(np.mean(lengths)):.1f}); attention: pit "
          f"{pit_attn['infer']} (inference) / {pit_attn['train']} (training), dense_cudnn {attn}")
    models = {
        # The padding rows are left unwritten after the attention (nothing reads them, in
        # the forward or the backward: the gradients are those of dead_rows="zeros").
        "pit": bert.BertClassifier(cfg, "pit", attn, dead_rows="unspecified"),
        "dense": bert.BertClassifier(cfg, "dense", "xla"),
        "dense_cudnn": bert.BertClassifier(cfg, "dense", attn),
    }
    params = models["dense"].init(jax.random.PRNGKey(args.seed), tokens, lengths)
    tx = optax.adamw(lr)

    def train_step(model):
        def step(p, s, t, ln, y):
            loss, g = jax.value_and_grad(functools.partial(bert.loss_fn, model))(p, t, ln, y)
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s, loss

        return step

    n_timed = 0 if args.no_timing else 2 * len(models)
    bar = common.Progress(3 + n_timed + steps, "bert_varlen")
    result = {"density": density, "attention": {"pit": pit_attn, "dense_cudnn": attn},
              "config": cfg.__dict__ | {"dtype": jnp.dtype(cfg.dtype).name}}

    # 1. outputs on valid tokens, 2. gradients of every parameter: pit == dense.
    valid = np.asarray(common.right_padding_mask(lengths, seq)).reshape(-1)
    out = {n: jax.jit(functools.partial(models[n].apply, train=False))(params, tokens, lengths)
           for n in ("pit", "dense")}
    err_logits = common.max_rel_err(out["pit"][0], out["dense"][0])
    err_hidden = common.max_rel_err(out["pit"][1], out["dense"][1], valid)
    bar.step(f"outputs: logits err {err_logits:.2e}, hidden (valid rows) err {err_hidden:.2e}")
    grads = {n: jax.jit(jax.grad(functools.partial(bert.loss_fn, models[n])))(params, tokens, lengths, labels)
             for n in ("pit", "dense")}
    errs = jax.tree_util.tree_map(common.max_rel_err, grads["pit"], grads["dense"])
    err_grad = max(jax.tree_util.tree_leaves(errs))
    bar.step(f"gradients of {len(jax.tree_util.tree_leaves(errs))} params: worst err {err_grad:.2e}")
    tol = common.tolerance(cfg.dtype)
    result.update(err_logits=err_logits, err_hidden=err_hidden, err_grad=err_grad,
                  ok=max(err_logits, err_hidden) <= tol and (err_grad <= tol or cfg.dtype != jnp.float32))
    bar.step("agreement " + ("OK" if result["ok"] else f"MISMATCH (tolerance {tol:g})"))

    # 3. latency of inference and of one fine-tuning step, all variants, same run.
    opt_state = tx.init(params)
    infer, train = {}, {}
    if not args.no_timing:
        for name, model in models.items():
            try:
                infer[name] = common.latency_ms(lambda p, t, ln, m=model: m.apply(p, t, ln, train=False),
                                                (params, tokens, lengths))["median_ms"]
            except Exception as e:  # noqa: BLE001 - a failing variant must not stop the others
                infer[name] = None
                print(f"  {name} inference failed: {type(e).__name__}: {e}", file=sys.stderr)
            bar.step(f"inference {name}")
            try:
                train[name] = common.train_step_ms(train_step(models[name]),
                                                   (params, opt_state, tokens, lengths, labels))["median_ms"]
            except Exception as e:  # noqa: BLE001
                train[name] = None
                print(f"  {name} fine-tuning step failed: {type(e).__name__}: {e}", file=sys.stderr)
            bar.step(f"fine-tuning step {name}")
    result.update(infer_ms=infer, train_ms=train)

    # 4. fine-tune with pit on fresh batches.
    step = jax.jit(train_step(models["pit"]))
    losses = []
    p, s = params, opt_state
    for _ in range(steps):
        p, s, loss = step(p, s, tokens, lengths, labels)
        losses.append(float(loss))
        bar.step(f"loss {losses[-1]:.4f}")
        tokens, lengths, labels = sample()
    result["losses"] = losses

    print(f"PIT vs dense on valid tokens: logits {err_logits:.2e}, hidden {err_hidden:.2e}, gradients {err_grad:.2e} "
          f"-> {'OK' if result['ok'] else 'MISMATCH'}")
    if infer:
        common.print_speeds(f"inference ({density:.0%} valid tokens):", infer, "dense", "dense_cudnn")
        common.print_speeds("fine-tuning step (adamw):", train, "dense", "dense_cudnn")
    if losses:
        print(f"fine-tuning loss ({common.loss_trend(losses)}) over {steps} steps")
    return result


if __name__ == "__main__":
    r = main()
    if not r["ok"]:
        raise SystemExit("PIT and dense outputs disagree")
