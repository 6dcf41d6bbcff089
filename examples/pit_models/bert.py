"""A BERT-shaped encoder (post-LN, GELU FFN) whose linears are PIT products.

Hidden states stay in the padded layout, flattened to [B*S, H]. Every linear of every
layer shares ONE row index of the valid tokens, built once per batch from the padding
mask (`pit_jax.index(mask[:, None], "row")`), so padding rows cost nothing in the
products (M axis), nor in the FFN's bias and GELU, which run in that product's epilogue
on live rows only, nor in the residual adds and layer norms: attn_out and ffn_out leave
out their bias, which `pit_jax.flax.LayerNorm` adds with the residual on the valid rows
(padding rows come out zero). The attention runs on the valid tokens too
(`pit_jax.varlen_attention`, where its kernels take the shapes). With
`weight_index` (sparse training), the named linears multiply by block-pruned kernels
instead (W axis). `mode="dense"` is the nn.Dense twin: identical parameter tree, so
the same params run both.

Dropout is left out so PIT and dense agree exactly (fine-tuning usually keeps it; it
does not change which rows are padding).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

import pit_jax
from pit_jax.flax import LayerNorm, SparseDense
from pit_models import common, tied

MODES = ("pit", "dense")
LINEARS = ("qkv", "attn_out", "ffn_in", "ffn_out")  # per layer; the pruned ones in sparse training
DENSE_ROUTE = "dense"  # a weight_index value: this linear's kernel is masked by the caller, no W-axis index
DENSE_ACTIVATIONS = {"gelu_exact": lambda y: nn.gelu(y, approximate=False)}  # the dense twin's, by name


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab: int = 30522
    hidden: int = 768
    heads: int = 12
    ffn: int = 3072
    layers: int = 12
    max_len: int = 512
    num_labels: int = 2
    dtype: Any = jnp.bfloat16  # compute dtype; parameters are float32

    @classmethod
    def base(cls, **kw):
        return cls(**kw)

    @classmethod
    def tiny(cls, **kw):
        return cls(**{**dict(vocab=97, hidden=64, heads=4, ffn=128, layers=2, max_len=64, dtype=jnp.float32), **kw})

    @property
    def head_dim(self):
        return self.hidden // self.heads


def row_index(mask):
    """The valid-token row index of a [B, S] padding mask, for the [B*S, H] hidden states."""
    return pit_jax.index(jnp.reshape(mask, (-1, 1)), "row")


def linear(features, name, x, *, mode, dtype, rows=None, weight_index=None, activation=None, dead_rows="zeros",
           tied_sums=False):
    """act(nn.Dense) (dense), or SparseDense on the W axis (a given weight index) or M
    axis (bias and activation fused into the product, on live rows). `weight_index` may
    be `DENSE_ROUTE`: sparse training's dense STile for a kernel the caller has masked
    (then the M axis with a row index, else the dense product). `tied_sums`: the dense
    and W-axis products' bias added by `tied.Dense` (its gradient's sum tied to the
    cotangent it reads)."""
    dense_route = weight_index is DENSE_ROUTE
    if dense_route:
        weight_index = None
    act = (lambda y: y) if activation is None else DENSE_ACTIVATIONS[activation]  # noqa: E731
    if tied_sums and (mode == "dense" or rows is None or weight_index is not None):
        product = None if weight_index is None else (lambda a, k: pit_jax.sparse_dense(a, k, weight_index, axis="w"))
        return act(tied.Dense(features, dtype=dtype, name=name)(x, product))
    if mode == "dense" or (dense_route and rows is None):
        return act(nn.Dense(features, dtype=dtype, name=name)(x))
    if weight_index is not None:
        return SparseDense(features, dtype=dtype, axis="w", activation=activation, name=name)(x, index=weight_index)
    if rows is None:
        raise ValueError(f"bert.linear {name!r}: mode='pit' needs a row index or a weight index")
    # The padding rows' values are never read (attention masks them, the layer norms
    # skip them): zeros there (dead_rows="zeros"), so the bias's gradient reads the
    # valid rows only.
    return SparseDense(features, dtype=dtype, axis="m", activation=activation, dead_rows=dead_rows,
                       name=name)(x, index=rows)


class Product(nn.Module):
    """nn.Dense's parameters ("kernel", "bias"), its product without the bias on the M axis
    (or the W axis with a weight index), and the bias for the layer norm that follows:
    returns (x @ kernel in `dtype`, bias in float32)."""

    features: int
    dtype: Any = jnp.float32
    dead_rows: str = "dense"  # M axis: "unspecified" leaves the padding rows unwritten (inference)

    @nn.compact
    def __call__(self, x, rows, weight_index=None):
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
        x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
        if weight_index is not None and weight_index is not DENSE_ROUTE:
            return pit_jax.sparse_dense(x, kernel, weight_index, axis="w"), bias
        if rows is None:  # the masked kernel, no row index (sparse training with live-row norms)
            return jnp.dot(x, kernel), bias
        dead = "unspecified" if self.dead_rows == "unspecified" else "dense"  # no bias here: zeros
        return pit_jax.sparse_dense(x, kernel, rows, axis="m", dead_rows=dead), bias


class FusedQKV(nn.Module):
    """nn.Dense's parameters ("kernel" [H, 3H], "bias" [3H]) as one M-axis product whose
    kernel writes q, k and v apart with the bias in its epilogue (`sparse_dense(...,
    out_parts=3)`): slicing them out of one [M, 3H] result costs a pass over every row,
    padding included. Returns (q, k, v), each [M, H] in `dtype`."""

    features: int
    dtype: Any = jnp.float32
    dead_rows: str = "zeros"  # padding rows: zeros (their bias gradient reads valid rows only)

    @nn.compact
    def __call__(self, x, rows):
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], 3 * self.features), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros_init(), (3 * self.features,), jnp.float32)
        # The float32 bias goes in as it is: the kernel rounds it to `dtype` (no cast per call).
        return pit_jax.sparse_dense(x.astype(self.dtype), kernel.astype(self.dtype), rows, axis="m",
                                    bias=bias, out_parts=3, dead_rows=self.dead_rows)


class EncoderLayer(nn.Module):
    cfg: BertConfig
    mode: str = "pit"
    attention: str = "xla"
    live_norm: bool = True  # pit with a row index: residual adds and layer norms on valid rows only
    # pit M-axis linears: the padding rows' value (sparse_dense); "unspecified" (inference)
    # also leaves the live-row layer norms' padding rows unwritten.
    dead_rows: str = "zeros"
    tied_sums: bool = False  # BertClassifier.tied_sums

    @nn.compact
    def __call__(self, x, lengths, batch, seq, rows=None, weight_index: Optional[Mapping] = None, norm_rows=None):
        """x [B*S, H], or a pair of references to it (the previous norm's `copies=2`): the
        first for the q / k / v product, the second for the residual. `norm_rows`: the
        row index of the residual adds and layer norms (default `rows`, the products'):
        sparse training gives one with no row index for the products."""
        cfg, wi = self.cfg, weight_index or {}
        norm_rows = rows if norm_rows is None else norm_rows
        x, x_res = x if isinstance(x, tuple) else (x, x)
        unspecified = self.dead_rows == "unspecified"
        # XLA's and cuDNN's attention read k's and v's padding rows (masked scores times v:
        # NaN * 0 is NaN), so q, k and v keep zeros there; pit_jax.varlen_attention reads
        # the valid rows only.
        qkv_dead = "zeros" if unspecified and self.attention != "pit" else self.dead_rows
        lin = lambda f, n, h, act=None, dead=self.dead_rows: linear(  # noqa: E731
            f, n, h, mode=self.mode, dtype=cfg.dtype, rows=rows, weight_index=wi.get(n), activation=act,
            dead_rows=dead, tied_sums=self.tied_sums)
        heads = lambda t: t.reshape(batch, seq, cfg.heads, cfg.head_dim)  # noqa: E731
        if self.mode == "pit" and rows is not None and norm_rows is rows and self.live_norm and "qkv" not in wi:
            q, k, v = map(heads, FusedQKV(cfg.hidden, cfg.dtype, qkv_dead, name="qkv")(x, rows))
        else:
            qkv = lin(3 * cfg.hidden, "qkv", x, dead=qkv_dead).reshape(batch, seq, 3, cfg.heads, cfg.head_dim)
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        att = common.attention(q, k, v, lengths=lengths, implementation=self.attention)
        att = att.reshape(batch * seq, cfg.hidden)
        if self.mode == "pit" and norm_rows is not None and self.live_norm:
            # Residual add, output bias and layer norm in one pass over the valid rows. Each
            # norm's result feeds a product and the next norm's residual: one reference
            # each (copies=2), so the backward adds the two cotangents on the valid rows.
            norm_dead = "unspecified" if unspecified else "zeros"
            norm = lambda n: LayerNorm(epsilon=1e-12, dtype=cfg.dtype, dead_rows=norm_dead, name=n)  # noqa: E731
            att, b = Product(cfg.hidden, cfg.dtype, self.dead_rows, name="attn_out")(att, rows, wi.get("attn_out"))
            x, x_res = norm("ln_attn")(x_res, norm_rows, residual=att, bias=b, copies=2)
            h = lin(cfg.ffn, "ffn_in", x, "gelu_exact")
            h, b = Product(cfg.hidden, cfg.dtype, self.dead_rows, name="ffn_out")(h, rows, wi.get("ffn_out"))
            return norm("ln_ffn")(x_res, norm_rows, residual=h, bias=b, copies=2)
        att = lin(cfg.hidden, "attn_out", att)
        norm = tied.LayerNorm if self.tied_sums else nn.LayerNorm
        x = norm(epsilon=1e-12, dtype=cfg.dtype, name="ln_attn")(x_res + att)
        h = lin(cfg.ffn, "ffn_in", x, "gelu_exact")
        h = lin(cfg.hidden, "ffn_out", h)
        return norm(epsilon=1e-12, dtype=cfg.dtype, name="ln_ffn")(x + h)


class BertClassifier(nn.Module):
    """Encoder + pooler + classifier on the first ([CLS]) token.

    __call__(tokens [B, S] int32, lengths [B] int32, weight_index=None) -> (logits
    [B, num_labels] float32, hidden [B*S, H]); rows of padding tokens in `hidden` are
    not meaningful (compare valid rows only). `weight_index`: {"layer_i/<linear>":
    PitIndex of that kernel, or `DENSE_ROUTE` for a kernel the caller masked} for sparse
    training (see `pruning`); linears not named there skip padding on the M axis.
    """

    cfg: BertConfig
    mode: str = "pit"
    attention: str = "xla"  # "xla", "cudnn" or "auto" (cuDNN where it works for the shapes)
    skip_padding: bool = True  # pit mode: False = no row index (for sparse training on full batches)
    # pit mode with skip_padding False: the residual adds and layer norms still by
    # pit_jax.flax.LayerNorm on the valid rows (its row kernels), the products without an index
    row_norms: bool = False
    live_norm: bool = True  # pit mode with skip_padding: residual adds and layer norms on valid rows only
    # pit mode: padding rows of the biased M-axis linears ("dense": act(bias)); "unspecified"
    # leaves them and the live-row layer norms' padding rows unwritten (gradients as "zeros").
    dead_rows: str = "zeros"
    # pit mode with skip_padding: attention by `pit_jax.varlen_attention` (valid tokens only)
    # where its kernels take the shapes (16-bit, head_dim 64, 80, 96 or 128) and are the
    # faster (`common.varlen_kernels_apply`: past 128 tokens, cuDNN where it runs when the
    # call is differentiated, `train`), else `attention`.
    varlen_attention: bool = True
    # The layers on flax's path (nn.LayerNorm, the dense and W-axis products' bias adds) by
    # `tied`'s, whose parameter-gradient column sums are tied to the cotangent they read:
    # computed next to it in any schedule XLA picks (sparse training's twins).
    tied_sums: bool = False

    @nn.compact
    def __call__(self, tokens, lengths, weight_index: Optional[Mapping] = None, train: bool = True):
        """train: whether the call is differentiated (False: inference), which picks the
        attention past 128 tokens (`varlen_attention`); the result is the same either way."""
        cfg = self.cfg
        if self.mode not in MODES:
            raise ValueError(f"BertClassifier: mode must be one of {MODES}, got {self.mode!r}")
        batch, seq = tokens.shape
        if seq > cfg.max_len:
            raise ValueError(f"BertClassifier: sequence length {seq} exceeds max_len={cfg.max_len}")
        mask = common.right_padding_mask(lengths, seq)
        rows = row_index(mask) if self.mode == "pit" and self.skip_padding else None
        norm_rows = rows  # the residual adds' and layer norms' rows
        if rows is None and self.row_norms and self.mode == "pit":
            norm_rows = row_index(mask)
        if rows is not None and self.varlen_attention and common.varlen_kernels_apply(batch, seq, cfg,
                                                                                       self.attention, train=train):
            impl = "pit"
        else:
            impl = common.resolve_attention(self.attention, batch, seq, cfg.heads, cfg.head_dim, cfg.dtype)
        emb = nn.Embed(cfg.vocab, cfg.hidden, name="word_emb")(tokens)
        emb = emb + nn.Embed(cfg.max_len, cfg.hidden, name="pos_emb")(jnp.arange(seq))[None]
        emb = emb.reshape(batch * seq, cfg.hidden)
        if norm_rows is not None and self.live_norm:
            dead = "unspecified" if self.dead_rows == "unspecified" else "zeros"
            x = LayerNorm(epsilon=1e-12, dtype=cfg.dtype, dead_rows=dead, name="ln_emb")(emb, norm_rows, copies=2)
        else:
            x = (tied.LayerNorm if self.tied_sums else nn.LayerNorm)(epsilon=1e-12, dtype=cfg.dtype, name="ln_emb")(emb)
        wi = weight_index or {}
        for i in range(cfg.layers):
            name = f"layer_{i}"
            layer_wi = {k.split("/", 1)[1]: v for k, v in wi.items() if k.startswith(name + "/")}
            if self.mode == "pit" and rows is None and set(layer_wi) != set(LINEARS):
                raise ValueError(f"BertClassifier: skip_padding=False needs a weight index for every linear "
                                 f"of {name} ({LINEARS}), got {sorted(layer_wi)}")
            x = EncoderLayer(cfg, self.mode, impl, self.live_norm, self.dead_rows, self.tied_sums, name=name)(
                x, lengths, batch, seq, rows, layer_wi, norm_rows)
        x = x[0] if isinstance(x, tuple) else x
        cls = x.reshape(batch, seq, cfg.hidden)[:, 0]
        pooled = jnp.tanh(nn.Dense(cfg.hidden, dtype=cfg.dtype, name="pooler")(cls))
        logits = nn.Dense(cfg.num_labels, dtype=cfg.dtype, name="classifier")(pooled)
        return logits.astype(jnp.float32), x


def cast_kernels(params, cfg: BertConfig):
    """params with every kernel not in cfg.dtype cast to it by `pit_jax.cast_matrices`: one
    launch per kernel shape (5: the encoder's 48 in 4, the pooler's with attn_out's, the
    classifier's) where Flax's mixed precision casts each kernel in its layer (one XLA
    convert each; those become no-ops). The same results and gradients (bit for bit on the
    CPU; on a GPU XLA may fuse a dense layer's operand cast into its dot)."""
    return pit_jax.cast_matrices(params, cfg.dtype)


def loss_fn(model, params, tokens, lengths, labels, weight_index=None, grouped_casts=False):
    """grouped_casts: the kernels cast up front by `cast_kernels` (the same loss)."""
    if grouped_casts:
        params = cast_kernels(params, model.cfg)
    logits, _ = model.apply(params, tokens, lengths, weight_index)
    return jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


def synthetic_batch(rng, cfg: BertConfig, batch, seq, lengths):
    """Random tokens ([CLS] = 1 first, padding id 0) and a learnable label: label-1
    sequences draw 80% of their tokens from the lower half of the vocabulary, label-0
    sequences 80% from the upper half."""
    import numpy as np

    labels = rng.integers(0, 2, size=batch)
    half = cfg.vocab // 2
    low = rng.integers(2, max(3, half), size=(batch, seq))
    high = rng.integers(half, cfg.vocab, size=(batch, seq))
    pick_low = (rng.random((batch, seq)) < 0.8) == (labels[:, None] == 1)
    tokens = np.where(pick_low, low, high)
    tokens[:, 0] = 1
    valid = np.arange(seq)[None, :] < lengths[:, None]
    tokens = np.where(valid, tokens, 0).astype(np.int32)
    return jnp.asarray(tokens), jnp.asarray(lengths, jnp.int32), jnp.asarray(labels % cfg.num_labels, jnp.int32)
