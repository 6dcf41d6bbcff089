"""pit_jax's MoE ops (moe_index, grouped_matmul, moe_ffn) against pure-JAX references.

Routing index: every assignment in exactly one group, any order, out-of-range ids in the
dropped group. moe_ffn: values and gradients (x, gates, every weight) against
`pit_jax.reference.moe_ffn` (a loop over experts with masks, float32 HIGHEST), top-1 /
top-2, 1 / 8 / 64 / 256 experts, empty experts, all tokens on one expert, uneven T,
float32 / bfloat16 / float16, vmap and vmap(grad), a jitted training step. Native
outputs are poisoned (NaN) before each kernel. Fresh random data every run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads
from pit_testing import BILINEAR_FD_STEP, PLATFORMS, child_env, fresh_rng, put, requires_gpu

import pit_jax
from pit_jax.primitives.grouped_matmul import grouped_matmul as grouped_matmul_p
from pit_jax.primitives.grouped_wgrad import grouped_wgrad as grouped_wgrad_p

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
TOL = {jnp.float32: 3e-5, jnp.bfloat16: 3e-2, jnp.float16: 5e-3}


# NaN-poison native outputs for the whole module (fixture in conftest.py).
pytestmark = pytest.mark.usefixtures("poison_outputs")


def rel_err(got, want):
    got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
    want = np.asarray(jnp.asarray(want, jnp.float32), np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert not np.isnan(got).any(), "NaN in the output: an element was not written"
    return np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)


def routing(rng, t, k, e, pattern="uniform", batch=()):
    """Expert ids [*batch, t, k]: distinct experts per token."""
    if pattern == "one":  # every token on expert e-1 (and the next ones for k > 1)
        ids = np.broadcast_to((e - 1 - np.arange(k)) % e, (*batch, t, k))
    elif pattern == "skewed":  # Zipf-like shares, experts past e // 2 left empty
        p = 1.0 / np.arange(1, e + 1)
        p[max(e // 2, k):] = 0
        p /= p.sum()
        ids = np.stack([rng.choice(e, size=k, replace=False, p=p) for _ in range(int(np.prod(batch)) * t)])
    else:
        ids = np.stack([rng.choice(e, size=k, replace=False) for _ in range(int(np.prod(batch)) * t)])
    return np.asarray(ids, np.int32).reshape(*batch, t, k)


def make(rng, t, d, f, e, k, dtype, pattern="uniform", batch=(), gated=False):
    ids = routing(rng, t, k, e, pattern, batch)
    x = rng.standard_normal((*batch, t, d)).astype(np.float32)
    gates = rng.random((*batch, t, k)).astype(np.float32) + 0.1
    w_in = (rng.standard_normal((e, d, f)) / np.sqrt(d)).astype(np.float32)
    w_out = (rng.standard_normal((e, f, d)) / np.sqrt(f)).astype(np.float32)
    w_gate = (rng.standard_normal((e, d, f)) / np.sqrt(d)).astype(np.float32) if gated else None
    cast = lambda a: None if a is None else jnp.asarray(a, dtype)  # noqa: E731
    return ids, cast(x), jnp.asarray(gates), cast(w_in), cast(w_out), cast(w_gate)


# -- routing index ----------------------------------------------------------------------


def check_index(idx: pit_jax.MoeIndex, ids: np.ndarray, e: int):
    lists, counts = np.asarray(idx.lists), np.asarray(idx.counts)
    ids = np.asarray(ids)
    flat_ids = ids.reshape(-1, ids.shape[-2] * ids.shape[-1])
    lists = lists.reshape(-1, e + 1, flat_ids.shape[-1])
    counts = counts.reshape(-1, e + 1)
    for b in range(flat_ids.shape[0]):
        group = np.where((flat_ids[b] >= 0) & (flat_ids[b] < e), flat_ids[b], e)
        for g in range(e + 1):
            want = np.flatnonzero(group == g)
            n = counts[b, g]
            assert n == len(want), f"group {g}: count {n} != {len(want)}"
            np.testing.assert_array_equal(np.sort(lists[b, g, :n]), want, err_msg=f"group {g}")
            assert (lists[b, g, n:] == -1).all(), f"group {g}: tail not -1"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("t,k,e,pattern", [
    (37, 1, 1, "uniform"), (100, 2, 8, "uniform"), (64, 2, 8, "one"), (513, 1, 64, "skewed"),
    (300, 2, 256, "uniform"), (33, 8, 8, "uniform"), (1, 1, 4, "uniform"), (2000, 1, 8, "one"),
])
def test_moe_index(platform, t, k, e, pattern):
    rng, seed = fresh_rng()
    ids = put(platform, jnp.asarray(routing(rng, t, k, e, pattern)))
    idx = jax.jit(pit_jax.moe_index, static_argnums=1)(ids, e)
    check_index(idx, ids, e)
    assert int(idx.dropped()) == 0
    assert idx.expert_counts().shape == (e,)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_moe_index_out_of_range_ids_are_dropped_and_counted(platform):
    rng, _ = fresh_rng()
    ids = routing(rng, 50, 2, 8)
    ids[3, 0], ids[7, 1], ids[9, 0] = 8, -1, 1000
    idx = jax.jit(pit_jax.moe_index, static_argnums=1)(put(platform, jnp.asarray(ids)), 8)
    check_index(idx, ids, 8)
    assert int(idx.dropped()) == 3
    # A dropped assignment contributes zero to the layer.
    _, x, gates, w_in, w_out, _ = make(rng, 50, 8, 12, 8, 2, jnp.float32)
    x, gates, w_in, w_out = put(platform, x, gates, w_in, w_out)
    y = jax.jit(pit_jax.moe_ffn)(x, gates, idx, w_in, w_out)
    want = pit_jax.reference.moe_ffn(x, gates, ids, w_in, w_out)
    assert rel_err(y, want) < TOL[jnp.float32]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_moe_index_batched_and_vmapped(platform):
    rng, _ = fresh_rng()
    ids = jnp.asarray(routing(rng, 40, 2, 8, batch=(3, 2)))
    ids = put(platform, ids)
    check_index(jax.jit(pit_jax.moe_index, static_argnums=1)(ids, 8), ids, 8)
    vm = jax.jit(jax.vmap(jax.vmap(lambda i: pit_jax.moe_index(i, 8))))(ids)
    check_index(vm, ids, 8)
    top1 = pit_jax.moe_index(ids[0, 0, :, 0], 8)  # [T] ids: top-1
    assert top1.top_k == 1 and top1.num_tokens == 40


# -- moe_ffn: values ----------------------------------------------------------------------


FFN_CASES = [  # t, d, f, e, k, pattern
    (37, 16, 24, 1, 1, "uniform"),
    (70, 32, 40, 8, 1, "skewed"),
    (70, 32, 40, 8, 2, "uniform"),
    (45, 24, 16, 8, 2, "one"),
    (130, 16, 24, 64, 2, "skewed"),
    (96, 16, 8, 256, 1, "uniform"),
]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("case", FFN_CASES, ids=lambda c: "t{}_d{}_f{}_e{}_k{}_{}".format(*c))
def test_moe_ffn_matches_reference(platform, dtype, case):
    t, d, f, e, k, pattern = case
    rng, seed = fresh_rng()
    ids, x, gates, w_in, w_out, _ = make(rng, t, d, f, e, k, dtype, pattern)
    ids, x, gates, w_in, w_out = put(platform, jnp.asarray(ids), x, gates, w_in, w_out)

    @jax.jit
    def layer(x, gates, ids, w_in, w_out):
        return pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, e), w_in, w_out)

    y = layer(x, gates, ids, w_in, w_out)
    assert y.dtype == dtype and y.shape == x.shape
    want = pit_jax.reference.moe_ffn(x, gates, ids, w_in, w_out)
    assert rel_err(y, want) < TOL[dtype], f"seed {seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("t,d,f", [(53, 16, 24), (700, 136, 264)], ids=["small", "large_tiles"])
def test_moe_ffn_fused_relu_keeps_nan(platform, t, d, f):
    """A NaN in one token stays NaN through the ReLU fused into the first product, as
    through jax.nn.relu (the device's fmaxf used to turn it into 0); other tokens are exact."""
    rng, seed = fresh_rng()
    ids, x, gates, w_in, w_out, _ = make(rng, t, d, f, 8, 2, jnp.bfloat16)
    bad = int(rng.integers(t))
    x = x.at[bad, int(rng.integers(d))].set(jnp.nan)
    args = put(platform, jnp.asarray(ids), x, gates, w_in, w_out)
    y = jax.jit(lambda ids, x, g, wi, wo: pit_jax.moe_ffn(x, g, pit_jax.moe_index(ids, 8), wi, wo))(*args)
    y = np.asarray(jnp.asarray(y, jnp.float32))
    assert np.isnan(y[bad]).all(), f"seed {seed}: token {bad} lost its NaN"
    keep = np.arange(t) != bad
    want = pit_jax.reference.moe_ffn(*[jax.device_get(a) for a in (x, gates, jnp.asarray(ids), w_in, w_out)])
    assert rel_err(y[keep], np.asarray(want, np.float32)[keep]) < TOL[jnp.bfloat16], f"seed {seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("activation", ["gelu", "silu", jnp.tanh])
def test_moe_ffn_gated_and_activations(platform, activation):
    rng, seed = fresh_rng()
    ids, x, gates, w_in, w_out, w_gate = make(rng, 53, 16, 24, 8, 2, jnp.float32, gated=True)
    ids, x, gates, w_in, w_out, w_gate = put(platform, jnp.asarray(ids), x, gates, w_in, w_out, w_gate)
    idx = pit_jax.moe_index(ids, 8)
    for wg in (None, w_gate):
        y = jax.jit(lambda *a: pit_jax.moe_ffn(*a, w_gate=wg, activation=activation))(x, gates, idx, w_in, w_out)
        want = pit_jax.reference.moe_ffn(x, gates, ids, w_in, w_out, w_gate=wg, activation=activation)
        assert rel_err(y, want) < TOL[jnp.float32], f"seed {seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_grouped_matmul_rows_and_batched_weights(platform):
    rng, seed = fresh_rng()
    e, k, t, d, f = 8, 2, 29, 16, 24
    ids = jnp.asarray(routing(rng, t, k, e, batch=(3,)))
    x = jnp.asarray(rng.standard_normal((3, t, d)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, e, d, f)), jnp.float32)
    ids, x, w = put(platform, ids, x, w)
    idx = pit_jax.moe_index(ids, e)
    y = jax.jit(pit_jax.grouped_matmul)(x, w, idx)
    assert y.shape == (3, t * k, f)
    groups = np.asarray(ids).reshape(3, t * k)
    rows = np.repeat(np.asarray(x, np.float64), k, axis=1)
    want = np.einsum("bad,badf->baf", rows, np.asarray(w, np.float64)[np.arange(3)[:, None], groups])
    assert rel_err(y, want) < TOL[jnp.float32], f"seed {seed}"
    # Rows already in assignment order.
    h = jnp.asarray(rng.standard_normal((3, t * k, d)), jnp.float32)
    y2 = jax.jit(lambda h, w, i: pit_jax.grouped_matmul(h, w, i, rows="assignments"))(put(platform, h), w, idx)
    want2 = np.einsum("bad,badf->baf", np.asarray(h, np.float64), np.asarray(w, np.float64)[np.arange(3)[:, None], groups])
    assert rel_err(y2, want2) < TOL[jnp.float32], f"seed {seed}"


# -- moe_ffn: gradients -------------------------------------------------------------------


def _loss_fns(ids, e, ct, w_gate_used, activation="relu"):
    def native(x, gates, w_in, w_out, w_gate):
        idx = pit_jax.moe_index(ids, e)
        y = pit_jax.moe_ffn(x, gates, idx, w_in, w_out, w_gate=w_gate if w_gate_used else None, activation=activation)
        return jnp.sum(y.astype(jnp.float32) * ct)

    def ref(x, gates, w_in, w_out, w_gate):
        y = pit_jax.reference.moe_ffn(x, gates, ids, w_in, w_out, w_gate=w_gate if w_gate_used else None,
                                      activation=activation)
        return jnp.sum(y.astype(jnp.float32) * ct)

    return native, ref


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("case", [(61, 16, 24, 8, 2, "skewed", True), (40, 16, 8, 64, 1, "uniform", False),
                                  (33, 8, 16, 4, 2, "one", False)], ids=lambda c: f"e{c[3]}_k{c[4]}_{c[5]}")
def test_moe_ffn_gradients(platform, dtype, case):
    t, d, f, e, k, pattern, gated = case
    rng, seed = fresh_rng()
    ids, x, gates, w_in, w_out, w_gate = make(rng, t, d, f, e, k, dtype, pattern, gated=True)
    ct = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)
    ids, x, gates, w_in, w_out, w_gate, ct = put(platform, jnp.asarray(ids), x, gates, w_in, w_out, w_gate, ct)
    act = "silu" if gated else "relu"
    native, _ = _loss_fns(ids, e, ct, gated, activation=act)
    args = (x, gates, w_in, w_out, w_gate)
    got = jax.jit(jax.grad(native, argnums=(0, 1, 2, 3, 4)))(*args)
    # The reference on the host (see test_moe_flax: XLA's GPU dot once moved a relu unit
    # across the kink and flipped its gradient).
    _, ref = _loss_fns(put("cpu", ids), e, put("cpu", ct), gated, activation=act)
    want = jax.grad(ref, argnums=(0, 1, 2, 3, 4))(*put("cpu", *args))
    names = ("x", "gates", "w_in", "w_out", "w_gate")
    for name, g, w in zip(names, got, want):
        if not gated and name == "w_gate":
            continue
        assert g.dtype == w.dtype, name
        assert rel_err(g, w) < 2 * TOL[dtype], f"d {name}, seed {seed}"


def _primitive_fns(platform, rng):
    e, k, t, d, f = 4, 2, 7, 5, 6
    ids = jnp.asarray(routing(rng, t, k, e))
    idx = pit_jax.moe_index(put(platform, ids), e)
    arrays = dict(
        x=rng.standard_normal((t, d)), w=rng.standard_normal((e, d, f)),
        dy=rng.standard_normal((t * k, f)), wt=rng.standard_normal((e, f, d)),
    )
    arrays = {n: put(platform, jnp.asarray(a, jnp.float32)) for n, a in arrays.items()}
    fns = {
        "matmul": (lambda x, w: grouped_matmul_p(x, w, idx.lists, idx.counts, row_div=k), ("x", "w")),
        "matmul_trans_w": (lambda x, w: grouped_matmul_p(x, w, idx.lists, idx.counts, row_div=k, trans_w=True),
                           ("x", "wt")),
        "wgrad": (lambda x, dy: grouped_wgrad_p(x, dy, idx.lists, idx.counts, row_div=k, out_batch=0), ("x", "dy")),
        # ReLU in the epilogue: not bilinear, so no finite differences across its kink below.
        "matmul_relu": (lambda x, w: grouped_matmul_p(x, w, idx.lists, idx.counts, row_div=k, relu=True), ("x", "w")),
    }
    return fns, arrays


def test_grouped_primitives_check_grads():
    # Finite differences in float32 on the host (exact FFMA kernels); the GPU kernels are
    # checked against these same rules below.
    rng, seed = fresh_rng()
    fns, arrays = _primitive_fns("cpu", rng)
    for name, (fn, args) in fns.items():
        if name == "matmul_relu":
            continue  # test_grouped_matmul_relu_rules
        order = 1 if name == "matmul_trans_w" else 2
        check_grads(fn, tuple(arrays[a] for a in args), order=order, modes=("fwd", "rev"), atol=1e-2, rtol=1e-2,
                    eps=BILINEAR_FD_STEP)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_grouped_matmul_relu_rules(platform):
    """relu=True (the epilogue) under jvp, grad, vmap and vmap(grad) equals jax.nn.relu of the
    plain product differentiated by JAX; its JVP keeps the fused forward (no extra product)."""
    rng, seed = fresh_rng()
    fns, arrays = _primitive_fns(platform, rng)
    fused, _ = fns["matmul_relu"]
    plain = lambda x, w: jax.nn.relu(fns["matmul"][0](x, w))  # noqa: E731
    x, w = arrays["x"], arrays["w"]
    tx, tw = jnp.cos(x), jnp.sin(w)
    y, jv = jax.jit(lambda *a: jax.jvp(fused, a[:2], a[2:]))(x, w, tx, tw)
    y_ref, jv_ref = jax.jvp(plain, (x, w), (tx, tw))
    assert float(jnp.mean(y_ref == 0)) > 0.2, "the case must clamp some outputs"
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-6, err_msg=f"seed {seed}")
    np.testing.assert_allclose(jv, jv_ref, rtol=1e-5, atol=1e-5, err_msg=f"seed {seed}")
    loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))  # noqa: E731
    for g, g_ref in zip(jax.jit(jax.grad(loss(fused), (0, 1)))(x, w), jax.grad(loss(plain), (0, 1))(x, w)):
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5, err_msg=f"seed {seed}")
    xs = jnp.stack([x, -x, 2 * x])
    vg = jax.jit(jax.vmap(jax.grad(loss(fused), (0, 1)), in_axes=(0, None)))(xs, w)
    vg_ref = jax.vmap(jax.grad(loss(plain), (0, 1)), in_axes=(0, None))(xs, w)
    for g, g_ref in zip(vg, vg_ref):
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5, err_msg=f"seed {seed}: vmap(grad)")
    hlo = jax.jit(jax.grad(loss(fused), (0, 1))).lower(x, w).as_text()
    assert hlo.count("@pit_grouped_matmul(") == 2, "forward (fused) + d x; no plain copy of the forward"


@requires_gpu
def test_grouped_primitives_jvp_vjp_gpu_equal_cpu():
    rng, seed = fresh_rng()
    state = rng.bit_generator.state
    out = {}
    for platform in ("cpu", "gpu"):
        rng.bit_generator.state = state  # the same routing and data on both
        fns, arrays = _primitive_fns(platform, rng)
        res = {}
        for name, (fn, args) in fns.items():
            primals = tuple(arrays[a] for a in args)
            tangents = tuple(jnp.ones_like(p) * 0.5 + p for p in primals)
            y, jv = jax.jvp(fn, primals, tangents)
            y2, vjp = jax.vjp(fn, *primals)
            res[name] = [y, jv, *vjp(jnp.sin(y2))]
            res[name + "_hess"] = list(jax.grad(lambda *p: jnp.sum(fn(*p) ** 2), argnums=(0, 1))(*primals))
        out[platform] = res
    for name in out["cpu"]:
        for a, b in zip(out["cpu"][name], out["gpu"][name]):
            assert rel_err(b, a) < 1e-5, f"{name}, seed {seed}"


@requires_gpu
def test_grouped_gemm_with_lagging_warps_gpu():
    """The sm_90a grouped GEMM under its stress switch: warps 1-3 of the second consumer
    warpgroup sleep before each tile whose rows they do not hold (here every tile: ~16
    tokens per expert), so warp 0 runs ahead. With one B-stage release per warpgroup this
    hung at once (a training loop hit it every few hundred steps); it must finish and
    agree with the reference. In a subprocess: a hang fails the test, not the suite."""
    from pit_jax.primitives import _lowering

    if not _lowering.cuda_is_sm90():  # elsewhere (or PIT_JAX_HOPPER=0) the switch has no kernel to slow
        pytest.skip("the stress switch is the sm_90a grouped GEMM's")
    _, seed = fresh_rng()
    script = textwrap.dedent(
        f"""
        import jax, jax.numpy as jnp, numpy as np
        import pit_jax
        pit_jax._native._cuda.set_grouped_gemm_lag(True)
        rng = np.random.default_rng({seed})
        t, d, f, e = 1024, 768, 512, 64
        ids = jnp.asarray(rng.integers(0, e, (t, 1)), jnp.int32)
        bf = lambda *s: jnp.asarray(rng.standard_normal(s) / np.sqrt(s[-2] if len(s) > 2 else 1), jnp.bfloat16)
        x, w_in, w_out = bf(t, d), bf(e, d, f), bf(e, f, d)
        gates = jnp.asarray(rng.uniform(0.5, 1.0, (t, 1)), jnp.bfloat16)
        def loss(ffn):
            return lambda x, w_in, w_out: jnp.sum(jnp.sin(ffn(x, w_in, w_out).astype(jnp.float32)))
        pit = lambda x, w_in, w_out: pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, e), w_in, w_out)
        ref = lambda x, w_in, w_out: pit_jax.reference.moe_ffn(x, gates, ids, w_in, w_out)
        f32 = lambda a: a.astype(jnp.float32)
        outs = jax.jit(jax.value_and_grad(loss(pit), (0, 1, 2)))(x, w_in, w_out)
        refs = jax.jit(jax.value_and_grad(loss(ref), (0, 1, 2)))(f32(x), f32(w_in), f32(w_out))
        err = max(float(jnp.linalg.norm(f32(a) - f32(b)) / (jnp.linalg.norm(f32(b)) + 1e-30))
                  for a, b in zip(jax.tree_util.tree_leaves(outs), jax.tree_util.tree_leaves(refs)))
        print("ERR", err)
        """
    )
    try:
        out = subprocess.run([sys.executable, "-c", script], env=child_env(), capture_output=True, text=True, timeout=240,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(pit_jax.__file__))))
    except subprocess.TimeoutExpired:
        pytest.fail(f"seed {seed}: the grouped GEMM with lagging warps did not finish in 240 s (a hang)")
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"ERR (\S+)", out.stdout)
    assert m, out.stdout + out.stderr[-2000:]
    assert float(m.group(1)) < 2e-2, f"seed {seed}: relative error {m.group(1)}"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_backward_reuses_the_index_and_gathers_weight_gradients(platform):
    rng, _ = fresh_rng()
    ids, x, gates, w_in, w_out, _ = make(rng, 32, 16, 24, 8, 2, jnp.float32)
    ids, x, gates, w_in, w_out = put(platform, jnp.asarray(ids), x, gates, w_in, w_out)

    def loss(x, gates, w_in, w_out):
        return pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, 8), w_in, w_out).sum()

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(x, gates, w_in, w_out).as_text()
    assert hlo.count("@pit_moe_index(") == 1, "the backward must reuse the forward's routing index"
    assert hlo.count("@pit_grouped_wgrad(") == 2  # one per weight, over routed tokens only
    assert hlo.count("@pit_grouped_matmul(") == 4  # 2 forward, d hidden and d x (d gates reuses the output)


# -- transformations ----------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
def test_vmap_and_vmap_grad_over_token_groups(platform):
    rng, seed = fresh_rng()
    b, t, d, f, e, k = 3, 21, 16, 8, 8, 2
    ids, x, gates, w_in, w_out, _ = make(rng, t, d, f, e, k, jnp.float32, batch=(b,))
    ids, x, gates, w_in, w_out = put(platform, jnp.asarray(ids), x, gates, w_in, w_out)

    def layer(x, gates, ids, w_in, w_out):
        return pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, e), w_in, w_out)

    y = jax.jit(jax.vmap(layer, in_axes=(0, 0, 0, None, None)))(x, gates, ids, w_in, w_out)
    for i in range(b):
        want = pit_jax.reference.moe_ffn(x[i], gates[i], ids[i], w_in, w_out)
        assert rel_err(y[i], want) < TOL[jnp.float32], f"seed {seed}"
    # Batch dims without vmap give the same.
    y2 = jax.jit(layer)(x, gates, ids, w_in, w_out)
    assert rel_err(y2, y) < 1e-6

    def loss(x, gates, ids, w_in, w_out):
        return jnp.sum(jnp.sin(layer(x, gates, ids, w_in, w_out)))

    def ref_loss(x, gates, ids, w_in, w_out):
        return jnp.sum(jnp.sin(pit_jax.reference.moe_ffn(x, gates, ids, w_in, w_out)))

    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 3, 4)), in_axes=(0, 0, 0, None, None)))(
        x, gates, ids, w_in, w_out)
    for i in range(b):
        want = jax.grad(ref_loss, argnums=(0, 1, 3, 4))(x[i], gates[i], ids[i], w_in, w_out)
        for g, w in zip(grads, want):
            assert rel_err(g[i], w) < 5 * TOL[jnp.float32], f"seed {seed}"
    # The gradient of shared weights sums over the groups (batch reduction in the wgrad).
    gw = jax.jit(jax.grad(lambda w: loss(x, gates, ids, w, w_out)))(w_in)
    want = jax.grad(lambda w: sum(ref_loss(x[i], gates[i], ids[i], w, w_out) for i in range(b)))(w_in)
    assert rel_err(gw, want) < 5 * TOL[jnp.float32], f"seed {seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_token_groups_sharing_experts_run_as_one_group(platform, dtype):
    """Groups [2, 3] of tokens with shared experts: the lowering folds them into one index
    over all 6 * T tokens (each product and weight gradient one custom call on [E+1, 6 T k]
    lists), with groups of every kind: uniform, every token on one expert, some ids out of
    range (dropped), and all ids out of range (an empty group). Values and gradients against
    the per-group reference; batched weights are not folded."""
    rng, seed = fresh_rng()
    lead, t, d, f, e, k = (2, 3), 19, 16, 24, 8, 2
    ids, x, gates, w_in, w_out, _ = make(rng, t, d, f, e, k, dtype, batch=lead)
    ids = ids.reshape(6, t, k).copy()
    ids[1] = routing(rng, t, k, e, "one")
    ids[2, ::3, 0] = e + 5  # dropped: counted in group E, contributes 0
    ids[3] = -1  # a group with nothing routed
    ids = jnp.asarray(ids.reshape(*lead, t, k))
    ct = jnp.asarray(rng.standard_normal((*lead, t, d)), jnp.float32)
    ids, x, gates, w_in, w_out, ct = put(platform, ids, x, gates, w_in, w_out, ct)

    def loss(x, gates, w_in, w_out):
        y = pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, e), w_in, w_out, activation="gelu")
        return jnp.sum(y.astype(jnp.float32) * ct)

    def ref_loss(x, gates, w_in, w_out):
        y = pit_jax.reference.moe_ffn(x, gates, ids, w_in, w_out, activation="gelu")
        return jnp.sum(y.astype(jnp.float32) * ct)

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
    hlo = fn.lower(x, gates, w_in, w_out).as_text()
    folded = rf"tensor<{e + 1}x{6 * t * k}xi32>"
    assert len(re.findall(r"@pit_grouped_(?:matmul|wgrad)\(", hlo)) == 6
    assert all(folded in line for line in hlo.splitlines() if re.search(r"@pit_grouped_(?:matmul|wgrad)\(", line))
    v, grads = fn(x, gates, w_in, w_out)
    v_ref, refs = jax.value_and_grad(ref_loss, argnums=(0, 1, 2, 3))(x, gates, w_in, w_out)
    # The loss sums ~1800 terms of both signs, so it can land near zero, and a check relative
    # to it failed once on the H200 (2026-11-29): bound its error by the terms' sizes instead.
    scale = float(jnp.sum(jnp.abs(pit_jax.reference.moe_ffn(x, gates, ids, w_in, w_out, activation="gelu")
                                  .astype(jnp.float32) * ct)))
    assert abs(float(v) - float(v_ref)) < 2 * TOL[dtype] * scale, f"seed {seed}"
    for name, g, want in zip(("x", "gates", "w_in", "w_out"), grads, refs):
        assert rel_err(g, want) < 5 * TOL[dtype], f"{name}: seed {seed}"
    # Weights with the groups' batch dims: one product per group (nothing shared to fold).
    wb = jnp.broadcast_to(w_in, (*lead, *w_in.shape))
    hlo = jax.jit(lambda x, w: pit_jax.grouped_matmul(x, w, pit_jax.moe_index(ids, e))).lower(x, wb).as_text()
    assert folded not in hlo


@pytest.mark.parametrize("platform", PLATFORMS)
def test_jit_training_step_decreases_loss(platform):
    rng, seed = fresh_rng()
    t, d, f, e, k = 64, 16, 32, 8, 2
    x = put(platform, jnp.asarray(rng.standard_normal((t, d)), jnp.float32))
    target = put(platform, jnp.asarray(np.tanh(rng.standard_normal((t, d))), jnp.float32))
    params = {
        "router": jnp.asarray(rng.standard_normal((d, e)) * 0.1, jnp.float32),
        "w_in": jnp.asarray(rng.standard_normal((e, d, f)) / 4, jnp.float32),
        "w_out": jnp.asarray(rng.standard_normal((e, f, d)) / 6, jnp.float32),
    }
    params = jax.tree_util.tree_map(lambda a: put(platform, a), params)

    def loss(p):
        probs = jax.nn.softmax(x @ p["router"])
        gates, ids = jax.lax.top_k(probs, k)
        y = pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, e), p["w_in"], p["w_out"])
        return jnp.mean((y - target) ** 2)

    opt = optax.adam(3e-2)

    @jax.jit
    def step(p, state):
        value, g = jax.value_and_grad(loss)(p)
        updates, state = opt.update(g, state, p)
        return optax.apply_updates(p, updates), state, value

    state = opt.init(params)
    first = None
    for _ in range(40):
        params, state, value = step(params, state)
        first = value if first is None else first
    assert float(value) < 0.6 * float(first), f"loss {first} -> {value}, seed {seed}"
    assert float(jnp.abs(params["router"]).sum()) > 0


# -- bad input ----------------------------------------------------------------------------


def test_errors_name_the_argument():
    ids = jnp.zeros((10, 2), jnp.int32)
    x = jnp.ones((10, 4))
    w_in, w_out = jnp.ones((4, 4, 6)), jnp.ones((4, 6, 4))
    gates = jnp.ones((10, 2))
    with pytest.raises(ValueError, match="k=2 experts.*num_experts=1"):
        pit_jax.moe_index(ids, 1)
    with pytest.raises(TypeError, match="integer"):
        pit_jax.moe_index(ids.astype(jnp.float32), 4)
    with pytest.raises(ValueError, match="num_experts must be >= 1"):
        pit_jax.moe_index(ids, 0)
    with pytest.raises(TypeError, match="static Python int"):
        jax.jit(lambda i, n: pit_jax.moe_index(i, n))(ids, 4)
    idx = pit_jax.moe_index(ids, 4)
    with pytest.raises(ValueError, match="gates must be"):
        pit_jax.moe_ffn(x, gates[:, :1], idx, w_in, w_out)
    with pytest.raises(ValueError, match="w_in must be"):
        pit_jax.moe_ffn(x, gates, idx, jnp.ones((3, 4, 6)), w_out)
    with pytest.raises(ValueError, match="w_out must be"):
        pit_jax.moe_ffn(x, gates, idx, w_in, jnp.ones((4, 5, 4)))
    with pytest.raises(ValueError, match="routes 10 tokens but x has 9"):
        pit_jax.moe_ffn(x[:9], gates[:9], idx, w_in, w_out)
    with pytest.raises(TypeError, match="MoeIndex"):
        pit_jax.moe_ffn(x, gates, ids, w_in, w_out)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        pit_jax.moe_ffn(x.astype(jnp.int32), gates, idx, w_in.astype(jnp.int32), w_out.astype(jnp.int32))
    with pytest.raises(ValueError, match="activation must be"):
        pit_jax.moe_ffn(x, gates, idx, w_in, w_out, activation="tanhh")
    with pytest.raises(ValueError, match="rows must be"):
        pit_jax.grouped_matmul(x, w_in, idx, rows="tokenz")


def test_reference_mode_matches():
    rng, seed = fresh_rng()
    ids, x, gates, w_in, w_out, w_gate = make(rng, 30, 8, 12, 8, 2, jnp.float32, gated=True)
    with pit_jax.use_reference():
        idx = pit_jax.moe_index(jnp.asarray(ids), 8)
        check_index(idx, ids, 8)
        y = jax.jit(lambda *a: pit_jax.moe_ffn(*a, w_gate=w_gate, activation="silu"))(x, gates, idx, w_in, w_out)
    want = pit_jax.reference.moe_ffn(x, gates, ids, w_in, w_out, w_gate=w_gate, activation="silu")
    assert rel_err(y, want) < TOL[jnp.float32], f"seed {seed}"
