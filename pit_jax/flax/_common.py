"""What the linen and nnx layers share: the sparse product over the last dim of x."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import pit_jax
from pit_jax import reference
from pit_jax.optimizer.plan import Plan
from pit_jax.primitives._products import is_count


def check_features(what, **sizes):
    """Each named layer size a count (`_products.is_count`: an int >= 1), a clear error
    where Flax's initializer would divide by zero."""
    for name, n in sizes.items():
        if not is_count(n):
            raise ValueError(f"{what}: {name} must be an int >= 1, got {n!r}")


def check_batch_dims(batch_dims, shape, what, kept):
    """A layer's `batch_dims` must leave at least one leading dim of x [..., D] to fold:
    a clear error naming the valid range otherwise."""
    lead = len(shape) - 1
    if not 0 <= batch_dims < max(lead, 1):
        raise ValueError(f"{what}batch_dims must be in [0, {max(lead - 1, 0)}] for inputs of shape {tuple(shape)} "
                         f"(leading dims kept as {kept}), got {batch_dims}")


def keep_float32_bias(bias, promoted):
    """The bias to hand to sparse_dense after the layer's dtype promotion (`promoted`): a
    float32 parameter as it is, since sparse_dense rounds it to the product's dtype (in
    the M-axis kernel's epilogue: the same values, without a cast kernel per call)."""
    return bias if bias is not None and jnp.asarray(bias).dtype == jnp.float32 else promoted


def sparse_matmul_last_dim(inputs, kernel, *, axis, micro_tile, precision, index=None, plan=None, bias=None,
                           activation=None, batch_dims=0, dead_rows="dense"):
    """`act(inputs @ kernel + bias)` over the last dim of inputs ([..., K]), skipping dead
    micro-tiles (bias [N] or None; on the M axis bias and a named activation are fused;
    `dead_rows` as in sparse_dense).

    Without an index, all leading dims are folded into the rows, so one index covers
    the whole batch (the forward is exact whatever the tiling: the mask comes from
    inputs itself); `batch_dims` > 0 keeps that many leading dims as a batch, one index
    per entry, which `jit` over several devices splits (docs/transformations.md). A
    given index is used as is (it must match `inputs`). A plan overrides axis and
    micro_tile (its tile clipped to small inputs), or runs the dense product.
    """
    epi = dict(bias=bias, activation=activation, dead_rows=dead_rows)
    if axis not in pit_jax.ops.sparse_dense.AXES:  # the layer's own message, before anything uses it
        raise ValueError(f"SparseDense: axis must be one of {pit_jax.ops.sparse_dense.AXES}, got {axis!r}")
    if plan is not None:
        _check_plan(plan, kernel, index)
        if plan.is_dense:  # x @ w, with the bias and activation, by sparse_dense
            return pit_jax.sparse_dense(inputs, kernel, precision=precision, plan=plan, **epi)
        axis, micro_tile = plan.axis, plan.micro_tile
    if index is not None:
        return pit_jax.sparse_dense(inputs, kernel, index, axis=axis, micro_tile=micro_tile, precision=precision, **epi)
    lead = inputs.shape[:-1]
    check_batch_dims(batch_dims, inputs.shape, "", "a batch; the rest are rows")
    x2 = jnp.reshape(inputs, (*lead[:batch_dims], -1, inputs.shape[-1]))
    owner = kernel.shape if axis == "w" else x2.shape[-2:]  # the matrix the index tiles
    if isinstance(micro_tile, str) and micro_tile == "auto" and isinstance(kernel if axis == "w" else x2, jax.core.Tracer):
        micro_tile = None  # traced: nothing to plan from; the default, fitted to the input
    y = pit_jax.sparse_dense(x2, kernel, axis=axis, micro_tile=_fit(micro_tile, owner), precision=precision,
                             **epi)
    return jnp.reshape(y, (*lead, kernel.shape[-1]))


def layer_norm_last_dim(x, scale, offset, index=None, *, residual=None, bias=None, epsilon, dtype, param_dtype,
                        dead_rows="zeros", copies=1):
    """`pit_jax.layer_norm` of x [..., H] with the Flax LayerNorm's dtype rule (the result
    in `dtype`, else in x's dtype promoted with the parameters'); scale / offset None =
    ones / zeros. Without an index every row is normalized (leading dims folded into rows).
    `dead_rows` and `copies` as in pit_jax.layer_norm."""
    x = jnp.asarray(x)
    out = jnp.dtype(dtype) if dtype is not None else jnp.result_type(x.dtype, param_dtype)
    features = x.shape[-1]
    scale = jnp.ones((features,), jnp.float32) if scale is None else scale
    offset = jnp.zeros((features,), jnp.float32) if offset is None else offset
    x = x.astype(out)
    residual = None if residual is None else jnp.asarray(residual).astype(out)
    if index is not None:
        return pit_jax.layer_norm(x, scale, offset, index, residual=residual, bias=bias, epsilon=epsilon,
                                  dead_rows=dead_rows, copies=copies)
    flat = lambda a: None if a is None else jnp.reshape(a, (-1, features))
    y = pit_jax.layer_norm(flat(x), scale, offset, residual=flat(residual), bias=bias, epsilon=epsilon,
                           copies=copies)
    return jnp.reshape(y, x.shape) if copies == 1 else tuple(jnp.reshape(c, x.shape) for c in y)


def _fit(micro_tile, shape):
    """The layer's (or its plan's) micro-tile clipped to small inputs, so a layer works on
    any batch size; sparse_dense clips its defaults itself."""
    if micro_tile is None or isinstance(micro_tile, str):
        return micro_tile
    return pit_jax.ops.sparse_dense.clip_micro_tile(micro_tile, shape)


def _check_plan(plan, kernel, index):
    if not isinstance(plan, Plan):
        raise TypeError(f"SparseDense: plan must be a pit_jax.Plan (from pit_jax.plan), got {type(plan).__name__}")
    if index is not None:
        raise ValueError("SparseDense: pass either a plan or an index, not both")
    if tuple(plan.w_shape[-2:]) != tuple(kernel.shape):
        raise ValueError(
            f"SparseDense: the plan was made for a kernel of shape {tuple(plan.w_shape[-2:])}, this layer's is "
            f"{tuple(kernel.shape)}"
        )


def plan_from_sample(sample, in_features, out_features, *, dtype, param_dtype, precision):
    """A plan for the layer's product from a sample of its inputs ([..., in_features])."""
    shape = tuple(np.shape(sample))
    if len(shape) < 1 or shape[-1] != in_features:
        raise ValueError(f"SparseDense: the sample's last dim must be in_features = {in_features}, got shape {shape}")
    sample = np.reshape(np.asarray(sample), (-1, in_features))
    run_dtype = jnp.result_type(sample.dtype, param_dtype) if dtype is None else jnp.dtype(dtype)
    return pit_jax.plan(sample, (in_features, out_features), run_dtype, precision=precision)


def attention_heads(num_heads, num_kv_heads, features):
    """(heads, kv_heads) of an attention layer, checked: num_heads divides the qkv
    features, num_kv_heads (None = num_heads) divides num_heads."""
    if num_heads < 1 or features % num_heads:
        raise ValueError(f"VarlenSelfAttention: num_heads ({num_heads}) must divide qkv_features ({features})")
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if not isinstance(kv_heads, (int, np.integer)) or kv_heads < 1 or num_heads % kv_heads:
        raise ValueError(f"VarlenSelfAttention: num_kv_heads must be a positive int dividing num_heads "
                         f"({num_heads}), got {num_kv_heads!r}")
    return num_heads, int(kv_heads)


def varlen_self_attention(x, lengths, qkv_kernels, qkv_biases, out_kernel, out_bias, *, dtype, precision,
                          index=None, dead_rows="zeros", causal=False, padding="right", local_window_size=None,
                          cu_seqlens=None, max_seqlen=None):
    """Multi-head self-attention of x [B, S, D] over each sequence's valid tokens (its
    first lengths[b], or its last with padding "left"; causal: each query over the keys
    at or before it; local_window_size as in `pit_jax.varlen_attention`), from Flax's
    attention parameters: qkv_kernels three [D, heads, hd] (query, key, value; key and
    value may have fewer heads dividing the query's: grouped-query attention),
    qkv_biases three [heads, hd] or None, out_kernel [H, hd, O], out_bias [O] or None.
    The projections are M-axis products over the valid rows (q, k and v in one,
    out_parts=3; with grouped heads q in one and k, v in another), the attention
    `pit_jax.varlen_attention` (scale 1/sqrt(hd), as Flax's), the output projection an
    M-axis product; `index` is the row index of the valid tokens of x as [B * S, D]
    (built from lengths when None). Result [B, S, O]; padding rows per `dead_rows`
    ("zeros" or "unspecified"). Packed rows: `cu_seqlens` [B, n + 1] in place of lengths
    (and `max_seqlen`), each row's sequences attending each to its own tokens, as
    `pit_jax.packed_attention`."""
    from flax.linen.dtypes import promote_dtype

    x = jnp.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"VarlenSelfAttention: inputs must be [batch, seq, features], got shape {tuple(x.shape)}")
    packed = cu_seqlens is not None
    if packed == (lengths is not None):
        raise ValueError("VarlenSelfAttention: give lengths (padded sequences) or cu_seqlens (packed rows), "
                         f"exactly one; got {'both' if packed else 'neither'}")
    if packed:
        cu = jnp.asarray(cu_seqlens)
        if cu.ndim != 2 or cu.shape[0] != x.shape[0] or cu.shape[1] < 1 or not jnp.issubdtype(cu.dtype, jnp.integer):
            raise ValueError(f"VarlenSelfAttention: cu_seqlens must be integers [batch, n + 1] = [{x.shape[0]}, "
                             f"n + 1], got {cu.dtype} {tuple(cu.shape)}")
        if padding != "right":
            raise ValueError(f"VarlenSelfAttention: packed rows (cu_seqlens) take no padding={padding!r}: a "
                             "row's tokens outside its sequences are padding wherever they are")
    else:
        lengths = jnp.asarray(lengths)
        if tuple(lengths.shape) != x.shape[:1] or not jnp.issubdtype(lengths.dtype, jnp.integer):
            raise ValueError(f"VarlenSelfAttention: lengths must be integers [batch] = [{x.shape[0]}], got "
                             f"{lengths.dtype} {tuple(lengths.shape)}")
    if dead_rows not in ("zeros", "unspecified"):
        raise ValueError(f"VarlenSelfAttention: dead_rows must be 'zeros' or 'unspecified', got {dead_rows!r}")
    if padding not in ("right", "left"):
        raise ValueError(f"VarlenSelfAttention: padding must be 'right' or 'left', got {padding!r}")
    b, s, d = x.shape
    (heads, hd), kv_heads = qkv_kernels[0].shape[1:], qkv_kernels[1].shape[1]
    widths = (heads * hd, kv_heads * hd, kv_heads * hd)
    flat_biases = [None] * 3 if qkv_biases is None else [jnp.reshape(v, (n,)) for v, n in zip(qkv_biases, widths)]
    x, w_out, out_bias_p, *promoted = promote_dtype(x, out_kernel, out_bias, *qkv_kernels, *flat_biases, dtype=dtype)
    out_bias = keep_float32_bias(out_bias, out_bias_p)
    if index is None:
        if packed:
            valid = reference.packed_tokens(cu.astype(jnp.int32), s, max_seqlen or s)[0]
        else:
            valid = reference.valid_tokens(lengths, s, padding == "left")
        index = pit_jax.index(valid.reshape(b * s, 1), "row")
    rows = x.reshape(b * s, d)

    def project(parts):
        """One M-axis product for the projections `parts` (of 0, 1, 2 = q, k, v), their
        kernels side by side, each result its own array (out_parts)."""
        w = jnp.concatenate([promoted[i].reshape(d, widths[i]) for i in parts], axis=1)
        bias = None
        if qkv_biases is not None:
            cat = lambda vs: vs[0] if len(vs) == 1 else jnp.concatenate(vs)  # noqa: E731
            bias = keep_float32_bias(cat([flat_biases[i] for i in parts]), cat([promoted[3 + i] for i in parts]))
        # zeros on the padding rows: the attention's XLA path (shapes its kernels do not
        # take) reads every row
        y = pit_jax.sparse_dense(rows, w, index, axis="m", bias=bias, out_parts=len(parts), dead_rows="zeros",
                                 precision=precision)
        return (y,) if len(parts) == 1 else y

    # one product for q, k and v; with grouped heads their widths differ, and the parts of
    # one product are equal: q in one, k and v in another
    q, k, v = project((0, 1, 2)) if kv_heads == heads else project((0,)) + project((1, 2))
    q, k, v = q.reshape(b, s, heads, hd), k.reshape(b, s, kv_heads, hd), v.reshape(b, s, kv_heads, hd)
    if packed:
        att = pit_jax.packed_attention(q, k, v, cu, max_seqlen=max_seqlen, causal=causal,
                                       local_window_size=local_window_size)
    else:
        att = pit_jax.varlen_attention(q, k, v, lengths, causal=causal, padding=padding,
                                       local_window_size=local_window_size)
    y = pit_jax.sparse_dense(att.reshape(b * s, widths[0]), w_out.reshape(widths[0], -1), index, axis="m",
                             bias=out_bias, dead_rows=dead_rows, precision=precision)
    return y.reshape(b, s, -1)
