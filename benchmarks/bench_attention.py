"""Attention over padded sequences: pit_jax.varlen_attention against what a JAX user
has (issue 7's BERT and OPT shapes).

Cases: BERT-base heads (12 x 64, bf16) at batch 32, max length 128, GLUE-like lengths
(~27 % valid tokens), and the same batch at full length; OPT-1.3B's decoder heads (32 x
64) on the same lengths left-padded, causal ("decoder"), and OPT-6.7B's (32 x 128,
"decoder_hd128"); and BERT-base heads on 8 long documents (max 2048, ~31 % valid:
"document"; "document_causal" the same causal over left padding), the kernels' 128-token
blocks with an online softmax; and grouped-query attention on the same documents, causal
over right padding, at a Llama-like 32 query heads sharing 8 kv heads of 128
("document_gqa"), and those heads on the GLUE-like lengths causal over left padding
("decoder_gqa"), and the documents' grouped heads in a sliding window of 256 keys
("document_window", local_window_size (256, 0): Mistral-style local attention; and
"document_window_left", the same window causal over left padding); and the documents packed
one after another into one row of their total tokens ("document_packed", bidirectional,
each attending to its own tokens: flash-attention's varlen layout, [1, T, H, D]). Per case,
forward alone and forward + backward (a vjp with a fixed cotangent), each through:
  pit_jax     pit_jax.varlen_attention (valid tokens only)
  pit_jax_repeat  (grouped cases) k and v repeated to q's heads, then pit_jax.varlen_attention:
              the route before the kernels read the shared heads in place
              (packed: pit_jax.packed_attention with the rows' cu_seqlens and max_seqlen)
  cudnn       jax.nn.dot_product_attention(implementation="cudnn") with sequence lengths
              (decoder: is_causal and the left padding as an additive bias, since cuDNN
              takes padding as right-padded lengths only; grouped k, v as given; packed:
              jax's cuDNN wrapper with segment offsets, jax._src.cudnn.fused_attention_stablehlo,
              the one packed-sequence attention jax has, private API; one row, since with
              several rows its results on the rows after the first were wrong on the H200,
              jax 0.11.2)
  xla         jax.nn.dot_product_attention(implementation="xla") with sequence lengths
              (decoder: is_causal and the padding mask; packed: the segments' block-diagonal mask)
Inputs rotated so nothing sits in L2; wall time of jitted calls (median of repeats) and
the device time of their kernels from a profiler trace.

    python -m benchmarks.bench_attention [--out DIR] [--small] [--cases glue document ...] [--impls pit_jax ...]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import pit_jax
from benchmarks import common
from pit_jax.reference import packed_tokens

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from pit_models import common as mcommon  # noqa: E402


def packed_row(lengths):
    """cu_seqlens [1, n + 1] of the sequences one after another in one row."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)[None]


def packed_impls(max_seqlen):
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa

    def pit(q, k, v, cu):
        return pit_jax.packed_attention(q, k, v, cu, max_seqlen=max_seqlen)

    def cudnn(q, k, v, cu):
        # cuDNN's offsets / lengths mark a row's unused segments with -1
        used = jnp.concatenate([jnp.ones_like(cu[:, :1], bool), cu[:, 1:] > cu[:, :-1]], axis=1)
        offsets = jnp.where(used, cu, -1)
        seqlen = jnp.where(used[:, 1:], cu[:, 1:] - cu[:, :-1], -1)
        return cudnn_fa.dot_product_attention(q, k, v, q_seqlen=seqlen, kv_seqlen=seqlen, q_offsets=offsets,
                                              kv_offsets=offsets, scale=1.0 / np.sqrt(q.shape[-1]),
                                              mask_type=cudnn_fa.MaskType.PADDING)

    def xla(q, k, v, cu):
        valid, seg, _ = packed_tokens(cu, q.shape[1], max_seqlen)
        mask = (seg[:, None, :, None] == seg[:, None, None, :]) & valid[:, None, :, None] & valid[:, None, None, :]
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
        return jnp.where(valid[:, :, None, None], out, 0).astype(out.dtype)

    return {"pit_jax": pit, "cudnn": cudnn, "xla": xla}


def impls(mode="encoder", grouped=False, window=None):
    """mode: "encoder" (bidirectional, right padding), "decoder" (causal over left padding,
    as examples/pit_models/opt.py attends) or "causal" (causal over right padding); window:
    a local window (left, right)."""
    if mode == "decoder":
        def dpa(implementation):
            def f(q, k, v, ln):
                return mcommon.attention(q, k, v, lengths=ln, causal=True, padding="left",
                                         implementation=implementation, local_window_size=window)
            return f

        pit = functools.partial(pit_jax.varlen_attention, causal=True, padding="left", local_window_size=window)
    else:
        def dpa(implementation):
            def f(q, k, v, ln):
                return jax.nn.dot_product_attention(q, k, v, query_seq_lengths=ln, key_value_seq_lengths=ln,
                                                    is_causal=mode == "causal", local_window_size=window,
                                                    implementation=implementation)
            return f

        pit = functools.partial(pit_jax.varlen_attention, causal=mode == "causal", local_window_size=window)
    out = {"pit_jax": pit}
    if grouped:
        def pit_repeat(q, k, v, ln):
            group = q.shape[2] // k.shape[2]
            return pit(q, jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2), ln)

        out["pit_jax_repeat"] = pit_repeat
    return {**out, "cudnn": dpa("cudnn"), "xla": dpa("xla")}


def with_backward(f):
    def g(q, k, v, ln, dout):
        out, vjp = jax.vjp(lambda q, k, v: f(q, k, v, ln), q, k, v)
        return out, vjp(dout)

    return g


def main(argv=None):
    ap = argparse.ArgumentParser()
    common.add_out_argument(ap)
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke run)")
    ap.add_argument("--cases", nargs="+", help="only these cases (default: all)")
    ap.add_argument("--impls", nargs="+", help="only these implementations (default: all)")
    args = ap.parse_args(argv)
    meta = common.device_info()
    b, s, h, d = (4, 32, 2, 64) if args.small else (32, 128, 12, 64)
    h_dec = 4 if args.small else 32  # OPT-1.3B: 32 heads of 64
    b_doc, s_doc = (2, 160) if args.small else (8, 2048)
    h_gqa, kv_gqa = (4, 2) if args.small else (32, 8)  # Llama-like grouped-query heads of 128
    rng = np.random.default_rng(0)
    glue = mcommon.sample_lengths(rng, b, **{**mcommon.GLUE, "max_len": s})
    docs = mcommon.sample_lengths(rng, b_doc, **{**mcommon.LONG_DOC, "max_len": s_doc})
    window = (16, 0) if args.small else (256, 0)  # sliding-window decoders' local attention
    # case -> (lengths, seq, heads, head_dim, mode, kv_heads[, window])
    cases = {"glue": (glue, s, h, d, "encoder", h), "full": (np.full((b,), s, np.int32), s, h, d, "encoder", h),
             "decoder": (glue, s, h_dec, d, "decoder", h_dec), "decoder_hd128": (glue, s, h_dec, 128, "decoder", h_dec),
             "document": (docs, s_doc, h, d, "encoder", h), "document_causal": (docs, s_doc, h, d, "decoder", h),
             "document_gqa": (docs, s_doc, h_gqa, 128, "causal", kv_gqa),
             "decoder_gqa": (glue, s, h_gqa, 128, "decoder", kv_gqa),
             "document_window": (docs, s_doc, h_gqa, 128, "causal", kv_gqa, window),
             "document_window_left": (docs, s_doc, h_gqa, 128, "decoder", kv_gqa, window),
             "document_packed": (packed_row(docs), int(docs.sum()), h, d, "packed", h)}
    n_sets = common.rotations(5 * max(b * s * h_dec * 128, b_doc * s_doc * h_gqa * 128) * 2)
    # the CPU smoke run: few repeats and rotations, no profiler trace
    n_sets, reps, device_calls = (2, 3, 0) if args.small else (n_sets, 15, 20)
    key = jax.random.PRNGKey(0)
    rows = []
    cases = {c: v for c, v in cases.items() if not args.cases or c in args.cases}
    for case, (lengths, s, h, d, mode, kv_heads, *win) in cases.items():
        b = len(lengths)
        ln = jnp.asarray(lengths, jnp.int32)  # packed: the rows' cu_seqlens
        if mode == "packed":
            mask = np.asarray(packed_tokens(ln, s, s)[0])
        else:
            mask = np.asarray((mcommon.left_padding_mask if mode == "decoder" else mcommon.right_padding_mask)(lengths, s))
        sets = []
        for i in range(n_sets):
            ks = jax.random.split(jax.random.fold_in(key, i), 4)
            q, k, v, dout = (common.random_normal(kk, (b, s, h if j in (0, 3) else kv_heads, d), jnp.bfloat16)
                             for j, kk in enumerate(ks))
            # no cotangent on padding rows: the baselines' padding queries attend (to
            # anything), and their gradients would reach the valid keys
            dout = jnp.where(jnp.asarray(mask)[:, :, None, None], dout, 0).astype(dout.dtype)
            sets.append((q, k, v, ln, dout))
        valid = float(mask.sum()) / (b * s)
        ref = None
        fs = (packed_impls(int(np.diff(lengths, axis=1).max())) if mode == "packed"
              else impls(mode, grouped=kv_heads != h, window=win[0] if win else None))
        for name, f in fs.items():
            if args.impls and name not in args.impls:
                continue
            for pass_, fn in (("forward", lambda q, k, v, ln, do, f=f: f(q, k, v, ln)),
                              ("forward+backward", lambda *a, f=f: with_backward(f)(*a))):
                row = {"case": case, "valid": valid, "pass": pass_, "impl": name, "shape": [b, s, h, d],
                       "kv_heads": kv_heads, "window": win[0] if win else None, "dtype": "bfloat16"}
                try:
                    t = common.time_op(fn, sets, keep_output=True, reps=reps, device_calls=device_calls)
                except Exception as e:  # noqa: BLE001 - an impl that does not run here is a row, not a crash
                    rows.append({**row, "median_ms": None, "error": f"{type(e).__name__}: {str(e)[:200]}"})
                    continue
                out = jax.tree_util.tree_leaves(t.pop("output"))
                vals = [np.asarray(o, np.float32)[mask] for o in out]
                if pass_ == "forward+backward" and name == "pit_jax":
                    ref = vals
                elif pass_ == "forward+backward" and ref is not None:
                    row["max_rel_diff_vs_pit"] = max(float(np.abs(a - r).max() / max(np.abs(r).max(), 1e-30))
                                                     for a, r in zip(vals, ref))
                rows.append({**row, **t})
    base = {(r["case"], r["pass"]): r.get("median_ms") for r in rows if r["impl"] == "pit_jax"}
    for r in rows:
        p = base.get((r["case"], r["pass"]))
        if r.get("median_ms") and p:
            r["pit_speedup"] = r["median_ms"] / p
    print(common.table(rows, ["case", "valid", "pass", "impl", "median_ms", "device_ms", "kernels_per_op",
                              "pit_speedup"]))
    path = common.write_results("attention", {"meta": meta, "config": {"rotations": n_sets}, "results": rows},
                                args.out)
    print("wrote", path)
    return rows


if __name__ == "__main__":
    main()
