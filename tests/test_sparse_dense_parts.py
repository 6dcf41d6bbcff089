"""sparse_dense(..., out_parts=P): the result as P column blocks (q, k, v of a fused projection).

Against float64 references of act((x * mask) @ w + bias), split; every part poisoned (NaN)
before the kernel on the native paths. On an sm_90a GPU with 16-bit types, P = 3 and
N / 3 a multiple of 256 the row-gather kernel writes the parts itself
(`pit_row_gather_matmul3`); elsewhere it is the single product, split.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pit_testing import PLATFORMS, activation64, f64, fresh_rng, put, randn, requires_gpu, tiled_sparse

import pit_jax
from pit_jax.primitives import row_linear_parts as rlp

pytestmark = pytest.mark.usefixtures("poison_outputs")

TOL = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 1e-2}


def case(rng, lead, m, k, n, density, dtype):
    x, live = tiled_sparse(rng, (*lead, m, k), (1, k), density, dtype)
    return x, randn(rng, (k, n), dtype), randn(rng, (n,), dtype), live.astype(np.float64)


def ref(x, w, b, mask, name, parts):
    y = activation64((f64(x) * mask) @ f64(w) + (0.0 if b is None else f64(b)), name)
    return np.split(y, parts, axis=-1)


def rel_err(got, want):
    got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
    assert not np.isnan(got).any(), "NaN in the output: an element was not written"
    return np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("parts,name,with_bias,density",
                         [(3, None, True, 0.3), (2, "gelu_exact", True, 0.6), (3, "relu", False, 0.0),
                          (4, None, False, 1.0)])
def test_parts_match_float64(platform, dtype, parts, name, with_bias, density):
    rng, seed = fresh_rng()
    x, w, b, mask = case(rng, (), 75, 40, 24 * parts, density, dtype)
    b = b if with_bias else None
    f = jax.jit(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, activation=name, out_parts=parts))
    ys = f(*put(platform, x, w), None if b is None else put(platform, b))
    assert isinstance(ys, tuple) and len(ys) == parts
    for i, (y, want) in enumerate(zip(ys, ref(x, w, b, mask, name, parts))):
        assert y.shape == (75, 24) and y.dtype == jnp.dtype(dtype)
        assert rel_err(y, want) < TOL[jnp.dtype(dtype).name], f"seed={seed}: part {i}"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_parts_batch_vector_other_axes_and_plans(platform):
    rng, seed = fresh_rng()
    x, w, b, mask = case(rng, (2, 3), 20, 16, 24, 0.5, jnp.float32)

    def f(x, w, b, p):
        return pit_jax.sparse_dense(x, w, pit_jax.index(p, (1, None)), bias=b, out_parts=3)

    ys = jax.jit(f)(*put(platform, x, w, b, np.asarray(x)))
    for y, want in zip(ys, ref(x, w, b, mask, None, 3)):
        assert y.shape == (2, 3, 20, 8) and rel_err(y, want) < TOL["float32"], f"seed={seed}"
    v = jax.jit(lambda x, w: pit_jax.sparse_dense(x, w, out_parts=2))(*put(platform, x[0, 0, 3], w))
    assert len(v) == 2 and v[0].shape == (12,)
    # The K axis and a callable activation: the unfused result, split.
    k = jax.jit(lambda x, w: pit_jax.sparse_dense(x, w, axis="k", micro_tile=(4, 1), activation=jnp.tanh,
                                                  out_parts=2))(*put(platform, x[0, 0], w))
    want = np.split(np.tanh(f64(x[0, 0]) @ f64(w)), 2, axis=-1)
    for y, e in zip(k, want):
        assert rel_err(y, e) < TOL["float32"], f"seed={seed}"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_parts_gradients_and_vmap(platform):
    rng, seed = fresh_rng()
    x, w, b, mask = case(rng, (3,), 30, 20, 24, 0.4, jnp.float32)
    args = put(platform, x, w, b)

    def loss(x, w, b):
        q, k, v = pit_jax.sparse_dense(x, w, bias=b, activation="silu", out_parts=3)
        return jnp.sum(jnp.sin(q) + 2.0 * k * v)

    def loss_ref(x, w, b):
        q, k, v = jnp.split(jax.nn.silu(x @ w + b), 3, axis=-1)
        return jnp.sum(jnp.sin(q) + 2.0 * k * v)

    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)
    with jax.default_device(jax.devices("cpu")[0]):
        want = jax.grad(loss_ref, argnums=(0, 1, 2))(*(jnp.asarray(a) for a in (x, w, b)))
    for what, got, exp in zip(("dx", "dw", "dbias"), g, want):
        exp = np.asarray(exp, np.float64) * (mask if what == "dx" else 1.0)
        assert rel_err(got, exp) < 1e-4, f"seed={seed}: {what}"
    fwd = jax.jit(jax.vmap(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, out_parts=3), (0, None, None)))
    for y, e in zip(fwd(*args), ref(x, w, b, mask, None, 3)):
        assert rel_err(y, e) < TOL["float32"], f"seed={seed}: vmap"
    bs = np.stack([b, -b, 2 * b]).astype(np.float32)  # a mapped bias: the unfused route
    fwd_b = jax.jit(jax.vmap(lambda x, w, b: pit_jax.sparse_dense(x, w, bias=b, out_parts=3), (0, None, 0)))
    got_b = fwd_b(args[0], args[1], put(platform, bs))
    for i, y in enumerate(got_b):
        e = np.stack([ref(x[j], w, bs[j], mask[j], None, 3)[i] for j in range(3)])
        assert rel_err(y, e) < TOL["float32"], f"seed={seed}: vmap with a mapped bias"
    vg = jax.jit(jax.vmap(jax.grad(loss, argnums=(1, 2)), (0, None, None)))(*args)
    with jax.default_device(jax.devices("cpu")[0]):
        vwant = jax.vmap(jax.grad(loss_ref, argnums=(1, 2)), (0, None, None))(*(jnp.asarray(a) for a in (x, w, b)))
    for got, exp in zip(vg, vwant):
        assert rel_err(got, np.asarray(exp, np.float64)) < 1e-4, f"seed={seed}: vmap(grad)"


def test_bad_out_parts_are_clear_errors():
    x, w = jnp.ones((8, 4)), jnp.ones((4, 6))
    with pytest.raises(ValueError, match="out_parts=4 must divide N = 6"):
        pit_jax.sparse_dense(x, w, out_parts=4)
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="out_parts must be a positive int"):
            pit_jax.sparse_dense(x, w, out_parts=bad)


def test_kernel_writes_parts_only_where_it_can():
    x16 = jnp.zeros((100, 64), jnp.bfloat16)
    w = jnp.zeros((64, 768), jnp.bfloat16)
    tiles = jnp.zeros((100,), jnp.int32)
    ok = rlp._lowering.cuda_is_sm90()
    assert rlp.kernel_writes_parts(x16, w, tiles, 1, 3) == ok
    assert not rlp.kernel_writes_parts(x16, w, tiles, 1, 2)  # the target writes 3
    assert not rlp.kernel_writes_parts(x16.astype(jnp.float32), w.astype(jnp.float32), tiles, 1, 3)
    assert not rlp.kernel_writes_parts(x16, jnp.zeros((64, 264), jnp.bfloat16), tiles, 1, 3)  # 88 % 256
    assert not rlp.kernel_writes_parts(x16, w, tiles[:50], 1, 3)  # the list below full capacity


def _requires_parts_kernel():
    # The three-result kernel is sm_90a's; other GPUs (or PIT_JAX_HOPPER=0) run the single
    # product and a split, which test_sparse_dense_parts's other cases cover.
    if not rlp._lowering.cuda_is_sm90():
        pytest.skip("the three-part kernel runs on sm_90 devices")


@requires_gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("m,k,tile_h,density,batch", [(4096, 768, 1, 0.27, ()), (1000, 264, 2, 0.4, (2,)),
                                                      (300, 64, 1, 0.0, ())])
def test_kernel_parts_gpu(dtype, m, k, tile_h, density, batch):
    """The kernel's own three results (BERT's qkv shape, odd shapes, a batch, all dead):
    equal to the single product split, bit for bit, and to float64 within bf16/f16."""
    _requires_parts_kernel()
    rng, seed = fresh_rng()
    x, live = tiled_sparse(rng, (*batch, m, k), (tile_h, k), density, dtype)
    w, b = randn(rng, (k, 2304), dtype), randn(rng, (2304,), dtype)
    mask = np.repeat(live, tile_h, -2)[..., :m, :].astype(np.float64)  # per row, not per tile

    def f(x, w, b, parts):
        idx = pit_jax.index(x, (tile_h, None))
        return pit_jax.sparse_dense(x, w, idx, bias=b, out_parts=parts)

    args = put("gpu", x, w, b)
    ys = jax.jit(lambda x, w, b: f(x, w, b, 3))(*args)
    one = jax.jit(lambda x, w, b: f(x, w, b, 1))(*args)
    for i, y in enumerate(ys):
        np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(one[..., i * 768:(i + 1) * 768], np.float32),
                                      err_msg=f"seed={seed}: part {i}")
    for y, want in zip(ys, ref(x, w, b, mask, None, 3)):
        assert rel_err(y, want) < TOL[jnp.dtype(dtype).name], f"seed={seed}"


@requires_gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
def test_kernel_parts_gradients_gpu(dtype):
    """Training through the kernel's three results (BERT's qkv shape): the differentiated
    step takes its primal from pit_row_gather_matmul3 (no split of one product over every
    row) and its gradients for x, w and the bias (live and dead rows: the bias is on every
    row) match float64."""
    _requires_parts_kernel()
    rng, seed = fresh_rng()
    m, k = 4096, 768
    x, live = tiled_sparse(rng, (m, k), (1, k), 0.27, dtype)
    w, b = randn(rng, (k, 2304), dtype), randn(rng, (2304,), dtype)
    cot = rng.standard_normal((m, 2304)).astype(np.float32)
    mask = live.astype(np.float64)

    def loss(x, w, b):
        ys = pit_jax.sparse_dense(x, w, pit_jax.index(x, (1, None)), bias=b, out_parts=3)
        return sum(jnp.sum(y.astype(jnp.float32) * c) for y, c in zip(ys, jnp.split(cot, 3, axis=-1)))

    args = put("gpu", x, w, b)
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    assert "pit_row_gather_matmul3" in step.lower(*args).as_text(), "the primal is not the three-part kernel"
    val, grads = step(*args)
    xm, c64 = f64(x) * mask, cot.astype(np.float64)
    want = {"dx": (c64 @ f64(w).T) * mask, "dw": xm.T @ c64, "dbias": c64.sum(0)}
    for what, got in zip(("dx", "dw", "dbias"), grads):
        assert rel_err(got, want[what]) < TOL[jnp.dtype(dtype).name], f"seed={seed}: {what}"
    terms = (xm @ f64(w) + f64(b)) * c64
    assert abs(float(val) - terms.sum()) < TOL[jnp.dtype(dtype).name] * np.abs(terms).sum(), f"seed={seed}: loss"


def test_raw_target_three_parts_on_cpu():
    """pit_row_gather_matmul3 called directly (CPU handler): the single target's result,
    split; mismatched results are an error naming the target."""
    with jax.default_device(jax.devices("cpu")[0]):  # the CPU handler, also on a GPU machine
        rng, seed = fresh_rng()
        x, w, b, _ = case(rng, (), 50, 16, 24, 0.5, jnp.float32)
        idx = pit_jax.index(jnp.asarray(x), (1, None))
        empty = jnp.zeros((0,), jnp.float32)
        attrs = dict(tile_h=np.int64(1), trans_b=False, allow_tf32=False, activation=np.int64(0), skip_dead=False)
        one = jax.ffi.ffi_call("pit_row_gather_matmul", jax.ShapeDtypeStruct((50, 24), jnp.float32))(
            x, w, idx.tiles, idx.count, b, b, **attrs)
        part = jax.ShapeDtypeStruct((50, 8), jnp.float32)
        three = jax.ffi.ffi_call("pit_row_gather_matmul3", (part,) * 3)(x, w, idx.tiles, idx.count, b, b, **attrs)
        for i, y in enumerate(three):
            np.testing.assert_array_equal(np.asarray(y), np.asarray(one)[:, 8 * i:8 * (i + 1)], err_msg=f"seed={seed}")
        bad = (part, jax.ShapeDtypeStruct((50, 9), jnp.float32), part)
        with pytest.raises(Exception, match="pit_row_gather_matmul3: the results must share one shape and dtype"):
            call = jax.ffi.ffi_call("pit_row_gather_matmul3", bad)
            jax.block_until_ready(call(x, w, idx.tiles, idx.count, empty, empty, **attrs))
