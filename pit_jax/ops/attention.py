"""`pit_jax.varlen_attention`: multi-head attention over padded sequences, on their valid
tokens only.

    out = pit_jax.varlen_attention(q, k, v, lengths)   # q, k, v [B, S, H, D], lengths [B]
    out = pit_jax.varlen_attention(q, k, v, lengths)   # k, v [B, S, H_kv, D]: grouped-query
    out = pit_jax.varlen_attention(q, k, v, lengths, causal=True, padding="left")  # decoders

Sequence b's valid tokens are its first lengths[b] (`padding="right"`, the default) or its
last lengths[b] (`padding="left"`, as batched decoder prompts are laid out), the lengths
clamped to [0, S]. Each valid query attends over the valid keys (bidirectional), or over
those at or before its own position (`causal=True`). The padding rows of `out` are zeros
and get zero gradients.

Where the kernels apply (bfloat16 / float16, head_dim 64, 80, 96 or 128, S <= 65536)
padding costs nothing (causal attention skips the masked half too). Up to S = 128
(batches of short sequences, BERT's fine-tuning shapes, OPT's heads) one CTA per (head,
sequence) holds the whole sequence in shared memory (up to 171 KB: the CUDA lowering
refuses a sequence that does not fit the GPU's, e.g. head_dim 128's backward on an
A100): the softmax needs no running rescale and the backward no atomics. Longer
sequences (documents) run in blocks of 128 tokens that walk the valid keys (forward, dQ)
or queries (dK, dV) in chunks with a running softmax, in O(S) memory and still without
atomics. Elsewhere (other dtypes or head dims) the same function runs as a masked
softmax in XLA (`reference`, O(S^2) memory), as it does under `PIT_JAX_REFERENCE`.

Differentiable in both modes (the primitive's JVP is a linear primitive whose transpose is
the backward kernel, which recomputes the probabilities from the forward's log-sum-exp;
forward mode evaluates the tangent in jnp), vmap-able, inside jit.
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from pit_jax import config
from pit_jax import reference as _ref
from pit_jax.primitives import varlen_attention as _prim


PADDINGS = ("right", "left")


def reference(q, k, v, lengths, **params):
    """The same value in jnp, float32 math over every row, masked (`pit_jax.reference`)."""
    return _ref.varlen_attention(q, k, v, lengths, **params)[0]


def _window(local_window_size):
    """(left, right) from jax.nn.dot_product_attention's local_window_size (None, an int
    for both sides, or a pair), -1 for no bound."""
    if local_window_size is None:
        return -1, -1
    pair = (local_window_size,) * 2 if isinstance(local_window_size, (int, np.integer)) else local_window_size
    try:
        left, right = pair
    except (TypeError, ValueError):
        left = right = None
    if not all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) and w >= 0 for w in (left, right)):
        raise ValueError(f"varlen_attention: local_window_size must be None, an int >= 0 or a pair (left, right) "
                         f"of ints >= 0, got {local_window_size!r}")
    return int(left), int(right)


def _static_scale(fn: str, scale, head_dim: int) -> float:
    """The softmax scale as a Python float (a kernel attribute): 1 / sqrt(head_dim) for None."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    try:
        return float(scale)
    except (TypeError, ValueError, jax.errors.ConcretizationTypeError):
        raise TypeError(f"{fn}: scale must be None or a static number (a kernel attribute, not a traced "
                        f"value), got {scale!r}") from None


def varlen_attention(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array, *,
                     scale: Optional[float] = None, causal: bool = False, padding: str = "right",
                     local_window_size=None) -> jax.Array:
    """softmax(scale q k^T) v per sequence and head over its valid tokens; zeros on padding rows.

    q: [batch, seq, heads, head_dim]; k, v: q's shape, or [batch, seq, kv_heads, head_dim]
    with kv_heads dividing heads (grouped-query attention, as jax.nn.dot_product_attention
    groups: query head n reads kv head n // (heads // kv_heads); the kernels read the
    shared heads in place, no copy); one float dtype. lengths: [batch] integers,
    sequence b's valid tokens are its first lengths[b] (padding "right") or its last
    lengths[b] (padding "left"); causal: each query attends to the keys at or before its
    position only; local_window_size: (left, right), or an int w for (w, w): query i attends
    to the keys i - left .. i + right only (positions among the valid tokens; with causal,
    right is 0), as jax.nn.dot_product_attention's local_window_size (sliding-window
    attention: the kernels skip the key blocks outside every row's window); scale:
    default 1 / sqrt(head_dim).
    Returns [batch, seq, heads, head_dim] in q's dtype.
    """
    q, k, v, lengths = (jnp.asarray(a) for a in (q, k, v, lengths))
    _prim.check_qkv(q, k, v)
    if not jnp.issubdtype(q.dtype, jnp.floating):
        raise TypeError(f"varlen_attention: q must be a float array, got {q.dtype}")
    if tuple(lengths.shape) != (q.shape[0],) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"varlen_attention: lengths must be integers [batch] = [{q.shape[0]}], got "
                         f"{lengths.dtype} {tuple(lengths.shape)}")
    if padding not in PADDINGS:
        raise ValueError(f"varlen_attention: padding must be one of {PADDINGS}, got {padding!r}")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"varlen_attention: causal must be a Python bool, got {type(causal).__name__}")
    scale = _static_scale("varlen_attention", scale, q.shape[-1])
    lengths = lengths.astype(jnp.int32)
    window_left, window_right = _window(local_window_size)
    params = dict(scale=scale, causal=bool(causal), left_padded=padding == "left")
    if (window_left, window_right) != (-1, -1):  # the attrs without a window: as before
        params.update(window_left=window_left, window_right=window_right)
    if config.reference_enabled("varlen_attention") or not _prim.kernel_applies(q.shape, q.dtype):
        return reference(q, k, v, lengths, **params)
    return _prim.varlen_attention_p.bind(q, k, v, lengths, **params)[0]


def packed_attention(q: jax.Array, k: jax.Array, v: jax.Array, cu_seqlens: jax.Array, *,
                     max_seqlen: Optional[int] = None, scale: Optional[float] = None, causal: bool = False,
                     local_window_size=None) -> jax.Array:
    """Softmax attention of sequences packed one after another into rows, each sequence
    attending to its own tokens only; zeros on the tokens of no sequence.

    q: [batch, seq, heads, head_dim] (batch packed rows of seq tokens), or [tokens, heads,
    head_dim] (one row, as flash-attention's varlen API takes it); k, v: q's shape, or
    fewer heads dividing q's (grouped-query attention); one float dtype. cu_seqlens:
    integers [batch, n + 1] ([n + 1] with one row), nondecreasing: row b's sequence i is its
    tokens [cu_seqlens[b, i], cu_seqlens[b, i + 1]) (clamped to the row); the tokens before
    cu_seqlens[b, 0] and after cu_seqlens[b, n] are padding. max_seqlen: a static bound on
    the sequences' lengths (default seq), which sizes the kernels' grid as
    flash-attention's does: a sequence's tokens past it are padding (zeros), so give the
    true bound. causal, local_window_size, scale: as in `varlen_attention`, on positions
    within each sequence. The cu_seqlens are read on the device (no host sync, inside jit);
    they cannot be checked there: decreasing ones leave the overlapping tokens' results
    unspecified (no fault). Returns q's shape and dtype.

    The kernels are varlen_attention's (bf16 / f16, head_dim 64, 80, 96 or 128, max_seqlen
    <= 65536, rows up to 2^24 tokens): a CTA takes one sequence (or 128 tokens of it), so
    packing costs nothing over padded rows of the same lengths. Elsewhere a masked softmax
    in XLA. Differentiable, vmap-able, as varlen_attention.
    """
    q, k, v, cu = (jnp.asarray(a) for a in (q, k, v, cu_seqlens))
    flat = q.ndim == 3
    if flat:  # [tokens, heads, head_dim]: one packed row
        if k.ndim != 3 or v.ndim != 3 or cu.ndim != 1:
            raise ValueError(f"packed_attention: with q [tokens, heads, head_dim], k and v must be [tokens, "
                             f"kv_heads, head_dim] and cu_seqlens [n + 1]; got k {tuple(k.shape)}, v "
                             f"{tuple(v.shape)}, cu_seqlens {tuple(cu.shape)}")
        q, k, v, cu = q[None], k[None], v[None], cu[None]
    _prim.check_qkv(q, k, v, where="packed_attention")
    if not jnp.issubdtype(q.dtype, jnp.floating):
        raise TypeError(f"packed_attention: q must be a float array, got {q.dtype}")
    if cu.ndim != 2 or cu.shape[0] != q.shape[0] or cu.shape[1] < 1 or not jnp.issubdtype(cu.dtype, jnp.integer):
        raise ValueError(f"packed_attention: cu_seqlens must be integers [batch, n + 1] = [{q.shape[0]}, n + 1] "
                         f"(or [n + 1] with q [tokens, heads, head_dim]), got {cu.dtype} {tuple(cu.shape)}")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"packed_attention: causal must be a Python bool, got {type(causal).__name__}")
    seq = q.shape[1]
    if max_seqlen is None:
        max_seqlen = seq
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, np.integer)) or max_seqlen < 1:
        raise ValueError(f"packed_attention: max_seqlen must be a static int >= 1 (the longest sequence's "
                         f"tokens), got {max_seqlen!r}")
    max_seqlen = min(int(max_seqlen), max(seq, 1))
    scale = _static_scale("packed_attention", scale, q.shape[-1])
    window_left, window_right = _window(local_window_size)
    params = dict(scale=scale, causal=bool(causal), max_seqlen=max_seqlen)
    if (window_left, window_right) != (-1, -1):
        params.update(window_left=window_left, window_right=window_right)
    cu = cu.astype(jnp.int32)
    if cu.shape[1] < 2 or 0 in q.shape:  # no sequence (or nothing to attend): all padding
        out = jnp.zeros(q.shape, q.dtype)
    elif (config.reference_enabled("varlen_attention")
          or not _prim.kernel_applies(q.shape, q.dtype, max_seqlen)
          or q.shape[0] * (cu.shape[1] - 1) > 65535):  # the kernels' grid: one sequence a CTA row
        out = reference(q, k, v, cu, **params)
    else:
        out = _prim.varlen_attention_p.bind(q, k, v, cu, **params)[0]
    return out[0] if flat else out
