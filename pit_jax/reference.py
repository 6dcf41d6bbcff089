"""Pure-JAX references of every pit_jax primitive.

They define what each primitive computes (the test oracle) and are what the kill
switch (`pit_jax.use_reference`) runs. They list tiles in row-major order; the
native paths may list them in any order.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def tile_liveness(x: jax.Array, tile_h: int, tile_w: int) -> jax.Array:
    """bool [..., tile_rows, tile_cols]: whether any element of each micro-tile is non-zero."""
    rows, cols = x.shape[-2:]
    nz = x if x.dtype == jnp.bool_ else x != 0  # -0 is zero, NaN is live
    tr, tc = math.ceil(rows / tile_h), math.ceil(cols / tile_w)
    pad = [(0, 0)] * (x.ndim - 2) + [(0, tr * tile_h - rows), (0, tc * tile_w - cols)]
    nz = jnp.pad(nz, pad)
    nz = nz.reshape(*x.shape[:-2], tr, tile_h, tc, tile_w)
    return nz.any(axis=(-3, -1))


def _list_live(live: jax.Array, size: int, dead_tail: bool = False):
    """Row-major slots of the True entries of each row of `live` [n, m]: ([n, size], [n]).

    Slots past the count are -1, except with `dead_tail` at full capacity (size == m),
    where they hold the dead entries as -1 - id, from the back (as the native kernels
    do for the flat list).
    """

    def one(row):
        (ids,) = jnp.nonzero(row, size=size, fill_value=-1)
        if dead_tail and size == row.shape[0]:
            (dead,) = jnp.nonzero(~row, size=size, fill_value=0)  # ascending dead ids
            slot = jnp.arange(size)
            ids = jnp.where(slot >= row.sum(), -1 - dead[size - 1 - slot], ids)
        return ids.astype(jnp.int32), row.sum(dtype=jnp.int32)

    if live.shape[0] == 0:
        return jnp.zeros((0, size), jnp.int32), jnp.zeros((0,), jnp.int32)
    return jax.vmap(one)(live)


def index(x: jax.Array, *, tile_h: int, tile_w: int, capacity: int, group_rows: bool, group_cols: bool):
    """Reference of the `pit_index` primitive (see pit_jax.primitives.index): 7 arrays."""
    lead = x.shape[:-2]
    live = tile_liveness(x, tile_h, tile_w)
    tr, tc = live.shape[-2:]
    batch = math.prod(lead)
    live = live.reshape(batch, tr, tc)
    tiles, count = _list_live(live.reshape(batch, tr * tc), capacity, dead_tail=True)
    out = [tiles.reshape(*lead, capacity), count.reshape(lead)]
    dead = (tr * tc - count) if capacity == tr * tc else jnp.zeros_like(count)
    for wanted, groups in ((group_rows, live), (group_cols, jnp.swapaxes(live, -1, -2))):
        if wanted:
            g, n = groups.shape[1:]
            lists, counts = _list_live(groups.reshape(batch * g, n), n)
            out += [lists.reshape(*lead, g, n), counts.reshape(*lead, g)]
        else:
            out += [jnp.zeros((*lead, 0, 0), jnp.int32), jnp.zeros((*lead, 0), jnp.int32)]
    return (*out, dead.reshape(lead))


# -- masks from index lists -------------------------------------------------------------


def _valid_slots(lists, counts):
    cap = lists.shape[-1]
    return (jnp.arange(cap) < jnp.minimum(counts, cap)[..., None]) & (lists >= 0)


def _scatter_true(ids, valid, size):
    """bool [..., size] with True at the valid ids (per leading entry)."""
    lead = ids.shape[:-1]
    flat_ids = jnp.where(valid, ids, size).reshape(-1, ids.shape[-1])
    out = jax.vmap(lambda i: jnp.zeros((size,), jnp.bool_).at[i].set(True, mode="drop"))(flat_ids)
    return out.reshape(*lead, size)


def tile_mask_from_flat(tiles, count, tile_rows, tile_cols):
    """bool [..., tile_rows, tile_cols] of the tiles a flat list names."""
    m = _scatter_true(tiles, _valid_slots(tiles, count), tile_rows * tile_cols)
    return m.reshape(*count.shape, tile_rows, tile_cols)


def tile_mask_from_groups(lists, counts, tile_rows, tile_cols, rows: bool):
    """Same from grouped lists: per tile row (`rows`) or per tile column."""
    m = _scatter_true(lists, _valid_slots(lists, counts), tile_cols if rows else tile_rows)
    return m if rows else jnp.swapaxes(m, -1, -2)


def element_mask(tile_mask, tile, shape):
    h, w = tile
    m = jnp.repeat(jnp.repeat(tile_mask, h, axis=-2), w, axis=-1)
    return m[..., : shape[0], : shape[1]]


def _tiled(x, tile):
    """[..., R, C] -> [..., tile_rows * tile_cols, h, w] (zero-padded edge tiles)."""
    rows, cols = x.shape[-2:]
    h, w = tile
    tr, tc = math.ceil(rows / h), math.ceil(cols / w)
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, tr * h - rows), (0, tc * w - cols)])
    x = x.reshape(*x.shape[:-2], tr, h, tc, w)
    return jnp.swapaxes(x, -3, -2).reshape(*x.shape[:-4], tr * tc, h, w)


def _untiled(t, tile, shape):
    """Inverse of `_tiled`, cropped to `shape` = (R, C)."""
    rows, cols = shape
    h, w = tile
    tr, tc = math.ceil(rows / h), math.ceil(cols / w)
    t = t.reshape(*t.shape[:-3], tr, tc, h, w)
    t = jnp.swapaxes(t, -3, -2).reshape(*t.shape[:-4], tr * h, tc * w)
    return t[..., :rows, :cols]


# -- layer norm on live rows -----------------------------------------------------------------


def layer_norm_rows(x, scale, offset, rows, *, residual=None, bias=None, epsilon=1e-6):
    """LN(x + residual + bias) * scale + offset where `rows` [..., M] is True, 0 elsewhere
    (float32 math, Flax's default variance E[h^2] - E[h]^2; one rounding to x's dtype)."""
    h = x.astype(jnp.float32)
    if residual is not None:
        h = h + residual.astype(jnp.float32)
    if bias is not None:
        h = h + bias.astype(jnp.float32)
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.maximum(jnp.mean(h * h, axis=-1, keepdims=True) - mean * mean, 0.0)
    y = (h - mean) * (jax.lax.rsqrt(var + epsilon) * scale.astype(jnp.float32)) + offset.astype(jnp.float32)
    return jnp.where(rows[..., None], y, 0.0).astype(x.dtype)


# -- sread / swrite ------------------------------------------------------------------------


def sread(x, tiles, count, *, tile):
    """Reference of `pit_sread`: packed [..., capacity, h, w]."""
    valid = _valid_slots(tiles, count)
    all_tiles = _tiled(x, tile)
    ids = jnp.where(valid, tiles, 0)
    packed = jnp.take_along_axis(all_tiles, ids[..., None, None], axis=-3)
    return jnp.where(valid[..., None, None], packed, jnp.zeros((), x.dtype))


def swrite(packed, tiles, count, base, *, accumulate):
    """Reference of `pit_swrite`: base with the listed tiles overwritten or added to."""
    n = math.prod(math.ceil(s / t) for s, t in zip(base.shape[-2:], packed.shape[-2:]))
    valid = _valid_slots(tiles, count)
    ids = jnp.where(valid, tiles, n).reshape(-1, tiles.shape[-1])
    flat_packed = packed.reshape(-1, *packed.shape[-3:]).astype(jnp.float32)
    contrib = jax.vmap(
        lambda i, p: jnp.zeros((n, *p.shape[-2:]), jnp.float32).at[i].set(p, mode="drop")
    )(ids, flat_packed).reshape(*base.shape[:-2], n, *packed.shape[-2:])
    listed = _scatter_true(tiles, valid, n)[..., None, None] & jnp.ones(packed.shape[-2:], bool)
    contrib = _untiled(contrib, packed.shape[-2:], base.shape[-2:])
    listed = _untiled(listed, packed.shape[-2:], base.shape[-2:])
    base32 = base.astype(jnp.float32)
    out = base32 + contrib if accumulate else jnp.where(listed, contrib, base32)
    return out.astype(base.dtype)


# -- sparse products --------------------------------------------------------------------


def product(a, b, *, trans_a, trans_b, trans_c, out_batch, precision=jax.lax.Precision.HIGHEST, upcast=True,
            out_dtype=jnp.float32):
    """float32 op_a(a) @ op_b(b) with pit_jax's prefix batch convention, summed to out_batch.
    `upcast`: the operands in float32 (the reference); else in their own dtype with float32
    accumulation (the CUDA lowerings' dense route, on the tensor cores). `out_dtype`: the
    product's result type (float32 accumulation either way; a 16-bit result is rounded
    once in the GEMM's epilogue instead of written in float32), except where a batch that
    only one operand has is summed after the product (then float32)."""
    full = max(a.shape[:-2], b.shape[:-2], key=len)
    opa = jnp.swapaxes(a, -1, -2) if trans_a else a
    opb = jnp.swapaxes(b, -1, -2) if trans_b else b
    if upcast:
        opa, opb = opa.astype(jnp.float32), opb.astype(jnp.float32)
    summed = tuple(range(out_batch, len(full)))
    if summed and a.shape[:-2] == b.shape[:-2] == full:
        # The summed batch dims contracted in the GEMM itself: one product, no float32
        # per-entry results and reduce after it (1.10-1.29x -> 0.99-1.01x a folded batch's
        # time for a shared weight's gradient on the H200, docs/benchmarks.md).
        nb, kept = len(full), tuple(range(out_batch))
        dims = (((*summed, nb + 1), (*summed, nb)), (kept, kept))
        p = jax.lax.dot_general(opa, opb, dims, precision=precision, preferred_element_type=out_dtype)
        return jnp.swapaxes(p, -1, -2) if trans_c else p
    pad = lambda x: x.reshape(*x.shape[:-2], *([1] * (len(full) - (x.ndim - 2))), *x.shape[-2:])  # noqa: E731
    kind = jnp.float32 if summed else out_dtype
    p = jnp.matmul(pad(opa), pad(opb), precision=precision, preferred_element_type=kind)
    p = jnp.broadcast_to(p, (*full, *p.shape[-2:]))
    p = p.sum(axis=summed)
    return jnp.swapaxes(p, -1, -2) if trans_c else p


def stile_tile_mask(idx, p):
    """bool [..., tile_rows, tile_cols]: the live tiles of the list a stile product's plan
    `p` reads (per-row / per-column lists, else the flat list)."""
    if p.lists in ("rows", "cols"):
        lists, counts = (idx[2], idx[3]) if p.lists == "rows" else (idx[4], idx[5])
        return tile_mask_from_groups(lists, counts, p.tile_rows, p.tile_cols, rows=p.lists == "rows")
    return tile_mask_from_flat(idx[0], idx[1], p.tile_rows, p.tile_cols)


def stile_matmul(a, b, *idx, sparse, tile, trans_a, trans_b, trans_c, allow_tf32, out_batch):
    """Reference of `stile_matmul`: the masked operand is multiplied by its tile mask.

    The mask comes from the same list the native path uses (`plan`), so the two agree
    also when a small flat-list capacity dropped tiles.
    """
    from pit_jax.primitives.stile_matmul import plan

    p = plan(a, b, idx, sparse=sparse, tile=tile, trans_a=trans_a, trans_b=trans_b, trans_c=trans_c,
             out_batch=out_batch)
    s = a if sparse == "a" else b
    masked = jnp.where(element_mask(stile_tile_mask(idx, p), tile, s.shape[-2:]), s.astype(jnp.float32), 0.0)
    if sparse == "a":
        a = masked
    else:
        b = masked
    out = product(a, b, trans_a=trans_a, trans_b=trans_b, trans_c=trans_c, out_batch=out_batch)
    return out.astype(s.dtype)


def sdd_matmul(a, b, *idx, tile, trans_a, trans_b, allow_tf32, out_batch):
    """Reference of `sdd_matmul`: the product kept on the listed tiles of the result only."""
    out = product(a, b, trans_a=trans_a, trans_b=trans_b, trans_c=False, out_batch=out_batch)
    m, n = out.shape[-2:]
    tmask = tile_mask_from_flat(idx[0], idx[1], math.ceil(m / tile[0]), math.ceil(n / tile[1]))
    return jnp.where(element_mask(tmask, tile, (m, n)), out, 0.0).astype(a.dtype)


# -- MoE: routing index and grouped products -------------------------------------------


def moe_index(expert_ids, *, num_experts: int):
    """Reference of `pit_moe_index`: (lists [..., E+1, T*k], counts [..., E+1]), ascending ids per group."""
    lead = expert_ids.shape[:-2]
    a = expert_ids.shape[-2] * expert_ids.shape[-1]
    e = num_experts
    ids = expert_ids.reshape(math.prod(lead), a)

    def one(ids):
        group = jnp.where((ids >= 0) & (ids < e), ids, e).astype(jnp.int32)
        order = jnp.argsort(group, stable=True).astype(jnp.int32)
        counts = jnp.zeros((e + 1,), jnp.int32).at[group].add(1)
        offsets = jnp.cumsum(counts) - counts
        slot = jnp.arange(a, dtype=jnp.int32)
        pos = jnp.minimum(offsets[:, None] + slot[None, :], max(a - 1, 0))
        lists = jnp.where(slot[None, :] < counts[:, None], order[pos], -1)
        return lists.astype(jnp.int32), counts

    if ids.shape[0] == 0 or a == 0:
        lists = jnp.full((ids.shape[0], e + 1, a), -1, jnp.int32)
        counts = jnp.zeros((ids.shape[0], e + 1), jnp.int32)
    else:
        lists, counts = jax.vmap(one)(ids)
    return lists.reshape(*lead, e + 1, a), counts.reshape(*lead, e + 1)


def _assignment_groups(lists, counts):
    from pit_jax.moe_index import MoeIndex

    return MoeIndex(lists, counts, lists.shape[-2] - 1, 1).assignment_groups()


def _to_full(x, full, rank):
    """x [*b, <rank dims>] with b a prefix of `full` -> reshaped to broadcast against `full`."""
    b = x.ndim - rank
    return x.reshape(*x.shape[:b], *([1] * (len(full) - b)), *x.shape[b:])


def _precision(allow_tf32):
    return jax.lax.Precision.DEFAULT if allow_tf32 else jax.lax.Precision.HIGHEST


def grouped_matmul(src, w, lists, counts, *, row_div, trans_w, allow_tf32):
    """Reference of `grouped_matmul`: a loop over experts, each a masked dense product."""
    e = lists.shape[-2] - 1
    a = lists.shape[-1]
    full = max(src.shape[:-2], w.shape[:-3], lists.shape[:-2], key=len)
    groups = _to_full(_assignment_groups(lists, counts), full, 1)[..., None]  # [*, A, 1]
    rows = _to_full(jnp.take(src, jnp.arange(a) // row_div, axis=-2), full, 2).astype(jnp.float32)
    w = _to_full(jnp.swapaxes(w, -1, -2) if trans_w else w, full, 3).astype(jnp.float32)
    f = w.shape[-1]

    def body(i, acc):
        p = jnp.matmul(rows, jnp.take(w, i, axis=-3), precision=_precision(allow_tf32))
        return acc + jnp.where(groups == i, p, 0.0)

    out = jax.lax.fori_loop(0, e, body, jnp.zeros((*full, a, f), jnp.float32))
    return out.astype(src.dtype)


def grouped_wgrad(src, dy, lists, counts, *, row_div, allow_tf32, out_batch):
    """Reference of `grouped_wgrad`: per expert, (gathered rows)^T @ (its rows of dy)."""
    e = lists.shape[-2] - 1
    a = lists.shape[-1]
    full = max(src.shape[:-2], dy.shape[:-2], lists.shape[:-2], key=len)
    groups = _to_full(_assignment_groups(lists, counts), full, 1)[..., None]
    rows = _to_full(jnp.take(src, jnp.arange(a) // row_div, axis=-2), full, 2).astype(jnp.float32)
    dy = _to_full(dy, full, 2).astype(jnp.float32)

    def one(i):
        p = jnp.matmul(jnp.swapaxes(rows, -1, -2), jnp.where(groups == i, dy, 0.0), precision=_precision(allow_tf32))
        p = jnp.broadcast_to(p, (*full, *p.shape[-2:]))
        return p.sum(axis=tuple(range(out_batch, len(full))))

    out = jax.lax.map(one, jnp.arange(e))  # [E, *out_batch, D, F]
    return jnp.moveaxis(out, 0, out_batch).astype(src.dtype)


def moe_ffn(x, gates, expert_ids, w_in, w_out, *, w_gate=None, activation="relu", precision=None):
    """Pure-JAX MoE FFN from the expert ids (no index): a loop over experts with masks.

    y[t] = sum_j gates[t, j] * FFN_{e}(x[t]) with e = expert_ids[t, j];
    FFN_e(v) = act(v @ w_in[e]) @ w_out[e], or (act(v @ w_gate[e]) * (v @ w_in[e])) @ w_out[e].
    Out-of-range ids contribute nothing. Computed in float32 (HIGHEST unless `precision`),
    returned in the inputs' result dtype.
    """
    from pit_jax import _activations

    act = _activations.resolve(activation)
    dtype = jnp.result_type(x, w_in, w_out, *(() if w_gate is None else (w_gate,)))
    prec = jax.lax.Precision.HIGHEST if precision is None else precision
    f32 = lambda v: jnp.asarray(v).astype(jnp.float32)  # noqa: E731
    xf, g = f32(x), f32(gates)
    win, wout = f32(w_in), f32(w_out)
    wg = None if w_gate is None else f32(w_gate)
    ids = jnp.asarray(expert_ids)

    def body(e, acc):
        h = jnp.matmul(xf, win[e], precision=prec)
        h = act(h) if wg is None else act(jnp.matmul(xf, wg[e], precision=prec)) * h
        o = jnp.matmul(h, wout[e], precision=prec)
        weight = jnp.sum(jnp.where(ids == e, g, 0.0), axis=-1)
        return acc + weight[..., None] * o

    y = jax.lax.fori_loop(0, win.shape[0], body, jnp.zeros(xf.shape, jnp.float32))
    return y.astype(dtype)


def block_topk(density, *mats, tile_h: int, tile_w: int):
    """(live bool [M, tk, tn], scores float32 [M, tk, tn], thresholds float32 [M]) of the
    matrices [..., K, N] (M = all of them, in operand order): each block's L1 norm, each
    matrix's keep-th largest norm (keep = clip(round(density * blocks), 1, blocks)) by a
    sort, and the blocks at or above it."""
    k, n = mats[0].shape[-2:]
    tk, tn = math.ceil(k / tile_h), math.ceil(n / tile_w)
    # Each operand's block sums, then the small score arrays joined (not the matrices).
    scores = jnp.concatenate([
        _tiled(jnp.abs(m.reshape(-1, k, n).astype(jnp.float32)), (tile_h, tile_w)).sum(axis=(-2, -1))
        for m in mats
    ]).reshape(-1, tk, tn)
    flat = jnp.sort(scores.reshape(-1, tk * tn), axis=-1)
    keep = jnp.clip(jnp.round(jnp.asarray(density, jnp.float32) * (tk * tn)).astype(jnp.int32), 1, tk * tn)
    thresholds = jnp.take(flat, tk * tn - keep, axis=-1)
    return scores >= thresholds[:, None, None], scores, thresholds


def mask_blocks(live, *mats, tile_h: int, tile_w: int, dtype):
    """Each matrix [..., K, N] with the elements of its dead blocks 0 and the rest cast to
    `dtype`: live bool [M, tk, tn] holds the blocks of every matrix (M = all of them, in
    operand order, leading dims flattened)."""
    outs, first = [], 0
    for m in mats:
        lead = m.shape[:-2]
        count = math.prod(lead)
        blocks = live[first:first + count].reshape(*lead, *live.shape[1:])
        outs.append(jnp.where(element_mask(blocks, (tile_h, tile_w), m.shape[-2:]), m, 0).astype(dtype))
        first += count
    return outs


def valid_tokens(lengths, seq, left_padded=False):
    """bool [B, seq]: whether token i of sequence b is valid: i < lengths[b] (right
    padding) or i >= seq - lengths[b] (left padding), the lengths clamped to [0, seq]."""
    n = jnp.clip(jnp.asarray(lengths).astype(jnp.int32), 0, seq)[:, None]
    i = jnp.arange(seq)[None, :]
    return i >= seq - n if left_padded else i < n


def packed_sequences(cu_seqlens, tokens, max_seqlen):
    """(origin, length) [B, n] of packed rows' sequences: row b's sequence i is its tokens
    [cu_seqlens[b, i], cu_seqlens[b, i + 1]) clamped to the row, at most max_seqlen of them
    valid (the kernels' `Seq` clamps them so)."""
    cu = jnp.asarray(cu_seqlens).astype(jnp.int32)
    origin = jnp.clip(cu[:, :-1], 0, tokens)
    return origin, jnp.minimum(jnp.clip(cu[:, 1:], origin, tokens) - origin, max_seqlen)


def packed_tokens(cu_seqlens, tokens, max_seqlen):
    """(valid, segment, position) [B, tokens] of packed rows (`packed_sequences`): whether a
    token is valid, its sequence and its position in it."""
    origin, length = packed_sequences(cu_seqlens, tokens, max_seqlen)  # [B, n]
    if origin.shape[1] == 0:  # no sequence (cu_seqlens [B, 1]): every token padding
        none = jnp.zeros((origin.shape[0], tokens), jnp.int32)
        return none.astype(bool), none, none + jnp.arange(tokens)[None, :]
    t = jnp.arange(tokens)[None, :, None]
    member = (t >= origin[:, None, :]) & (t < (origin + length)[:, None, :])  # [B, tokens, n]
    segment = jnp.argmax(member, axis=-1)
    position = jnp.arange(tokens)[None, :] - jnp.take_along_axis(origin, segment, axis=1)
    return member.any(axis=-1), segment, position


def varlen_attention(q, k, v, lengths, *, scale, causal=False, left_padded=False, window_left=-1, window_right=-1,
                     max_seqlen=0):
    """(out, lse) of softmax attention over each sequence's valid tokens (the first
    lengths[b], or the last with `left_padded`; causal: keys at or before the query) (q [B,
    S, H, D], k, v [B, S, H_kv, D] with H_kv dividing H: query head h reads kv head h // (H
    // H_kv); float32 math over every row, masked): out in q's dtype, zeros on padding
    rows; lse [B, H, S] float32, each valid query's log-sum-exp of its scaled scores, 0 on
    padding rows (the forward target's second result). window_left / window_right >= 0: a
    local window, query i over keys i - window_left .. i + window_right (-1: no bound).
    max_seqlen > 0: packed rows, `lengths` their cu_seqlens [B, n + 1] (`packed_tokens`):
    a query attends to the valid keys of its own sequence."""
    b, seq, h, d = q.shape
    kv = k.shape[2]
    if max_seqlen:
        valid, segment, position = packed_tokens(lengths, seq, max_seqlen)  # [B, S] each
        keys = valid[:, None, :] & (segment[:, :, None] == segment[:, None, :])  # [B, query, key]
    else:
        valid = valid_tokens(lengths, seq, left_padded)  # [B, S]
        position = jnp.broadcast_to(jnp.arange(seq)[None, :], (b, seq))
        keys = jnp.broadcast_to(valid[:, None, :], (b, seq, seq))
    f = lambda a: a.astype(jnp.float32)  # noqa: E731
    qg = f(q).reshape(b, seq, kv, h // kv, d)  # a kv head's group of query heads, no copy of k, v
    s = jnp.einsum("bqngd,bknd->bngqk", qg, f(k)).reshape(b, h, seq, seq) * scale
    ahead = position[:, None, :] - position[:, :, None]  # [B, query, key]: key - query
    if causal:
        keys = keys & (ahead <= 0)
    if window_right >= 0:
        keys = keys & (ahead <= window_right)
    if window_left >= 0:
        keys = keys & (ahead >= -window_left)
    s = jnp.where(keys[:, None], s, -1e30)  # masked keys: no weight (a constant: no gradient)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bngqk,bknd->bqngd", p.reshape(b, kv, h // kv, seq, seq), f(v)).reshape(b, seq, h, d)
    out = jnp.where(valid[:, :, None, None], out, 0.0).astype(q.dtype)
    lse = jnp.where(valid[:, None, :], jax.nn.logsumexp(s, axis=-1), 0.0)
    return out, lse
