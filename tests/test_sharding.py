"""pit_jax on several devices: the ops inside `jax.shard_map` (each device builds the
index of its own shard and runs the products on it), and under plain jit with operands
sharded over their batch (each device runs the ops on its own batch entries). Inside
shard_map (check_vma, its default) the gradient of a replicated operand is the whole
batch's, summed over the devices by JAX as for any lax op
(pit_jax/primitives/_vma.py): without that, P() out_specs returned one device's part.
On CPU the mesh is 4 host devices (conftest); on the GPU machine, its GPUs (skipped with
fewer than 2)."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pit_jax
from pit_testing import assert_trees_close, f64

DEVICES = jax.devices()
pytestmark = pytest.mark.skipif(len(DEVICES) < 2, reason="needs 2+ devices of the default backend")
N = 4 if len(DEVICES) >= 4 else 2


@pytest.fixture(scope="module")
def mesh():
    return jax.sharding.Mesh(np.array(DEVICES[:N]), ("data",))


def _put(mesh, a, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def _smap(mesh, fn, in_specs, out_specs):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def _rows_live(rng, m, k, frac):
    x = rng.standard_normal((m, k)).astype(np.float32)
    return x * (rng.random((m, 1)) < frac)


@pytest.mark.parametrize("axis", ["m", "k", "w"])
def test_sparse_dense_per_shard(mesh, axis):
    """Rows of x sharded, w replicated: each device's product on its own rows (its index
    built from its shard, or from w for the W axis) equals the product of the whole x."""
    rng = np.random.default_rng()
    m, k, n = 64 * N, 128, 96
    x = _rows_live(rng, m, k, 0.6)
    if axis == "k":
        x = np.maximum(x, 0) * (rng.random((m // 32, 1, k)) < 0.4).repeat(32, axis=0).reshape(m, k)
    w = rng.standard_normal((k, n)).astype(np.float32)
    if axis == "w":
        w = w * np.kron(rng.random((k // 32, n // 32)) < 0.5, np.ones((32, 32), np.float32))
    tile = {"m": None, "k": (32, 1), "w": (32, 32)}[axis]
    fn = lambda x, w: pit_jax.sparse_dense(x, w, axis=axis, micro_tile=tile)  # noqa: E731
    f = _smap(mesh, fn, (P("data"), P()), P("data"))
    args = (_put(mesh, x, P("data")), _put(mesh, w, P()))
    y = f(*args)
    assert y.sharding.spec == P("data")
    np.testing.assert_allclose(f64(y), f64(x) @ f64(w), rtol=2e-5, atol=2e-4)
    hlo = f.lower(*args).compile().as_text()
    assert "all-gather" not in hlo and "all-reduce" not in hlo  # each device on its own rows


def test_index_counts_per_shard(mesh):
    """An index built inside shard_map counts its shard's live rows; psum gives the total."""
    rng = np.random.default_rng()
    x = _rows_live(rng, 32 * N, 16, 0.3)

    def count(x):
        idx = pit_jax.index(x, "row")
        return idx.count.reshape(1), jax.lax.psum(idx.count, "data")

    local, total = _smap(mesh, count, P("data"), (P("data"), P()))(_put(mesh, x, P("data")))
    live = (np.abs(x).sum(1) > 0).reshape(N, -1).sum(1)
    np.testing.assert_array_equal(np.asarray(local).reshape(-1), live)
    assert int(total) == live.sum()


@pytest.mark.parametrize("axis", ["m", "w"])
def test_data_parallel_grad(mesh, axis):
    """A data-parallel gradient: each device differentiates its rows' loss; the gradient
    of the replicated w comes out summed over the devices (no psum written), equal to the
    whole batch's (W axis: zero outside w's live blocks). check_vma=False leaves the sum
    to the caller, as for lax ops."""
    rng = np.random.default_rng()
    m, k, n = 32 * N, 64, 64
    x = _rows_live(rng, m, k, 0.5)
    w = rng.standard_normal((k, n)).astype(np.float32)
    if axis == "w":
        w = w * np.kron(rng.random((k // 32, n // 32)) < 0.5, np.ones((32, 32), np.float32))
    tile = None if axis == "m" else (32, 32)
    loss = lambda w, x: jnp.sum(jnp.tanh(pit_jax.sparse_dense(x, w, axis=axis, micro_tile=tile)))  # noqa: E731
    args = (_put(mesh, w, P()), _put(mesh, x, P("data")))
    g = _smap(mesh, jax.grad(loss), (P(), P("data")), P())(*args)
    ref = jax.jit(jax.grad(loss))(w, x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref), rtol=1e-4, atol=1e-4)
    if axis == "w":
        assert not np.any(np.asarray(g)[w == 0])
    unchecked = jax.jit(jax.shard_map(lambda w, x: jax.lax.psum(jax.grad(loss)(w, x), "data"), mesh=mesh,
                                      in_specs=(P(), P("data")), out_specs=P(), check_vma=False))(*args)
    np.testing.assert_allclose(np.asarray(unchecked), np.asarray(ref), rtol=1e-4, atol=1e-4)


def test_moe_data_parallel(mesh):
    """Tokens sharded, experts replicated: each device routes its own tokens (its own
    index, dropless); the output equals the unsharded layer's and the expert weights'
    gradients the whole batch's."""
    rng = np.random.default_rng()
    t, d, f, e, k = 16 * N, 32, 48, 8, 2
    x = rng.standard_normal((t, d)).astype(np.float32)
    logits = rng.standard_normal((t, e)).astype(np.float32)
    w_in = (rng.standard_normal((e, d, f)) / np.sqrt(d)).astype(np.float32)
    w_out = (rng.standard_normal((e, f, d)) / np.sqrt(f)).astype(np.float32)

    def layer(x, logits, w_in, w_out):
        gates, ids = jax.lax.top_k(jax.nn.softmax(logits), k)
        return pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, e), w_in, w_out, activation="relu")

    def grads(x, logits, w_in, w_out):
        loss = lambda wi, wo: jnp.sum(layer(x, logits, wi, wo) ** 2)  # noqa: E731
        return jax.grad(loss, argnums=(0, 1))(w_in, w_out)

    args = (_put(mesh, x, P("data")), _put(mesh, logits, P("data")), _put(mesh, w_in, P()), _put(mesh, w_out, P()))
    specs = (P("data"), P("data"), P(), P())
    y = _smap(mesh, layer, specs, P("data"))(*args)
    np.testing.assert_allclose(np.asarray(y), np.asarray(jax.jit(layer)(x, logits, w_in, w_out)), rtol=1e-4, atol=1e-4)
    g = _smap(mesh, grads, specs, P())(*args)
    ref = jax.jit(jax.grad(lambda wi, wo: jnp.sum(layer(x, logits, wi, wo) ** 2), argnums=(0, 1)))(w_in, w_out)
    assert_trees_close(g, ref, rtol=1e-4, atol=1e-4)


def test_flax_layer_in_shard_map(mesh):
    """pit_jax.flax.SparseDense in a data-parallel step: the parameters' gradients over
    the mesh match the single-device step's."""
    from pit_jax.flax import SparseDense

    rng = np.random.default_rng()
    x = _rows_live(rng, 16 * N, 32, 0.5)
    model = SparseDense(24, axis="m")
    params = model.init(jax.random.PRNGKey(0), x)
    loss = lambda p, x: jnp.sum(model.apply(p, x) ** 2)  # noqa: E731
    g = _smap(mesh, jax.grad(loss), (P(), P("data")), P())(params, _put(mesh, x, P("data")))
    ref = jax.jit(jax.grad(loss))(params, x)
    assert_trees_close(g, ref, rtol=1e-4, atol=1e-5)


def test_nnx_layer_in_shard_map(mesh):
    """pit_jax.flax.nnx.SparseDense split into graph and state, state replicated: the
    data-parallel gradient of its parameters matches the single-device one."""
    from flax import nnx

    from pit_jax.flax import nnx as pit_nnx

    rng = np.random.default_rng()
    x = _rows_live(rng, 16 * N, 32, 0.5)
    graphdef, state = nnx.split(pit_nnx.SparseDense(32, 24, axis="m", rngs=nnx.Rngs(0)))

    def loss(state, x):
        return jnp.sum(nnx.merge(graphdef, state)(x) ** 2)

    g = _smap(mesh, jax.grad(loss), (P(), P("data")), P())(state, _put(mesh, x, P("data")))
    assert_trees_close(g, jax.grad(loss)(state, x), rtol=1e-4, atol=1e-4)


def _compiled(f, *args):
    return f.lower(*args).compile().as_text()


def _batch_case(rng, axis, b, m, k, n):
    """x [b, m, k] with dead rows (M axis) or dead 32x1 strips (K axis), w [k, n] with dead
    32x32 blocks (W axis)."""
    x = np.stack([_rows_live(rng, m, k, 0.6) for _ in range(b)])
    if axis == "k":
        x = np.maximum(x, 0) * (rng.random((b, m // 32, 1, k)) < 0.4).repeat(32, axis=1).reshape(b, m, k)
    w = rng.standard_normal((k, n)).astype(np.float32)
    if axis == "w":
        w = w * np.kron(rng.random((k // 32, n // 32)) < 0.5, np.ones((32, 32), np.float32))
    return x, w, {"m": None, "k": (32, 1), "w": (32, 32)}[axis]


@pytest.mark.parametrize("axis", ["m", "k", "w"])
def test_jit_splits_the_batch(mesh, axis):
    """Plain jit, x [B, M, K] sharded over B, w replicated: each device runs the index and
    the product on its own batch entries (pit_jax/primitives/_partition.py); no operand
    is gathered and the result stays sharded."""
    rng = np.random.default_rng()
    x, w, tile = _batch_case(rng, axis, 2 * N, 64, 96, 64)
    f = jax.jit(lambda x, w: pit_jax.sparse_dense(x, w, axis=axis, micro_tile=tile))
    args = (_put(mesh, x, P("data")), _put(mesh, w, P()))
    y = f(*args)
    assert y.sharding.spec[0] == "data"
    np.testing.assert_allclose(f64(y), f64(x) @ f64(w), rtol=2e-5, atol=2e-4)
    hlo = _compiled(f, *args)
    assert "all-gather" not in hlo and "all-reduce" not in hlo


@pytest.mark.parametrize("axis_type", ["auto", "explicit", "explicit_no_set_mesh"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("axis", ["m", "k", "w"])
def test_jit_data_parallel_grad(mesh, axis, dtype, axis_type):
    """A data-parallel gradient under plain jit: the shared w's gradient (a reduction over
    the batch) is each device's partial sum (rounded to the dtype by its kernel), added
    across the devices in float32 and rounded again; x's gradient stays sharded. Equal to
    the unsharded gradients within the dtype's rounding. With Explicit mesh axes the
    split op is a shard_map (_partition._shard_mapped), with Auto ones custom_partitioning;
    Explicit axes also without `jax.set_mesh` (operands placed on an Explicit mesh, as
    `jax.make_mesh` makes by default)."""
    rng = np.random.default_rng()
    x, w, tile = _batch_case(rng, axis, 2 * N, 64, 64, 64)
    x, w = x.astype(dtype), w.astype(dtype)
    def loss(w, x):
        return jnp.sum(jnp.tanh(pit_jax.sparse_dense(x, w, axis=axis, micro_tile=tile)).astype(jnp.float32))
    f = jax.jit(jax.grad(loss, argnums=(0, 1)))
    ref = jax.grad(loss, argnums=(0, 1))(jnp.asarray(w), jnp.asarray(x))
    if axis_type != "auto":
        mesh = jax.make_mesh((N,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=DEVICES[:N])
    with jax.set_mesh(mesh) if axis_type == "explicit" else contextlib.nullcontext():
        args = (_put(mesh, w, P()), _put(mesh, x, P("data")))
        gw, gx = f(*args)
        hlo = _compiled(f, *args)
    tol = 1e-4 if dtype == jnp.float32 else 2e-2
    assert_trees_close((gw, gx), ref, rtol=tol, atol=tol * np.abs(np.asarray(ref[0], np.float32)).max())
    assert gx.sharding.spec[0] == "data"
    if axis == "w":
        assert not np.any(np.asarray(gw)[w == 0])
    assert 'custom_call_target="Sharding"' not in hlo
    assert "all-gather" not in hlo


def test_jit_pruning_ops_on_sharded_kernels(mesh):
    """block_topk and mask_blocks under plain jit with the kernels split over their leading
    dim (no batch-split rule: they see whole operands): the single-device values."""
    rng = np.random.default_rng()
    ws = rng.standard_normal((2 * N, 64, 128)).astype(np.float32)

    def prune(w):
        live = pit_jax.block_topk(w, (32, 64), 0.5).live
        return live, pit_jax.mask_blocks(w, live, (32, 64), jnp.bfloat16)

    live, masked = jax.jit(prune)(_put(mesh, ws, P("data")))
    want_live, want = jax.jit(prune)(ws)
    np.testing.assert_array_equal(np.asarray(live), np.asarray(want_live))
    np.testing.assert_array_equal(np.asarray(masked.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)))


def test_jit_varlen_attention_splits_the_batch(mesh):
    """varlen_attention with q, k, v, lengths sharded over the batch: each device runs the
    forward and backward targets on its own sequences, nothing gathered; values and
    gradients equal the unsharded ones (the same per-sequence arithmetic)."""
    rng = np.random.default_rng()
    b, s, h, d = 2 * N, 24, 2, 64
    q, k, v, dout = (rng.standard_normal((b, s, h, d)).astype(jnp.bfloat16) for _ in range(4))
    lengths = rng.integers(0, s + 1, size=b).astype(np.int32)

    def f(q, k, v, ln, do):
        out, vjp = jax.vjp(lambda *a: pit_jax.varlen_attention(*a, ln), q, k, v)
        return (out, *vjp(do))

    args = [_put(mesh, a, P("data")) for a in (q, k, v, lengths, dout)]
    got = jax.jit(f)(*args)
    want = jax.jit(f)(*(jnp.asarray(a) for a in (q, k, v, lengths, dout)))
    for g, w in zip(got, want):
        assert g.sharding.spec[0] == "data"
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
    hlo = _compiled(jax.jit(f), *args)
    assert "all-gather" not in hlo and "all-reduce" not in hlo
    inside = _smap(mesh, f, (P("data"),) * 5, (P("data"),) * 4)(*args)
    for g, w in zip(inside, want):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


def test_varlen_attention_forward_mode_split(mesh):
    """jvp and a Hessian-vector product (jvp of grad) of varlen_attention with the batch
    sharded: under jit and under shard_map, equal to the unsharded values."""
    rng = np.random.default_rng()
    b, s, h, d = 2 * N, 24, 2, 64
    q, k, v, t = (rng.standard_normal((b, s, h, d)).astype(jnp.bfloat16) for _ in range(4))
    lengths = rng.integers(0, s + 1, size=b).astype(np.int32)

    def f(q, k, v, ln, t):
        loss = lambda q: jnp.sum(pit_jax.varlen_attention(q, k, v, ln).astype(jnp.float32) ** 2)  # noqa: E731
        _, tan = jax.jvp(lambda q: pit_jax.varlen_attention(q, k, v, ln), (q,), (t,))
        return tan, jax.jvp(jax.grad(loss), (q,), (t,))[1]

    args = [_put(mesh, a, P("data")) for a in (q, k, v, lengths, t)]
    want = jax.jit(f)(*(jnp.asarray(a) for a in (q, k, v, lengths, t)))
    for got in (jax.jit(f)(*args), _smap(mesh, f, (P("data"),) * 5, (P("data"),) * 2)(*args)):
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=1e-2, atol=1e-2)


def test_jit_scan_over_layers(mesh):
    """The batch split inside a scanned layer stack (the custom calls in a while body):
    the gradient of the stacked weights equals the unsharded one, nothing is gathered."""
    rng = np.random.default_rng()
    x, _, _ = _batch_case(rng, "m", 2 * N, 32, 64, 64)
    ws = (rng.standard_normal((3, 64, 64)) / 8).astype(np.float32)

    def net(ws, x):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(pit_jax.sparse_dense(h, w, axis="m")), None), x, ws)
        return jnp.sum(h ** 2)

    f = jax.jit(jax.grad(net))
    args = (_put(mesh, ws, P()), _put(mesh, x, P("data")))
    np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(jax.grad(net)(jnp.asarray(ws), jnp.asarray(x))),
                               rtol=1e-4, atol=1e-4)
    assert "all-gather" not in _compiled(f, *args)


def test_jit_index_and_layer_norm_per_entry(mesh):
    """The index of a batch-sharded x under jit (its counts per entry) and the live-row
    layer norm on it: per device, equal to the unsharded values."""
    rng = np.random.default_rng()
    x = np.stack([_rows_live(rng, 24, 32, 0.4) for _ in range(2 * N)])
    res = rng.standard_normal(x.shape).astype(np.float32)
    scale, offset = rng.standard_normal((2, 32)).astype(np.float32)

    def fn(x, res):
        idx = pit_jax.index(x, "row")
        return idx.count, pit_jax.layer_norm(x, scale, offset, idx, residual=res)

    f = jax.jit(fn)
    args = (_put(mesh, x, P("data")), _put(mesh, res, P("data")))
    count, y = f(*args)
    want_count, want_y = fn(jnp.asarray(x), jnp.asarray(res))
    np.testing.assert_array_equal(np.asarray(count), (np.abs(x).sum(-1) > 0).sum(-1))
    np.testing.assert_array_equal(np.asarray(count), np.asarray(want_count))
    np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), rtol=1e-5, atol=1e-5)
    assert "all-gather" not in _compiled(f, *args)
    # The backward target (pit_row_layer_norm_bwd): per-entry sums of the shared scale's
    # and offset's cotangents, summed over the batch outside it; with copies=2 (two
    # results, the second cotangent as its dy2) against the unsharded single result.
    def norm(x, res, s, o, n=1):
        return pit_jax.layer_norm(x, s, o, pit_jax.index(x, "row"), residual=res, copies=n)

    one = lambda *a: jnp.sum(jnp.sin(norm(*a)))  # noqa: E731
    uses = lambda a, b: jnp.sum(jnp.sin(a)) + jnp.sum(b * b)  # noqa: E731
    two = lambda *a: uses(*norm(*a, n=2))  # noqa: E731
    two_ref = lambda *a: uses(norm(*a), norm(*a))  # noqa: E731
    for loss, ref in ((one, one), (two, two_ref)):
        g = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
        got = g(*args, _put(mesh, scale, P()), _put(mesh, offset, P()))
        want = jax.grad(ref, argnums=(0, 1, 2, 3))(jnp.asarray(x), jnp.asarray(res), scale, offset)
        for u, v in zip(got, want):
            np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-4, atol=1e-5)
        assert "all-gather" not in _compiled(g, *args, _put(mesh, scale, P()), _put(mesh, offset, P()))


def test_jit_sread_swrite_and_parts_per_entry(mesh):
    """SRead / SWrite and the three-result product (out_parts=3, a multi-result primitive)
    on a batch-sharded x under plain jit: per device, equal to the unsharded values, and
    the parts' gradient (the shared w's, summed across the devices) too."""
    rng = np.random.default_rng()
    x, _, _ = _batch_case(rng, "m", 2 * N, 32, 64, 8)
    w = rng.standard_normal((64, 96)).astype(np.float32)

    def fn(x, w):
        idx = pit_jax.index(x, (8, 16))
        packed = pit_jax.sread(x, idx)
        back = pit_jax.swrite(2 * packed, idx, jnp.zeros_like(x))
        return back, pit_jax.sparse_dense(x, w, axis="m", out_parts=3)

    loss = lambda x, w: sum(jnp.sum(jnp.tanh(p)) for p in fn(x, w)[1])  # noqa: E731
    f, g = jax.jit(fn), jax.jit(jax.grad(loss, argnums=1))
    args = (_put(mesh, x, P("data")), _put(mesh, w, P()))
    back, parts = f(*args)
    np.testing.assert_array_equal(np.asarray(back), 2 * x)
    want = np.split(f64(x) @ f64(w), 3, axis=-1)
    for p, q in zip(parts, want):
        assert p.sharding.spec[0] == "data"
        np.testing.assert_allclose(f64(p), q, rtol=2e-5, atol=2e-4)
    want_g = jax.grad(loss, argnums=1)(jnp.asarray(x), jnp.asarray(w))
    np.testing.assert_allclose(np.asarray(g(*args)), np.asarray(want_g), rtol=1e-4, atol=1e-4)
    assert "all-gather" not in _compiled(f, *args)


def test_jit_moe_groups(mesh):
    """A batch of token groups (vmap) sharded over the devices under plain jit: each device
    routes its own groups; outputs and the gradients of the expert weights (summed over all
    groups across the devices) and of the gates equal the unsharded ones. (The router's
    top_k is outside: XLA's CPU top_k gathers its operand.)"""
    rng = np.random.default_rng()
    g, t, d, f, e, k = 2 * N, 16, 32, 48, 8, 2
    x = rng.standard_normal((g, t, d)).astype(np.float32)
    gates, ids = jax.lax.top_k(jax.nn.softmax(rng.standard_normal((g, t, e)).astype(np.float32)), k)
    w_in = (rng.standard_normal((e, d, f)) / np.sqrt(d)).astype(np.float32)
    w_out = (rng.standard_normal((e, f, d)) / np.sqrt(f)).astype(np.float32)

    def layer(x, gates, ids, w_in, w_out):
        return pit_jax.moe_ffn(x, gates, pit_jax.moe_index(ids, e), w_in, w_out, activation="relu")

    groups = jax.vmap(layer, in_axes=(0, 0, 0, None, None))
    loss = lambda x, gates, ids, wi, wo: jnp.sum(groups(x, gates, ids, wi, wo) ** 2)  # noqa: E731
    fwd, grad = jax.jit(groups), jax.jit(jax.grad(loss, argnums=(1, 3, 4)))
    args = (*(_put(mesh, np.asarray(a), P("data")) for a in (x, gates, ids)), _put(mesh, w_in, P()),
            _put(mesh, w_out, P()))
    local = tuple(jnp.asarray(a) for a in (x, gates, ids, w_in, w_out))
    np.testing.assert_allclose(np.asarray(fwd(*args)), np.asarray(groups(*local)), rtol=1e-4, atol=1e-4)
    assert_trees_close(grad(*args), jax.grad(loss, argnums=(1, 3, 4))(*local), rtol=1e-4, atol=1e-4)
    assert "all-gather" not in _compiled(fwd, *args)
    assert "all-gather" not in _compiled(grad, *args)


@pytest.mark.parametrize("axis", ["m", "k", "w"])
def test_jit_flax_layers_keep_the_batch(mesh, axis):
    """SparseDense (linen and nnx) with batch_dims=1 on x [B, T, D] sharded over B under
    plain jit: forward and the parameters' gradients equal the folded layer's (the
    default), and the forward gathers nothing."""
    from flax import nnx

    from pit_jax.flax import SparseDense
    from pit_jax.flax import nnx as pit_nnx

    rng = np.random.default_rng()
    x, _, _ = _batch_case(rng, axis if axis != "w" else "m", 2 * N, 32, 64, 8)
    xs = _put(mesh, x, P("data"))
    tile = {"m": None, "k": (32, 1), "w": (32, 16)}[axis]
    split, folded = (SparseDense(48, axis=axis, micro_tile=tile, batch_dims=b) for b in (1, 0))
    params = folded.init(jax.random.PRNGKey(0), x)
    loss = lambda m: (lambda p, x: jnp.sum(jnp.tanh(m.apply(p, x))))  # noqa: E731
    fwd = jax.jit(split.apply)
    np.testing.assert_allclose(np.asarray(fwd(params, xs)), np.asarray(folded.apply(params, x)), rtol=1e-5, atol=1e-5)
    assert "all-gather" not in _compiled(fwd, params, xs)
    assert_trees_close(jax.jit(jax.grad(loss(split)))(params, xs), jax.grad(loss(folded))(params, x),
                       rtol=1e-4, atol=1e-4)

    layer = pit_nnx.SparseDense(64, 48, axis=axis, micro_tile=tile, batch_dims=1, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    ref = pit_nnx.SparseDense(64, 48, axis=axis, micro_tile=tile, rngs=nnx.Rngs(0))
    f = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))
    np.testing.assert_allclose(np.asarray(f(state, xs)), np.asarray(ref(jnp.asarray(x))), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="batch_dims must be in"):
        SparseDense(8, batch_dims=2).init(jax.random.PRNGKey(0), x)


def _gathers(hlo):
    """The op names of the all-gathers in a compiled HLO text."""
    return [line.split('op_name="')[1].split('"')[0] if 'op_name="' in line else line
            for line in hlo.splitlines() if " all-gather(" in line]


def test_jit_moe_layer_keeps_the_groups(mesh):
    """pit_jax.flax.MoE with batch_dims=1 on x [G, T, D] sharded over G under plain jit:
    output, auxiliary losses, counts and the parameters' gradients equal the one-group
    layer's (the default); the experts gather nothing (XLA's CPU top_k in the router
    gathers its operand, the router's probabilities: the only all-gather)."""
    from pit_jax.flax import MoE

    rng = np.random.default_rng()
    x = rng.standard_normal((2 * N, 16, 32)).astype(np.float32)
    split, folded = (MoE(num_experts=8, hidden_dim=48, top_k=2, batch_dims=b) for b in (1, 0))
    params = folded.init(jax.random.PRNGKey(0), x)

    def run(m):
        def f(p, x):
            y, st = m.apply(p, x, mutable=["losses", "intermediates"])
            return y, st["losses"], st["intermediates"]["expert_counts"]
        return f

    def loss(m):
        return lambda p, x: jnp.sum(run(m)(p, x)[0] ** 2) + sum(jax.tree.leaves(run(m)(p, x)[1]))

    fwd = jax.jit(run(split))
    xs = _put(mesh, x, P("data"))
    assert_trees_close(fwd(params, xs), run(folded)(params, x), rtol=1e-4, atol=1e-4)
    assert_trees_close(jax.jit(jax.grad(loss(split)))(params, xs), jax.grad(loss(folded))(params, x),
                       rtol=1e-4, atol=1e-4)
    # XLA's CPU top_k gathers its operand, the router's probabilities [tokens, experts]
    # (jax 0.10 names the gather top_k, 0.11 the softmax's div); nothing else is gathered.
    hlo = _compiled(fwd, params, xs)
    gathered = [line.split("= ")[1].split(" ")[0] for line in hlo.splitlines() if " all-gather(" in line]
    assert all(g.rstrip("}").split("{")[0].endswith(",8]") for g in gathered), gathered
    with pytest.raises(ValueError, match="batch_dims must be in"):
        MoE(num_experts=8, hidden_dim=48, batch_dims=2).init(jax.random.PRNGKey(0), x)


def test_export_with_a_sharded_batch(mesh):
    """jax.export of a jit over several devices: the exported program keeps whole operands
    (a partitioning callback cannot be serialized) and computes the same result."""
    from jax import export

    rng = np.random.default_rng()
    x, w, _ = _batch_case(rng, "m", 2 * N, 32, 64, 48)
    sh = (NamedSharding(mesh, P("data")), NamedSharding(mesh, P()))
    f = jax.jit(lambda x, w: pit_jax.sparse_dense(x, w, axis="m"), in_shardings=sh)
    exp = export.export(f, disabled_checks=pit_jax.export_checks())(x, w)
    y = exp.call(_put(mesh, x, P("data")), _put(mesh, w, P()))
    np.testing.assert_allclose(f64(y), f64(x) @ f64(w), rtol=2e-5, atol=2e-4)


def test_jit_whole_operands_without_a_batch(mesh):
    """Without batch dims (x [M, K] sharded over its rows) an op's index covers all rows,
    so the op runs on whole operands (gathered): correct, not split."""
    rng = np.random.default_rng()
    x = _rows_live(rng, 32 * N, 64, 0.5)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    fn = jax.jit(lambda x, w: pit_jax.sparse_dense(x, w, axis="m"))
    y = fn(_put(mesh, x, P("data")), _put(mesh, w, P()))
    np.testing.assert_allclose(f64(y), f64(x) @ f64(w), rtol=2e-5, atol=2e-4)


def test_vmap_inside_shard_map(mesh):
    """A batch of token groups per device (vmap inside shard_map): each group its own index."""
    rng = np.random.default_rng()
    x = np.stack([_rows_live(rng, 24, 32, 0.5) for _ in range(2 * N)])
    w = rng.standard_normal((32, 16)).astype(np.float32)
    fn = jax.vmap(lambda x, w: pit_jax.sparse_dense(x, w, axis="m"), in_axes=(0, None))
    y = _smap(mesh, fn, (P("data"), P()), P("data"))(_put(mesh, x, P("data")), _put(mesh, w, P()))
    np.testing.assert_allclose(f64(y), f64(x) @ f64(w), rtol=2e-5, atol=2e-4)


def test_bert_pit_data_parallel(mesh):
    """The example PIT BERT (row index per batch shard, live-row norms, fused epilogues)
    as a data-parallel fine-tuning gradient: equal to the single-device gradient."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    from pit_models import bert

    cfg = bert.BertConfig.tiny()
    rng = np.random.default_rng()
    batch, seq = 2 * N, 16
    tokens, lengths, labels = bert.synthetic_batch(rng, cfg, batch, seq, rng.integers(3, seq + 1, size=batch))
    model = bert.BertClassifier(cfg, "pit", "xla")
    params = model.init(jax.random.PRNGKey(0), tokens, lengths)

    def loss(p, t, ln, y):  # summed over the sequences, so that shards add up
        return bert.loss_fn(model, p, t, ln, y) * t.shape[0]

    specs = (P(), P("data"), P("data"), P("data"))
    args = (params, *(_put(mesh, np.asarray(a), P("data")) for a in (tokens, lengths, labels)))
    g = _smap(mesh, jax.grad(loss), specs, P())(*args)
    ref = jax.jit(jax.grad(loss))(params, tokens, lengths, labels)
    assert_trees_close(g, ref, rtol=2e-4, atol=2e-5)


def test_explicit_mesh_axes():
    """With sharding in types (Explicit mesh axes): x [B, M, K] split over B gives results
    typed and computed per batch entry (no gather), the shared w's gradient replicated
    and x's split; x [M, K] without a batch gives replicated results (whole operands).
    The batch-summed gradient's all-reduce has a plain add for its reducer: with jax 0.11
    a custom_partitioning lowering left sharding custom calls in it, which aborted XLA's
    GPU compile (all_reduce_thunk.cc) and failed on the CPU (an unregistered custom call)."""
    mesh = jax.make_mesh((N,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=DEVICES[:N])
    rng = np.random.default_rng()
    xb, w, _ = _batch_case(rng, "m", 2 * N, 16, 32, 16)
    x = xb.reshape(-1, 32)
    loss = lambda w, x: jnp.sum(pit_jax.sparse_dense(x, w, axis="m") ** 2)  # noqa: E731
    fwd, grad = jax.jit(lambda x, w: pit_jax.sparse_dense(x, w, axis="m")), jax.jit(jax.grad(loss, argnums=(0, 1)))
    with jax.set_mesh(mesh):
        ws = _put(mesh, w, P())
        xbs, xs = _put(mesh, xb, P("data")), _put(mesh, x, P("data"))
        yb, y = fwd(xbs, ws), fwd(xs, ws)
        (gw, gx), (gw2, _) = grad(ws, xbs), grad(ws, xs)
        hlo = _compiled(fwd, xbs, ws)
        grad_hlo = _compiled(grad, ws, xbs)
    assert 'custom_call_target="Sharding"' not in grad_hlo and " all-reduce(" in grad_hlo
    assert yb.sharding.spec == P("data", None, None) and y.sharding.spec == P(None, None)
    assert gx.sharding.spec[0] == "data" and gw.sharding.spec == P(None, None)
    assert "all-gather" not in hlo
    np.testing.assert_allclose(f64(yb), f64(xb) @ f64(w), rtol=2e-5, atol=2e-4)
    np.testing.assert_allclose(f64(y), f64(x) @ f64(w), rtol=2e-5, atol=2e-4)
    want = 2 * x.T @ (x @ w)
    np.testing.assert_allclose(np.asarray(gw), want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(np.asarray(gw2), want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(np.asarray(gx), 2 * (xb @ w) @ w.T * (np.abs(xb).sum(-1, keepdims=True) > 0),
                               rtol=1e-4, atol=1e-3)
