"""Randomized comparisons of the native ops against their pure-JAX references.

Each case draws its own configuration from a fresh seed (op, shapes off the tile sizes,
batch dims, dtype, density, micro-tile, epilogue, index given or built, jit / grad / vmap /
vmap(grad)), runs it through the kernels and again under `pit_jax.use_reference()` on the
same device, and compares every result. A failure names the seed (PIT_TEST_SEED=<seed>
replays it) and the configuration. The other files check each feature on chosen cases;
these look for the combinations nobody wrote down (a default micro-tile larger than a
small matrix raised until 2026-11-30, found this way).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import PLATFORMS, fresh_rng, run

import pit_jax

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
CASES = 20  # per op and platform

pytestmark = pytest.mark.usefixtures("poison_outputs")


def pick(rng, options):
    return options[int(rng.integers(len(options)))]


def transformed(f, mode, argnums, in_axes):
    """f under one transformation: the forward, the gradient of a squared sum w.r.t.
    `argnums`, the forward-mode tangent along `argnums` (tangents cos(operand)), or the
    forward or gradient vmapped over the first operands' leading axis (in_axes)."""

    def loss(*args):
        return sum(jnp.sum(o.astype(jnp.float32) ** 2) for o in jax.tree_util.tree_leaves(f(*args)))

    def tangent(*args):
        def along(*moved):
            full = list(args)
            for i, a in zip(argnums, moved):
                full[i] = a
            return f(*full)

        primals = tuple(args[i] for i in argnums)
        return jax.jvp(along, primals, tuple(jnp.cos(a) for a in primals))

    fn = {"fwd": f, "vmap": f, "jvp": tangent}.get(mode) or jax.grad(loss, argnums=argnums)
    return jax.vmap(fn, in_axes=in_axes) if mode.startswith("vmap") else fn


def compare(platform, fn, args, dtype, what, tol=None):
    """fn's results on the kernels against `pit_jax.use_reference()`'s on the same device:
    each within tol (default by dtype) of the reference, relative to its largest value, and
    finite (the poisoned outputs show any element a kernel left unwritten as NaN)."""
    out = run(platform, fn, *args)
    with pit_jax.use_reference():
        ref = run(platform, fn, *args)
    tol = tol or (1e-4 if dtype == jnp.float32 else 3e-2)
    outs, refs = jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)
    assert len(outs) == len(refs), f"{what}: {len(outs)} results, the reference {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
        assert o.shape == r.shape, f"{what}: result {i} has shape {o.shape}, the reference {r.shape}"
        assert np.isfinite(o).all() or not np.isfinite(r).all(), (
            f"{what}: result {i} has {int((~np.isfinite(o)).sum())} non-finite elements")
        scale = max(1.0, float(np.abs(r).max())) if r.size else 1.0
        err = float(np.abs(o - r).max()) if r.size else 0.0
        assert np.allclose(o, r, atol=tol * scale, rtol=tol), f"{what}: result {i} differs by {err} (scale {scale})"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", range(CASES))
def test_sparse_dense(platform, case):
    rng, seed = fresh_rng()
    axis = pick(rng, ["m", "k", "w"])
    m, k, n = (pick(rng, [1, 3, 17, 64, 130]) for _ in range(3))
    lead = pick(rng, [(), (2,), (2, 3)])
    dtype = pick(rng, DTYPES)
    density = pick(rng, [0.0, 0.3, 1.0])
    x = rng.standard_normal((*lead, m, k))
    w = rng.standard_normal((k, n)) / np.sqrt(k)
    if axis == "m":
        h = pick(rng, [1, 2, 5])
        live = np.repeat(rng.random((*lead, -(-m // h), 1)) < density, h, -2)[..., :m, :]
        x = x * live
        tile = pick(rng, [None, (min(h, m), None)])
    elif axis == "k":
        x = x * (rng.random(x.shape) < density)
        tile = pick(rng, [None, (min(4, m), 1), (min(3, m), min(5, k))])
    else:
        w = w * (rng.random(w.shape) < density)
        tile = pick(rng, [None, (min(4, k), min(8, n)), (1, min(3, n))])
    bias = rng.standard_normal((n,)) if rng.random() < 0.4 else None
    activation = pick(rng, [None, None, "relu", "gelu", "silu"])
    dead_rows = pick(rng, ["dense", "zeros"]) if axis == "m" else "dense"
    # A given index: built in the jit from the sparse operand (with both groupings off the
    # M axis, which the K and W axes' gradients read).
    given = (axis == "m" or tile is not None) and rng.random() < 0.4
    mode = pick(rng, ["fwd", "grad", "jvp", "vmap", "vmapgrad"] if lead else ["fwd", "grad", "jvp"])
    what = (f"seed={seed}: axis={axis} x={x.shape} w={w.shape} {jnp.dtype(dtype).name} density={density} "
            f"tile={tile} bias={bias is not None} activation={activation} dead_rows={dead_rows} "
            f"index_given={given} {mode}")

    def f(x, w, *b):  # b: the bias, when there is one
        index = None
        if given:
            group_by = None if axis == "m" else "both"
            index = pit_jax.index(w if axis == "w" else x, tile or "row", group_by=group_by)
        return pit_jax.sparse_dense(x, w, index, axis=axis, micro_tile=None if given else tile,
                                    bias=b[0] if b else None, activation=activation, dead_rows=dead_rows)

    args = [jnp.asarray(x, dtype), jnp.asarray(w, dtype)] + ([] if bias is None else [jnp.asarray(bias, dtype)])
    fn = transformed(f, mode, (0, 1), (0, None) + (None,) * (len(args) - 2))
    compare(platform, fn, args, dtype, what)


def moe_ffn_case(rng, ids, e, d, f_dim, dtype, activation, gated):
    """The MoE FFN as a function of (x, gates, w_in, w_out, ids), the index built inside, and
    random operands for expert ids `ids` [..., T, k] over e experts."""
    w_gate = jnp.asarray(rng.standard_normal((e, d, f_dim)) / np.sqrt(d), dtype) if gated else None

    def ffn(x, gates, w_in, w_out, ids):
        index = pit_jax.moe_index(ids, e)
        return pit_jax.moe_ffn(x, gates, index, w_in, w_out, w_gate=w_gate, activation=activation)

    args = [jnp.asarray(rng.standard_normal((*ids.shape[:-1], d)), dtype), jnp.asarray(rng.random(ids.shape), dtype),
            jnp.asarray(rng.standard_normal((e, d, f_dim)) / np.sqrt(d), dtype),
            jnp.asarray(rng.standard_normal((e, f_dim, d)) / np.sqrt(f_dim), dtype), jnp.asarray(ids)]
    return ffn, args


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", range(CASES))
def test_moe_ffn(platform, case):
    rng, seed = fresh_rng()
    t, d, f_dim = pick(rng, [1, 5, 33, 130]), pick(rng, [8, 24, 40]), pick(rng, [8, 16, 72])
    e = pick(rng, [1, 3, 8, 64])
    top = pick(rng, [1, 2, 3]) if e >= 3 else 1
    lead = pick(rng, [(), (2,)])
    dtype = pick(rng, DTYPES)
    activation = pick(rng, ["relu", "gelu", "silu"])
    gated = rng.random() < 0.3
    routing = pick(rng, ["uniform", "one expert", "some out of range"])
    groups = int(np.prod(lead, dtype=np.int64))
    if routing == "one expert":
        ids = np.broadcast_to(np.arange(top, dtype=np.int32), (*lead, t, top)).copy()
    else:
        ids = np.stack([rng.permutation(e)[:top] for _ in range(groups * t)]).reshape(*lead, t, top).astype(np.int32)
        if routing == "some out of range":
            ids.reshape(-1)[::7] = e + 3  # dropped, contributes zero
    mode = pick(rng, ["fwd", "grad", "jvp", "vmap", "vmapgrad"] if lead else ["fwd", "grad", "jvp"])
    what = (f"seed={seed}: T={t} D={d} F={f_dim} E={e} k={top} lead={lead} {jnp.dtype(dtype).name} "
            f"{activation} gated={gated} routing={routing} {mode}")
    ffn, args = moe_ffn_case(rng, ids, e, d, f_dim, dtype, activation, gated)
    argnums = (0, 1) if mode == "vmapgrad" else (0, 1, 2, 3)
    compare(platform, transformed(ffn, mode, argnums, (0, 0, None, None, 0)), args, dtype, what)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", range(CASES))
def test_index_sread_swrite_layer_norm(platform, case):
    rng, seed = fresh_rng()
    rows, cols = pick(rng, [1, 7, 64, 130]), pick(rng, [1, 9, 64, 100])
    lead = pick(rng, [(), (3,)])
    dtype = pick(rng, DTYPES)
    density = pick(rng, [0.0, 0.2, 1.0])
    op = pick(rng, ["sread_swrite", "layer_norm", "layer_norm_grad"])
    tile = (pick(rng, [1, 2, 5, None]), pick(rng, [1, 3, 8, None]))
    tile = tuple(None if t is not None and t > s else t for t, s in zip(tile, (rows, cols)))
    accumulate = bool(rng.random() < 0.5)
    x = rng.standard_normal((*lead, rows, cols)) * (rng.random((*lead, rows, cols)) < density)
    residual = jnp.asarray(rng.standard_normal((*lead, rows, cols)), dtype)
    scale = jnp.asarray(rng.standard_normal((cols,)), jnp.float32)
    offset = jnp.asarray(rng.standard_normal((cols,)), jnp.float32)
    what = (f"seed={seed}: {op} x={x.shape} {jnp.dtype(dtype).name} density={density} tile={tile} "
            f"accumulate={accumulate}")

    if op == "sread_swrite":
        def fn(x):
            index = pit_jax.index(x, tile)
            return pit_jax.swrite(pit_jax.sread(x, index), index, jnp.ones_like(x), accumulate=accumulate)
    else:
        def norm(x, s):
            return pit_jax.layer_norm(x, s, offset, pit_jax.index(x, "row"), residual=residual)

        if op == "layer_norm":
            def fn(x):
                return norm(x, scale)
        else:
            def fn(x):
                return jax.grad(lambda a, s: jnp.sum(norm(a, s).astype(jnp.float32) ** 2), argnums=(0, 1))(x, scale)
    compare(platform, fn, [jnp.asarray(x, dtype)], dtype, what)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", range(CASES))
def test_varlen_attention(platform, case):
    rng, seed = fresh_rng()
    b, s, h = pick(rng, [1, 3]), pick(rng, [1, 7, 64, 128, 130, 300]), pick(rng, [1, 4])
    kv = pick(rng, [h, h, 2, 1]) if h == 4 else h  # grouped-query: kv heads dividing q's
    d = pick(rng, [64, 64, 80, 96, 128, 32])  # the kernels' head dims, and one that takes XLA's path
    dtype = pick(rng, DTYPES)
    lengths = rng.integers(0, s + 1, size=(b,)).astype(np.int32)
    lengths[rng.integers(b)] = pick(rng, [0, s, int(lengths[0])])  # empty and full sequences
    mode = pick(rng, ["fwd", "grad", "jvp", "vmap", "vmapgrad"])
    causal, padding = bool(rng.integers(2)), pick(rng, ["right", "left"])
    what = (f"seed={seed}: B={b} S={s} H={h} kv_heads={kv} D={d} {jnp.dtype(dtype).name} "
            f"lengths={lengths.tolist()} {mode} causal={causal} padding={padding}")
    shape = (2, b, s, h, d) if mode.startswith("vmap") else (b, s, h, d)
    q = jnp.asarray(rng.standard_normal(shape), dtype)
    k, v = (jnp.asarray(rng.standard_normal(shape[:-2] + (kv, d)), dtype) for _ in range(2))
    lens = jnp.asarray(np.broadcast_to(lengths, shape[:-3]).copy())
    attend = functools.partial(pit_jax.varlen_attention, causal=causal, padding=padding)
    fn = transformed(attend, mode, (0, 1, 2), (0, 0, 0, 0))
    compare(platform, fn, [q, k, v, lens], dtype, what)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", range(CASES))
def test_block_pruning(platform, case):
    """block_topk -> mask_blocks -> index_from_tiles -> sparse_dense on the W axis, as a
    pruned training step chains them, with its gradient."""
    rng, seed = fresh_rng()
    n_mats = pick(rng, [1, 3])
    k, n = pick(rng, [1, 17, 64, 100]), pick(rng, [1, 9, 64, 130])
    tile = (min(pick(rng, [1, 4, 32]), k), min(pick(rng, [1, 8, 64]), n))
    density = pick(rng, [0.02, 0.3, 0.5, 1.0])
    dtype = pick(rng, DTYPES)
    m = pick(rng, [1, 5, 40])
    mode = pick(rng, ["fwd", "grad", "jvp"])
    what = (f"seed={seed}: {n_mats} x ({k}, {n}) tile={tile} density={density} x=({m}, {k}) "
            f"{jnp.dtype(dtype).name} {mode}")
    mats = [jnp.asarray(rng.standard_normal((k, n)), jnp.float32) for _ in range(n_mats)]
    x = jnp.asarray(rng.standard_normal((m, k)), dtype)

    def step(x, *mats):
        top = pit_jax.block_topk(list(mats), tile, density)
        masked = pit_jax.mask_blocks(list(mats), top.live, tile, dtype)
        out = []
        for i, w in enumerate(masked):
            index = pit_jax.index_from_tiles(top.live[i], tile, (k, n), group_by="both")
            out.append(pit_jax.sparse_dense(x, w, index, axis="w"))
        return out

    compare(platform, transformed(step, mode, tuple(range(1 + n_mats)), None), [x, *mats], dtype, what)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", range(CASES))
def test_flax_layers(platform, case):
    """pit_jax.flax.SparseDense and MoE (linen): outputs and parameter gradients."""
    from pit_jax.flax import MoE, SparseDense

    rng, seed = fresh_rng()
    lead = pick(rng, [(5,), (2, 7), (3, 33)])
    d = pick(rng, [8, 24, 40])
    dtype = pick(rng, [None, jnp.bfloat16])
    x = rng.standard_normal((*lead, d)) * (rng.random((*lead, 1)) < 0.6)  # dead token rows
    layer_kind = pick(rng, ["dense", "moe"])
    batch_dims = pick(rng, [0, len(lead) - 1])
    if layer_kind == "dense":
        axis = pick(rng, ["m", "k", "w"])
        layer = SparseDense(pick(rng, [4, 24, 72]), use_bias=bool(rng.random() < 0.7), dtype=dtype, axis=axis,
                            activation=pick(rng, [None, "relu", "gelu"]),
                            batch_dims=batch_dims if axis != "w" else 0,
                            dead_rows=pick(rng, ["dense", "zeros"]) if axis == "m" else "dense")
    else:
        layer = MoE(num_experts=pick(rng, [1, 4, 8]), hidden_dim=pick(rng, [8, 32]), top_k=1, dtype=dtype,
                    gated=bool(rng.random() < 0.3), batch_dims=batch_dims)
        if layer.num_experts >= 2 and rng.random() < 0.5:
            layer = layer.clone(top_k=2)
    what = f"seed={seed}: {layer} x={x.shape}"
    xj = jnp.asarray(x, jnp.float32)
    params = layer.init(jax.random.PRNGKey(int(rng.integers(2**31))), xj)

    def loss(p, x):
        y = layer.apply(p, x)
        return jnp.sum(y.astype(jnp.float32) ** 2), y

    def fn(p, x):
        (value, y), grads = jax.value_and_grad(loss, has_aux=True)(p, x)
        return value, y, grads

    compare(platform, fn, [params, xj], jnp.float32 if dtype is None else dtype, what)


# Kernel sizes: the Hopper kernels' routes (row gather with its packed operands, split-K,
# the stile and grouped kernels) start where the shapes above end, so the GPU draws its
# own cases there: rows past several tiles and off their multiples, K and N pairs on both
# sides of the packing gate (K * N >= 2048^2), shared weights over a batch.
KERNEL_CASES = int(os.environ.get("PIT_KERNEL_CASES", "6"))
KN_PAIRS = [(64, 72), (520, 264), (1024, 1024), (2048, 2048), (2056, 2304), (4096, 1032), (1032, 4104)]
GPU_ONLY = [p for p in PLATFORMS if p == "gpu"] or [pytest.param("gpu", marks=pytest.mark.skip(reason="no GPU"))]


def kernel_tol(dtype):
    # float32 products may run as TF32 on either side (XLA's default precision on a GPU).
    return 2e-2 if dtype == jnp.float32 else 3e-2


@pytest.mark.parametrize("platform", GPU_ONLY)
@pytest.mark.parametrize("case", range(KERNEL_CASES))
def test_sparse_dense_kernel_sizes(platform, case):
    rng, seed = fresh_rng()
    axis = pick(rng, ["m", "m", "k", "w"])
    m = pick(rng, [257, 1000, 2500, 4100])
    k, n = pick(rng, KN_PAIRS)
    lead = pick(rng, [(), (), (2,)])
    dtype = pick(rng, [jnp.bfloat16, jnp.bfloat16, jnp.float16, jnp.float32])
    density = pick(rng, [0.0, 0.1, 0.5, 1.0])
    x = rng.standard_normal((*lead, m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    if axis == "m":
        h = pick(rng, [1, 1, 2, 4])
        live = np.repeat(rng.random((*lead, -(-m // h), 1)) < density, h, -2)[..., :m, :]
        x = x * live
        tile = pick(rng, [None, (h, None)])
    elif axis == "k":
        tile = pick(rng, [(32, 1), (16, 1), (32, 8)])
        keep = rng.random((*lead, -(-m // tile[0]), -(-k // tile[1]))) < density
        x = x * np.repeat(np.repeat(keep, tile[0], -2), tile[1], -1)[..., :m, :k]
    else:
        tile = pick(rng, [(32, 64), (1, 64), (32, 32)])
        keep = rng.random((-(-k // tile[0]), -(-n // tile[1]))) < density
        w = w * np.repeat(np.repeat(keep, tile[0], 0), tile[1], 1)[:k, :n]
    bias = rng.standard_normal((n,)) if rng.random() < 0.4 else None
    activation = pick(rng, [None, None, "relu", "gelu"]) if axis == "m" else None
    dead_rows = pick(rng, ["dense", "zeros"]) if axis == "m" else "dense"
    parts = pick(rng, [1, 1, 3]) if axis == "m" and n % 3 == 0 else 1
    mode = pick(rng, ["fwd", "grad", "grad_x", "grad_w", "jvp"] + (["vmap", "vmapgrad"] if lead else []))
    what = (f"seed={seed}: axis={axis} x={x.shape} w={w.shape} {jnp.dtype(dtype).name} density={density} "
            f"tile={tile} bias={bias is not None} activation={activation} dead_rows={dead_rows} "
            f"out_parts={parts} {mode}")

    def f(x, w, *b):
        return pit_jax.sparse_dense(x, w, axis=axis, micro_tile=tile, bias=b[0] if b else None,
                                    activation=activation, dead_rows=dead_rows, out_parts=parts)

    args = [jnp.asarray(x, dtype), jnp.asarray(w, dtype)] + ([] if bias is None else [jnp.asarray(bias, dtype)])
    argnums = {"grad_x": (0,), "grad_w": (1,)}.get(mode, (0, 1))
    fn = transformed(f, mode.replace("_x", "").replace("_w", ""), argnums, (0, None) + (None,) * (len(args) - 2))
    compare(platform, fn, args, dtype, what, kernel_tol(dtype))


@pytest.mark.parametrize("platform", GPU_ONLY)
@pytest.mark.parametrize("case", range(KERNEL_CASES))
def test_moe_ffn_kernel_sizes(platform, case):
    rng, seed = fresh_rng()
    t = pick(rng, [1000, 4100])
    d, f_dim = pick(rng, [(256, 512), (768, 3072), (1032, 520)])
    e = pick(rng, [8, 64, 256])
    top = pick(rng, [1, 2])
    dtype = pick(rng, [jnp.bfloat16, jnp.float16])
    activation = pick(rng, ["relu", "gelu", "silu"])
    gated = rng.random() < 0.3
    routing = pick(rng, ["uniform", "zipf", "one expert"])
    if routing == "one expert":
        ids = np.broadcast_to(np.arange(top, dtype=np.int32), (t, top)).copy()
    else:
        p = 1.0 / np.arange(1, e + 1) if routing == "zipf" else np.ones(e)
        ids = np.stack([rng.choice(e, top, replace=False, p=p / p.sum()) for _ in range(t)]).astype(np.int32)
    mode = pick(rng, ["fwd", "grad", "jvp"])
    what = (f"seed={seed}: T={t} D={d} F={f_dim} E={e} k={top} {jnp.dtype(dtype).name} {activation} "
            f"gated={gated} routing={routing} {mode}")
    ffn, args = moe_ffn_case(rng, ids, e, d, f_dim, dtype, activation, gated)
    compare(platform, transformed(ffn, mode, (0, 1, 2, 3), None), args, dtype, what, kernel_tol(dtype))
