"""An OPT decoder layer whose fc2 skips dead ReLU activations, detected online (PIT Fig. 9).

fc2 reads the ReLU output of fc1 through a K-axis index of 32x1 micro-tiles built from
it inside the jit: for each block of 32 tokens, only the neurons that fired for one of
them. The other linears skip the left padding on the M axis. Compares, in one run:
  pit     M axis for qkv/out_proj/fc1, K axis for fc2
  pit_m   M axis everywhere (what the K axis adds over skipping padding alone)
  dense   nn.Dense everywhere (the JAX model)
Synthetic: random hidden states, left-padded GLUE-like lengths, and fc1 biases set so
the ReLU output has about `--tile-density` live 32x1 micro-tiles with neurons skewed like
a trained OPT's (random weights alone leave half the activations live; a trained OPT's
fire far more rarely); the target holds for blocks of 32 valid tokens, and blocks of
padding are dead on top of it. The measured densities are printed.

    python examples/opt_activation.py                  # tiny, CPU
    python examples/opt_activation.py --full           # d = 2048, batch 32 x 128 (GPU)
    python examples/opt_activation.py --full --d 5120 --tile-density 0.05
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # pit_jax when not installed

import jax
import jax.numpy as jnp
import numpy as np

from pit_models import common, opt


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="OPT sizes, bf16, batch 32 x max length 128")
    ap.add_argument("--d", type=int, default=None, help="model width (2048, 2560, 4096, 5120 with --full)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--tile-density", type=float, default=0.1, help="target live 32x1 tiles of the fc2 input")
    ap.add_argument("--no-padding", action="store_true", help="every sequence full length (activation sparsity alone)")
    ap.add_argument("--attention", default="auto", choices=common.ATTENTION_IMPLS)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def build(cfg, batch, seq, tile_density, seed, attention="auto", padding=True):
    """(models, params, x, lengths, attention) for one run: left-padded GLUE-like lengths
    scaled to seq (or every sequence full with padding=False)."""
    rng = np.random.default_rng(seed)
    g = common.GLUE
    lengths = common.sample_lengths(rng, batch, max_len=seq, mean=g["mean"] * seq / g["max_len"],
                                    sigma=g["sigma"], min_len=1)
    lengths = jnp.asarray(lengths if padding else np.full((batch,), seq, np.int32))
    x = jax.random.normal(jax.random.PRNGKey(seed), (batch, seq, cfg.d), jnp.float32).astype(cfg.dtype)
    x = jnp.where(common.left_padding_mask(lengths, seq)[..., None], x, 0).astype(cfg.dtype)
    attn = common.resolve_attention(attention, batch, seq, cfg.heads, cfg.head_dim, cfg.dtype,
                                    causal=True, key_mask=True)
    models = {m: opt.OPTDecoderLayer(cfg, m, attn) for m in ("pit", "pit_m", "dense")}
    params = models["dense"].init(jax.random.PRNGKey(seed + 1), x, lengths)
    params = opt.relu_like_opt(params, jax.random.PRNGKey(seed + 2), cfg, tile_density)
    return models, params, x, lengths, attn


def main(argv=None):
    args = parse(argv)
    if args.full:
        cfg = opt.OPTConfig.of(args.d or 2048)
        batch, seq = args.batch or 32, args.max_len or 128
    else:
        cfg = opt.OPTConfig.tiny(**({"d": args.d, "heads": max(1, args.d // 16)} if args.d else {}))
        batch, seq = args.batch or 4, args.max_len or 64
    print(f"OPT layer on {common.describe_device()}: d {cfg.d}, heads {cfg.heads}, ffn {cfg.ffn}, "
          f"{jnp.dtype(cfg.dtype).name}, batch {batch} x max {seq} (left padding)")
    models, params, x, lengths, attn = build(cfg, batch, seq, args.tile_density, args.seed, args.attention,
                                                 padding=not args.no_padding)
    bar = common.Progress(2 + (0 if args.no_timing else len(models)), "opt_activation")

    outs = {m: jax.jit(models[m].apply)(params, x, lengths) for m in ("pit", "dense")}
    valid = np.asarray(common.left_padding_mask(lengths, seq)).reshape(-1)
    err = common.max_rel_err(outs["pit"][0], outs["dense"][0], valid)
    h = np.asarray(outs["dense"][1], np.float32)
    # the pit modes' attention: the kernels where they take the heads (opt.OPTDecoderLayer)
    pit_attn = "pit_jax.varlen_attention" if common.varlen_kernels_apply(batch, seq, cfg, causal=True) else attn
    result = dict(
        err=err, ok=err <= common.tolerance(cfg.dtype), attention=attn, pit_attention=pit_attn,
        valid_tokens=float(valid.mean()), tile_density=opt.tile_density(h), element_density=float((h != 0).mean()),
    )
    bar.step(f"outputs: err {err:.2e} on valid tokens")
    bar.step(f"fc2 input: {result['tile_density']:.1%} live 32x1 tiles, {result['element_density']:.2%} non-zeros")
    times = {}
    if not args.no_timing:
        for name, model in models.items():
            try:
                times[name] = common.latency_ms(lambda p, x, ln, m=model: m.apply(p, x, ln)[0], (params, x, lengths))["median_ms"]
            except Exception as e:  # noqa: BLE001 - a failing variant must not stop the others
                times[name] = None
                print(f"  {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            bar.step(f"inference {name}")
    result["ms"] = times
    print(f"valid tokens {result['valid_tokens']:.1%}; attention: {attn} (dense), {pit_attn} (pit); fc2 input: "
          f"{result['tile_density']:.1%} live 32x1 tiles ({result['element_density']:.2%} non-zeros)")
    print(f"PIT vs dense on valid tokens: err {err:.2e} -> {'OK' if result['ok'] else 'MISMATCH'}")
    if times:
        common.print_speeds("inference of one decoder layer:", times, "dense", "pit_m")
    return result


if __name__ == "__main__":
    r = main()
    if not r["ok"]:
        raise SystemExit("PIT and dense outputs disagree")
