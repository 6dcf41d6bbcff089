"""PIT's workloads as Flax models (issue 7), tiny sizes on the CPU: the PIT model equals
its dense twin on the valid tokens (outputs and gradients of every parameter), a jitted
fine-tuning step lowers the loss, and the pruning mask is recomputed every step with
weight gradients only on live blocks; the Switch MoE stack gives the same outputs and
gradients whether its experts run through pit_jax, sort + ragged_dot, or densely."""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

import pit_jax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from pit_models import bert, common, opt, pruning, switch, tied  # noqa: E402

F32_TOL = 2e-5


def _rel(a, b, valid=None):
    return common.max_rel_err(a, b, valid)


def _batch(cfg, batch, seq, seed, lengths=None):
    rng = np.random.default_rng(seed)
    if lengths is None:
        lengths = common.sample_lengths(rng, batch, max_len=seq, mean=seq / 3, sigma=0.6, min_len=1)
    return bert.synthetic_batch(rng, cfg, batch, seq, np.asarray(lengths, np.int32))


@pytest.fixture(scope="module")
def bert_setup():
    cfg = bert.BertConfig.tiny(layers=2)
    # odd sequence length; one sequence of length 1 (only [CLS]) and one full
    tokens, lengths, labels = _batch(cfg, 4, 37, 0, lengths=[1, 37, 9, 20])
    params = jax.jit(bert.BertClassifier(cfg, "dense").init)(jax.random.PRNGKey(0), tokens, lengths)
    return cfg, params, (tokens, lengths, labels)


def test_bert_same_params_both_modes(bert_setup):
    cfg, params, (tokens, lengths, _) = bert_setup
    pit_params = jax.eval_shape(bert.BertClassifier(cfg, "pit").init, jax.random.PRNGKey(0), tokens, lengths)
    assert jax.tree_util.tree_structure(pit_params) == jax.tree_util.tree_structure(params)
    assert all(a.shape == b.shape for a, b in zip(jax.tree_util.tree_leaves(pit_params), jax.tree_util.tree_leaves(params)))


@pytest.mark.parametrize("live_norm", [True, False], ids=["live_norm", "xla_norm"])
def test_bert_outputs_and_gradients_match_dense(bert_setup, live_norm):
    cfg, params, (tokens, lengths, labels) = bert_setup
    pit, dense = bert.BertClassifier(cfg, "pit", live_norm=live_norm), bert.BertClassifier(cfg, "dense")
    lp, hp = jax.jit(pit.apply)(params, tokens, lengths)
    ld, hd = jax.jit(dense.apply)(params, tokens, lengths)
    valid = np.asarray(common.right_padding_mask(lengths, tokens.shape[1])).reshape(-1)
    assert np.isfinite(np.asarray(hp)).all()
    assert _rel(lp, ld) < F32_TOL
    assert _rel(hp, hd, valid) < F32_TOL
    gp = jax.jit(jax.grad(functools.partial(bert.loss_fn, pit)))(params, tokens, lengths, labels)
    gd = jax.jit(jax.grad(functools.partial(bert.loss_fn, dense)))(params, tokens, lengths, labels)
    flat_p = dict(jax.tree_util.tree_leaves_with_path(gp))
    for path, g in jax.tree_util.tree_leaves_with_path(gd):
        assert float(jnp.max(jnp.abs(g))) > 0 or "pos_emb" in jax.tree_util.keystr(path), path
        assert _rel(flat_p[path], g) < 1e-4, jax.tree_util.keystr(path)


def test_bert_padding_does_not_leak(bert_setup):
    """Changing the tokens of padding positions changes nothing on valid tokens."""
    cfg, params, (tokens, lengths, _) = bert_setup
    pit = bert.BertClassifier(cfg, "pit")
    valid = common.right_padding_mask(lengths, tokens.shape[1])
    noisy = jnp.where(valid, tokens, 5)
    a = jax.jit(pit.apply)(params, tokens, lengths)
    b = jax.jit(pit.apply)(params, noisy, lengths)
    assert _rel(a[0], b[0]) < F32_TOL
    assert _rel(a[1], b[1], np.asarray(valid).reshape(-1)) < F32_TOL
    # The live-row layer norms leave padding rows at exactly zero.
    assert not np.asarray(a[1])[~np.asarray(valid).reshape(-1)].any()


@pytest.mark.usefixtures("poison_outputs")
def test_bert_inference_with_unspecified_padding_rows(bert_setup):
    """dead_rows="unspecified": the products after attention and the live-row layer norms
    leave the padding rows unwritten (NaN: the CPU's fill, on a GPU the poison) and no op
    reads them, in the forward or in the backward: the valid rows and the logits equal the
    dense model's, and every gradient equals the zeros model's."""
    cfg, params, (tokens, lengths, labels) = bert_setup
    pit = bert.BertClassifier(cfg, "pit", dead_rows="unspecified")
    lp, hp = jax.jit(pit.apply)(params, tokens, lengths)
    ld, hd = jax.jit(bert.BertClassifier(cfg, "dense").apply)(params, tokens, lengths)
    valid = np.asarray(common.right_padding_mask(lengths, tokens.shape[1])).reshape(-1)
    assert np.isnan(np.asarray(hp)[~valid]).all()
    assert np.isfinite(np.asarray(hp)[valid]).all() and np.isfinite(np.asarray(lp)).all()
    assert _rel(hp, hd, valid) < F32_TOL
    assert _rel(lp, ld) < F32_TOL
    grads = [jax.jit(jax.grad(functools.partial(bert.loss_fn, m)))(params, tokens, lengths, labels)
             for m in (pit, bert.BertClassifier(cfg, "pit"))]
    for a, b in zip(*(jax.tree_util.tree_leaves(g) for g in grads)):  # (GPU: last bits, the list's order)
        assert np.isfinite(np.asarray(a)).all()
        assert _rel(a, b) < F32_TOL


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_bert_16bit_matches_dense(dtype):
    cfg = bert.BertConfig.tiny(layers=1, dtype=dtype)
    tokens, lengths, _ = _batch(cfg, 3, 32, 1)
    params = jax.jit(bert.BertClassifier(cfg, "dense").init)(jax.random.PRNGKey(1), tokens, lengths)
    lp, hp = jax.jit(bert.BertClassifier(cfg, "pit").apply)(params, tokens, lengths)
    ld, hd = jax.jit(bert.BertClassifier(cfg, "dense").apply)(params, tokens, lengths)
    valid = np.asarray(common.right_padding_mask(lengths, 32)).reshape(-1)
    assert hp.dtype == dtype
    assert _rel(hp, hd, valid) < common.tolerance(dtype)
    assert _rel(lp, ld) < common.tolerance(dtype)


def test_bert_grouped_casts_change_nothing():
    """bert.cast_kernels (pit_jax.cast_matrices, one launch per kernel shape): the bf16
    pit model on its float32 kernels cast up front gives what Flax's casts in each layer
    give, and the same gradients (loss_fn(grouped_casts=True))."""
    cfg = bert.BertConfig.tiny(layers=2, dtype=jnp.bfloat16)
    tokens, lengths, labels = _batch(cfg, 3, 32, 2)
    params = jax.jit(bert.BertClassifier(cfg, "dense").init)(jax.random.PRNGKey(2), tokens, lengths)
    pit = bert.BertClassifier(cfg, "pit")
    cast = jax.jit(lambda p, *a: pit.apply(bert.cast_kernels(p, cfg), *a))
    # qkv, attn_out with the pooler (64 x 64), ffn_in, ffn_out, classifier
    assert str(jax.make_jaxpr(cast)(params, tokens, lengths)).count("pit_mask_blocks[") == 5
    # on a GPU, XLA may fuse a dot's operand cast into its own kernel (another summation
    # order): there the same within bf16's tolerance
    exact = jax.default_backend() == "cpu"

    def same(a, b):
        a, b = (np.asarray(v.astype(jnp.float32)) for v in (a, b))
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            assert _rel(a, b) < common.tolerance(jnp.bfloat16)

    for a, b in zip(cast(params, tokens, lengths), jax.jit(pit.apply)(params, tokens, lengths)):
        same(a, b)
    grads = [jax.jit(jax.grad(functools.partial(bert.loss_fn, pit, grouped_casts=g)))(params, tokens, lengths, labels)
             for g in (True, False)]
    for a, b in zip(*(jax.tree_util.tree_leaves(g) for g in grads)):
        same(a, b)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_bert_varlen_attention_matches_dense(dtype):
    """head_dim 64: the pit model's attention is pit_jax.varlen_attention (its targets),
    outputs and every gradient as the dense model's on the valid tokens."""
    cfg = bert.BertConfig.tiny(layers=1, hidden=128, heads=2, ffn=256, dtype=dtype)
    tokens, lengths, labels = _batch(cfg, 3, 40, 1)
    pit, dense = bert.BertClassifier(cfg, "pit"), bert.BertClassifier(cfg, "dense")
    params = jax.jit(dense.init)(jax.random.PRNGKey(1), tokens, lengths)
    assert "pit_varlen_attention" in str(jax.make_jaxpr(pit.apply)(params, tokens, lengths))
    lp, hp = jax.jit(pit.apply)(params, tokens, lengths)
    ld, hd = jax.jit(dense.apply)(params, tokens, lengths)
    valid = np.asarray(common.right_padding_mask(lengths, 40)).reshape(-1)
    assert _rel(hp, hd, valid) < common.tolerance(dtype)
    assert _rel(lp, ld) < common.tolerance(dtype)
    gp, gd = (jax.jit(jax.grad(functools.partial(bert.loss_fn, m)))(params, tokens, lengths, labels)
              for m in (pit, dense))
    # 16-bit gradients differ elementwise by rounding (the models round at different
    # points): compare each parameter's gradient as a whole.
    def grad_err(ga, gb):  # the largest relative error of a parameter's whole gradient
        f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
        return max(np.linalg.norm(f64(a) - f64(b)) / max(np.linalg.norm(f64(b)), 1e-30)
                   for a, b in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)))

    err = grad_err(gp, gd)
    assert err < 0.05, err
    # The padding rows unwritten: q, k and v's too (the attention skips them); the same
    # gradients as with zeros there.
    infer = bert.BertClassifier(cfg, "pit", dead_rows="unspecified")
    li, hi = jax.jit(infer.apply)(params, tokens, lengths)
    assert _rel(hi, hp, valid) < common.tolerance(dtype) and _rel(li, lp) < common.tolerance(dtype)
    gi = jax.jit(jax.grad(functools.partial(bert.loss_fn, infer)))(params, tokens, lengths, labels)
    err = grad_err(gi, gp)
    assert err < 0.01, err


def test_bert_attention_by_train():
    """Past 128 tokens with cuDNN as the model's attention, inference (train=False) attends
    by pit_jax.varlen_attention (the long kernels' forward is the faster) and training by
    cuDNN (its backward is); at most 128 tokens, or causal, the kernels either way."""
    cfg = bert.BertConfig.tiny(layers=1, hidden=128, heads=2, ffn=256, dtype=jnp.bfloat16, max_len=256)
    assert common.varlen_kernels_apply(2, 200, cfg, "cudnn", train=False)
    assert not common.varlen_kernels_apply(2, 200, cfg, "cudnn", train=True)
    assert common.varlen_kernels_apply(2, 200, cfg, "xla", train=True)
    assert common.varlen_kernels_apply(2, 128, cfg, "cudnn", train=True)
    assert common.varlen_kernels_apply(2, 200, cfg, "cudnn", causal=True, train=True)
    # the model passes `train` through: with attention="cudnn" its inference traces the
    # kernels; its training step takes cuDNN (here, with no GPU, cuDNN refuses to trace)
    tokens, lengths, _ = _batch(cfg, 2, 200, 1)
    params = jax.jit(bert.BertClassifier(cfg, "pit", "xla").init)(jax.random.PRNGKey(1), tokens, lengths)
    model = bert.BertClassifier(cfg, "pit", "cudnn")
    jaxpr = str(jax.make_jaxpr(functools.partial(model.apply, train=False))(params, tokens, lengths))
    assert "pit_varlen_attention" in jaxpr
    if jax.default_backend() == "cpu":
        with pytest.raises(RuntimeError, match="cuDNN"):
            jax.make_jaxpr(functools.partial(model.apply, train=True))(params, tokens, lengths)
    else:
        jaxpr = str(jax.make_jaxpr(functools.partial(model.apply, train=True))(params, tokens, lengths))
        assert "pit_varlen_attention" not in jaxpr


def test_bert_finetune_step_jitted_loss_decreases(bert_setup):
    cfg, params, (tokens, lengths, labels) = bert_setup
    model = bert.BertClassifier(cfg, "pit")
    tx = optax.adamw(3e-3)

    @jax.jit
    def step(p, s):
        loss, g = jax.value_and_grad(functools.partial(bert.loss_fn, model))(p, tokens, lengths, labels)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    p, s = params, tx.init(params)
    losses = []
    for _ in range(8):
        p, s, loss = step(p, s)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0], losses


def test_bert_rejects_bad_mode_and_length(bert_setup):
    cfg, params, (tokens, lengths, _) = bert_setup
    with pytest.raises(ValueError, match="mode must be one of"):
        bert.BertClassifier(cfg, "sparse").apply(params, tokens, lengths)
    long = jnp.zeros((1, cfg.max_len + 1), jnp.int32)
    with pytest.raises(ValueError, match="exceeds max_len"):
        bert.BertClassifier(cfg, "pit").apply(params, long, jnp.array([3], jnp.int32))


# -- OPT activation sparsity ---------------------------------------------------------------


@pytest.mark.parametrize("padding", [True, False])
def test_opt_layer_matches_dense(padding):
    cfg = opt.OPTConfig.tiny()
    b, s = 3, 70  # rows not a multiple of the 32-row micro-tile
    lengths = jnp.array([5, 70, 33], jnp.int32) if padding else jnp.full((b,), s, jnp.int32)
    x = jax.random.normal(jax.random.PRNGKey(0), (b, s, cfg.d))
    params = jax.jit(opt.OPTDecoderLayer(cfg, "dense").init)(jax.random.PRNGKey(1), x, lengths)
    params = opt.relu_like_opt(params, jax.random.PRNGKey(2), cfg, 0.2)
    valid = np.asarray(common.left_padding_mask(lengths, s)).reshape(-1)
    yd, hd = jax.jit(opt.OPTDecoderLayer(cfg, "dense").apply)(params, x, lengths)
    density = opt.tile_density(hd)
    assert 0.0 < density < 0.6, density  # sparse but not empty
    for mode in ("pit", "pit_m"):
        y, h = jax.jit(opt.OPTDecoderLayer(cfg, mode).apply)(params, x, lengths)
        assert np.isfinite(np.asarray(y)).all()
        assert _rel(y, yd, valid) < F32_TOL, mode
        assert _rel(h, hd) < F32_TOL, mode


@pytest.mark.parametrize("d", [128, 256])
def test_opt_layer_attends_causally_over_left_padding_with_the_kernels(d):
    """bf16 heads of 64 / 128: the pit modes' attention is pit_jax.varlen_attention
    (causal, left padding), the dense model's XLA's masked causal attention; same valid rows."""
    cfg = opt.OPTConfig(d=d, heads=2, dtype=jnp.bfloat16)
    b, s = 3, 40
    lengths = jnp.array([5, 40, 17], jnp.int32)
    x = jax.random.normal(jax.random.PRNGKey(0), (b, s, cfg.d)).astype(cfg.dtype)
    params = jax.jit(opt.OPTDecoderLayer(cfg, "dense").init)(jax.random.PRNGKey(1), x, lengths)
    params = opt.relu_like_opt(params, jax.random.PRNGKey(2), cfg, 0.2)
    valid = np.asarray(common.left_padding_mask(lengths, s)).reshape(-1)
    yd = jax.jit(opt.OPTDecoderLayer(cfg, "dense").apply)(params, x, lengths)[0]
    for mode in ("pit", "pit_m"):
        model = opt.OPTDecoderLayer(cfg, mode)
        assert "pit_varlen_attention[" in str(jax.make_jaxpr(model.apply)(params, x, lengths))
        y = jax.jit(model.apply)(params, x, lengths)[0]
        assert _rel(y, yd, valid) < common.tolerance(cfg.dtype), mode
    xla = opt.OPTDecoderLayer(cfg, "pit", varlen_attention=False)
    assert "pit_varlen_attention" not in str(jax.make_jaxpr(xla.apply)(params, x, lengths))


def test_opt_relu_like_bias_hits_target_density():
    cfg = opt.OPTConfig(d=96, heads=2, dtype=jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(3), (2, 128, cfg.d))
    lengths = jnp.full((2,), 128, jnp.int32)
    model = opt.OPTDecoderLayer(cfg, "dense")
    params = jax.jit(model.init)(jax.random.PRNGKey(4), x, lengths)
    for target in (0.5, 0.1):
        p = opt.relu_like_opt(params, jax.random.PRNGKey(5), cfg, target)
        got = opt.tile_density(jax.jit(model.apply)(p, x, lengths)[1])
        assert abs(got - target) < 0.5 * target, (target, got)
    assert params["params"]["fc1"]["bias"].max() == 0.0  # the caller's params are untouched


# -- sparse training -----------------------------------------------------------------------


@pytest.mark.parametrize("tile", [(32, 64), (32, 1), (1, 32)])
def test_block_mask_density_and_blocks(tile):
    w = jax.random.normal(jax.random.PRNGKey(0), (96, 130))  # edge blocks are partial
    for density in (0.5, 0.1, 0.02):
        m = np.asarray(pruning.block_mask(w, density, tile))
        tk, tn = -(-96 // tile[0]), -(-130 // tile[1])
        padded = np.zeros((tk * tile[0], tn * tile[1]), bool)
        padded[:96, :130] = m
        blocks = padded.reshape(tk, tile[0], tn, tile[1])
        live = blocks.any(axis=(1, 3))
        # whole blocks: every in-range element of a live block is live
        assert (blocks.all(axis=(1, 3)) | ~live)[:-1, :-1].all()
        assert live.sum() == max(1, round(density * tk * tn))
        # the kept blocks are the largest by L1 norm
        a = np.pad(np.abs(np.asarray(w)), ((0, tk * tile[0] - 96), (0, tn * tile[1] - 130)))
        scores = a.reshape(tk, tile[0], tn, tile[1]).sum(axis=(1, 3))
        assert scores[live].min() >= scores[~live].max()


@pytest.mark.parametrize("tile", [(32, 64), (32, 1)])
def test_live_blocks_batched_like_each_kernel(tile):
    """The per-step masks: one batched sort per kernel shape gives each kernel's own top
    blocks; block-level live fraction (area-weighted) equals the element one."""
    cfg = bert.BertConfig.tiny(layers=3, hidden=48, ffn=100)  # 100: partial edge blocks
    data = _batch(cfg, 2, 16, 5, lengths=[16, 9])
    params = jax.jit(bert.BertClassifier(cfg, "dense").init)(jax.random.PRNGKey(5), data[0], data[1])
    blocks = pruning.live_blocks(params, 0.3, tile)
    shapes = pruning.kernel_shapes(params)
    assert set(blocks) == set(shapes) and len(blocks) == 4 * cfg.layers
    ms = pruning.masks(params, 0.3, tile)
    for name, w in pruning.pruned_kernels(params).items():
        np.testing.assert_array_equal(np.asarray(ms[name]), np.asarray(pruning.block_mask(w, 0.3, tile)), name)
    np.testing.assert_allclose(float(pruning.live_fraction(blocks, tile, shapes)), float(pruning.live_fraction(ms)),
                               rtol=1e-6)


@pytest.mark.parametrize("tile", [(32, 64), (32, 1), (1, 32)])
def test_live_blocks_pit_matches_jax(tile):
    """The pit step's masks (`pit_jax.block_topk` over each shape's kernels) are the
    twin's (block sums and a sort), but for blocks that tie the cut within float32
    rounding (the two sum in different orders)."""
    cfg = bert.BertConfig.tiny(layers=3, hidden=48, ffn=100)
    data = _batch(cfg, 2, 16, 5, lengths=[16, 9])
    params = jax.jit(bert.BertClassifier(cfg, "dense").init)(jax.random.PRNGKey(6), data[0], data[1])
    for density in (0.5, 0.1):
        want = jax.jit(lambda p: pruning.live_blocks(p, density, tile))(params)
        got = jax.jit(lambda p: pruning.live_blocks(p, density, tile, impl="pit"))(params)
        assert set(got) == set(want)
        for name, w in pruning.pruned_kernels(params).items():
            scores = np.asarray(pruning.block_scores(w, tile))
            cut = scores[np.asarray(want[name])].min()
            differ = np.asarray(got[name]) != np.asarray(want[name])
            assert not (differ & (np.abs(scores - cut) > 1e-5 * cut)).any(), (name, density)
    with pytest.raises(ValueError, match="impl must be"):
        pruning.live_blocks(params, 0.5, tile, impl="sort")


@pytest.mark.parametrize("tile", [(32, 64), (32, 1), (1, 32)])
def test_sparse_training_matches_masked_dense(tile):
    import sparse_training

    cfg = bert.BertConfig.tiny(layers=1)
    data = _batch(cfg, 2, 32, 2, lengths=[32, 32])
    tx = optax.adamw(1e-3)
    _, pit, dense = sparse_training.make_steps(cfg, tile, tx)
    params = jax.jit(dense.init)(jax.random.PRNGKey(2), data[0], data[1])
    err_out, err_grad, dead = sparse_training.check(cfg, tile, params, data, 0.3, pit, dense)
    assert err_out < F32_TOL
    assert err_grad < 1e-4
    assert dead == 0.0


@pytest.mark.parametrize("stacked", [False, True])
def test_weight_indexes_batched_per_shape(stacked):
    """`pruning.weight_indexes` builds one index per kernel shape, each kernel's in buffers
    of its own (one pit_index_split call per shape, no slices): each kernel's index lists
    the same live blocks (counts equal, lists equal as sets, unused slots past the count
    ignored) as that kernel's own `index_from_tiles`. The masks come per kernel, or
    stacked per shape (`live_blocks_by_shape`), whose live fraction is the per-kernel one."""
    rng = np.random.default_rng(11)
    tile = (32, 64)
    shapes = {"a/qkv": (96, 192), "b/qkv": (96, 192), "a/out": (64, 100), "b/out": (64, 100), "c/out": (64, 100)}
    blocks = {n: jnp.asarray(rng.random((-(-k // 32), -(-m // 64))) < 0.4) for n, (k, m) in shapes.items()}
    blocks["c/out"] = jnp.zeros_like(blocks["c/out"])  # an empty kernel among live ones
    by_shape = pruning.stack(blocks, shapes)
    assert pruning.unstack(by_shape).keys() == blocks.keys()
    if stacked:  # the names are static: only the stacked masks are traced
        names = {k: v[0] for k, v in by_shape.items()}
        build = lambda b: pruning.weight_indexes({k: (names[k], v) for k, v in b.items()}, tile)
        arg = {k: v[1] for k, v in by_shape.items()}
    else:
        build, arg = (lambda b: pruning.weight_indexes(b, tile, shapes)), blocks
    got = jax.jit(build)(arg)
    hlo = jax.jit(build).lower(arg).as_text()
    assert hlo.count("@pit_index_split(") == 2 and "@pit_index(" not in hlo and "slice" not in hlo
    np.testing.assert_allclose(float(pruning.live_fraction(by_shape, tile)),
                               float(pruning.live_fraction(blocks, tile, shapes)), rtol=1e-6)
    for n, b in blocks.items():
        want = pit_jax.index_from_tiles(b, tile, shapes[n], group_by="both")
        g = got[n]
        assert (g.shape, g.micro_tile, g.group_by) == (want.shape, want.micro_tile, want.group_by)
        for lists, counts, wl, wc in ((g.tiles[None], g.count[None], want.tiles[None], want.count[None]),
                                      (g.row_tiles, g.row_count, want.row_tiles, want.row_count),
                                      (g.col_tiles, g.col_count, want.col_tiles, want.col_count)):
            np.testing.assert_array_equal(np.asarray(counts), np.asarray(wc), err_msg=n)
            for lst, c, wlst in zip(np.asarray(lists), np.asarray(counts), np.asarray(wl)):
                assert sorted(lst[:c]) == sorted(wlst[:c]), n


def _same_step(step, ref_step, params, s0, data, d):
    """Runs two training steps from the same state; asserts the same loss and update
    (relative to the reference's update); returns (step's params, both live fractions)."""
    p, _, loss, live = jax.jit(step)(params, s0, *data, d)
    p_ref, _, loss_ref, live_ref = jax.jit(ref_step)(params, s0, *data, d)
    assert abs(float(loss) - float(loss_ref)) < F32_TOL * max(1.0, abs(float(loss_ref)))
    moved_err = max(jax.tree_util.tree_leaves(jax.tree_util.tree_map(
        lambda a, b, c: float(jnp.max(jnp.abs((a - c) - (b - c)))) / max(float(jnp.max(jnp.abs(b - c))), 1e-12),
        p, p_ref, params)))
    assert moved_err < 1e-4
    return p, live, live_ref


MIXED_ROUTES = {"qkv": "dense", "attn_out": "w", "ffn_in": "dense", "ffn_out": "w"}


@pytest.mark.parametrize("routes, row_norms", [(MIXED_ROUTES, False), (MIXED_ROUTES, True), (None, True)])
def test_sparse_training_routes_match_masked_dense(routes, row_norms):
    """A pit step with some linears on the dense STile (masked kernel) and the others on
    the W axis (or all on the W axis), its layer norms flax's or pit_jax's (`row_norms`):
    the same loss, gradients and update as the masked dense twin; gradients zero outside
    the live blocks either way."""
    import sparse_training

    cfg = bert.BertConfig.tiny(layers=2)
    tile = (32, 64)
    data = _batch(cfg, 2, 32, 6, lengths=[32, 32])
    tx = optax.sgd(0.1)
    steps, pit, dense = sparse_training.make_steps(cfg, tile, tx, routes=routes, row_norms=row_norms)
    assert pit.row_norms == row_norms
    params = jax.jit(dense.init)(jax.random.PRNGKey(6), data[0], data[1])
    s0 = tx.init(params)
    d = jnp.float32(0.4)
    p_pit, live_pit, live_ref = _same_step(steps["pit"], steps["dense_masked"], params, s0, data, d)
    assert abs(float(live_pit) - float(live_ref)) < 1e-6
    ms = pruning.masks(params, 0.4, tile)
    for name, w_old in pruning.pruned_kernels(params).items():
        moved = np.asarray(pruning.pruned_kernels(p_pit)[name] != w_old)
        assert not (moved & ~np.asarray(ms[name])).any(), name
    # With row_norms the norms are pit_jax's row layer norm.
    assert ("pit_row_layer_norm" in str(jax.make_jaxpr(steps["pit"])(params, s0, *data, d))) == row_norms


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tied_layers_match_flax(dtype):
    """pit_models.tied's LayerNorm and Dense against flax's on fresh random inputs with a
    batch dim and a mean away from 0: the same outputs and gradients (x and every
    parameter) within the dtype's rounding, and each backward ties its column sums to the
    cotangent it passes on (an optimization barrier in its jaxpr)."""
    rng = np.random.default_rng()
    x = jnp.asarray(rng.normal(size=(3, 37, 48)) * 2.0 + 0.5, dtype)
    ct_norm = jnp.asarray(rng.normal(size=x.shape), dtype)
    ct_dense = jnp.asarray(rng.normal(size=(3, 37, 24)), dtype)
    # bf16: the two compute the same 16-bit products in other orders; results of ~20 differ
    # by a few bf16 ulps (0.0625-0.125 each): 2.2e-2 seen once against a bound of 2e-2
    tol = F32_TOL if dtype == jnp.float32 else 4e-2
    pairs = ((nn.LayerNorm(epsilon=1e-5, dtype=dtype), tied.LayerNorm(epsilon=1e-5, dtype=dtype), ct_norm),
             (nn.Dense(24, dtype=dtype), tied.Dense(24, dtype=dtype), ct_dense))
    for ref, got, ct in pairs:
        params = ref.init(jax.random.PRNGKey(0), x)
        # parameters away from their initial ones and biases
        params = jax.tree_util.tree_map(lambda v: v + 0.3 * jnp.asarray(rng.normal(size=v.shape), v.dtype), params)
        assert jax.tree_util.tree_structure(got.init(jax.random.PRNGKey(0), x)) == jax.tree_util.tree_structure(params)
        loss = lambda m: lambda p, x: jnp.sum(m.apply(p, x).astype(jnp.float32) * ct.astype(jnp.float32))  # noqa: E731
        assert _rel(got.apply(params, x), ref.apply(params, x)) < tol
        g_got, g_ref = jax.grad(loss(got), (0, 1))(params, x), jax.grad(loss(ref), (0, 1))(params, x)
        for a, b in zip(jax.tree_util.tree_leaves(g_got), jax.tree_util.tree_leaves(g_ref)):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert _rel(a, b) < tol, type(got).__name__
        assert "optimization_barrier" in str(jax.make_jaxpr(jax.grad(loss(got), (0, 1)))(params, x))


@pytest.mark.parametrize("routes", [MIXED_ROUTES, None])
def test_sparse_training_tied_sums_match(routes):
    """make_steps(tied_sums=True): the pit step (some linears on the W axis) equals its
    masked dense twin, and the tied unpruned step the untied one (same loss and update),
    the tied layers in every model's jaxpr."""
    import sparse_training

    cfg = bert.BertConfig.tiny(layers=2)
    data = _batch(cfg, 2, 32, 9, lengths=[32, 32])
    tx = optax.sgd(0.1)
    steps, pit, dense = sparse_training.make_steps(cfg, (32, 64), tx, routes=routes, tied_sums=True)
    plain = sparse_training.make_steps(cfg, (32, 64), tx)[0]
    assert pit.tied_sums and dense.tied_sums
    params = jax.jit(dense.init)(jax.random.PRNGKey(9), data[0], data[1])
    s0 = tx.init(params)
    d = jnp.float32(0.4)
    _same_step(steps["pit"], steps["dense_masked"], params, s0, data, d)
    _same_step(steps["dense"], plain["dense"], params, s0, data, d)
    for name in ("pit", "dense"):
        jaxpr = str(jax.make_jaxpr(steps[name])(params, s0, *data, d))
        # per layer: two norms and four bias adds, and the embeddings' norm
        assert jaxpr.count("optimization_barrier") >= 6 * cfg.layers + 1, name


def test_sparse_training_dense_rownorm_matches_dense():
    """The unpruned step on pit_jax's row kernels (`dense_rownorm`, pit_rownorm's baseline):
    the dense step's loss and update (no block held still), its norms pit_jax's."""
    import sparse_training

    cfg = bert.BertConfig.tiny(layers=2)
    data = _batch(cfg, 2, 32, 8, lengths=[32, 32])
    tx = optax.sgd(0.1)
    steps, _, dense = sparse_training.make_steps(cfg, (32, 64), tx)
    params = jax.jit(dense.init)(jax.random.PRNGKey(8), data[0], data[1])
    s0 = tx.init(params)
    d = jnp.float32(0.3)
    _, live_rn, _ = _same_step(steps["dense_rownorm"], steps["dense"], params, s0, data, d)
    assert float(live_rn) == 1.0
    assert "pit_row_layer_norm" in str(jax.make_jaxpr(steps["dense_rownorm"])(params, s0, *data, d))


def test_sparse_training_plan_routes_and_bad_routes():
    import sparse_training

    cfg = bert.BertConfig.tiny(layers=1)
    data = _batch(cfg, 2, 32, 7, lengths=[32, 32])
    _, _, dense = sparse_training.make_steps(cfg, (32, 64), optax.sgd(0.1))
    params = jax.jit(dense.init)(jax.random.PRNGKey(7), data[0], data[1])
    for d in (0.5, 0.02):
        routes = sparse_training.plan_routes(params, d, (32, 64), 64, jnp.float32)
        assert set(routes) == set(bert.LINEARS) and set(routes.values()) <= set(sparse_training.ROUTES)
    with pytest.raises(ValueError, match="routes must map"):
        sparse_training.make_steps(cfg, (32, 64), optax.sgd(0.1), routes={"qkv": "sparse"})
    with pytest.raises(ValueError, match="routes must map"):
        sparse_training.make_steps(cfg, (32, 64), optax.sgd(0.1), routes={"fc1": "w"})
    with pytest.raises(ValueError, match="masked_cast must be 'pit', 'jnp' or 'pit_all'"):
        sparse_training.make_steps(cfg, (32, 64), optax.sgd(0.1), masked_cast="xla")


def test_sparse_training_masked_cast_pit_equals_jnp():
    """The pit step's dense-routed kernels masked by pit_jax.mask_blocks (the default; with
    "pit_all" the W-axis kernels too) or by multiplying with element masks: the same step
    (bf16 compute). The masked kernels are
    the same bits (test_mask_blocks); the two programs' other reductions may fuse apart,
    and on an H200 5 of 6208 elements of one parameter came out 1 ulp apart, so the
    parameters are compared to float32 rounding."""
    import sparse_training

    cfg = bert.BertConfig.tiny(layers=2, dtype=jnp.bfloat16)
    data = _batch(cfg, 2, 32, 5, lengths=[32, 20])
    tx = optax.sgd(0.1)  # updates proportional to the gradients (adam can magnify an ulp near 0)
    routes = {"qkv": "dense", "attn_out": "dense", "ffn_in": "w", "ffn_out": "dense"}
    steps = {c: jax.jit(sparse_training.make_steps(cfg, (32, 64), tx, routes=routes, masked_cast=c)[0]["pit"])
             for c in ("pit", "jnp", "pit_all")}
    dense = sparse_training.make_steps(cfg, (32, 64), tx)[2]
    params = jax.jit(dense.init)(jax.random.PRNGKey(5), data[0], data[1])
    state = sparse_training.init_state("pit", params, tx.init(params), (32, 64), routes)
    runs = {c: (params, state) for c in steps}
    for _ in range(2):
        for c in steps:
            *runs[c], loss, _ = steps[c](*runs[c], *data, jnp.float32(0.5))
            runs[c].append(float(loss))
        for c in ("pit", "pit_all"):  # against the element masks' multiply
            np.testing.assert_allclose(runs[c][2], runs["jnp"][2], rtol=1e-6, err_msg=c)
            for x, y in zip(jax.tree_util.tree_leaves(runs[c][0]), jax.tree_util.tree_leaves(runs["jnp"][0])):
                np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-8, err_msg=c)
        runs = {c: tuple(r[:2]) for c, r in runs.items()}


def test_sparse_training_mask_recomputed_each_step():
    import sparse_training

    cfg = bert.BertConfig.tiny(layers=1)
    tile = (32, 1)
    data = _batch(cfg, 4, 32, 3, lengths=[32] * 4)
    tx = optax.sgd(0.5)  # large steps: the magnitude ranking changes between steps
    steps, _, dense = sparse_training.make_steps(cfg, tile, tx)
    params = jax.jit(dense.init)(jax.random.PRNGKey(3), data[0], data[1])
    step = jax.jit(steps["pit"])
    p, s = params, tx.init(params)
    prev = pruning.masks(p, 0.3, tile)
    changed, losses = False, []
    for density in (0.3, 0.3, 0.1):
        p_new, s, loss, live = step(p, s, *data, jnp.float32(density))
        losses.append(float(loss))
        ms = pruning.masks(p, density, tile)  # the mask this step used
        assert abs(float(live) - float(pruning.live_fraction(ms))) < 1e-6
        # dead weights got no gradient: with sgd they do not move
        for name, w_old in pruning.pruned_kernels(p).items():
            w_new = pruning.pruned_kernels(p_new)[name]
            moved = np.asarray(w_new != w_old)
            assert not (moved & ~np.asarray(ms[name])).any(), name
        cur = pruning.masks(p_new, 0.3, tile)
        changed |= any(bool((cur[n] != prev[n]).any()) for n in cur)
        prev, p = cur, p_new
    assert changed, "the magnitude mask never changed between steps"
    assert np.isfinite(losses).all()


@pytest.mark.parametrize("tile", [(32, 64), (32, 1), (1, 32)])
def test_pruning_partial_scores_pick_the_same_blocks(tile):
    """`partial_scores` finished by `block_topk(partials, partial_tile(tile))`: the blocks'
    L1 norms (to float32 rounding) and the same live blocks as block_topk on the kernel,
    edge blocks included (a kernel whose sides are not block multiples), but for blocks
    whose score is within rounding of the cut (the sums run in another order; on the
    GPU XLA's order for the partial sums may change between processes: 1x32's 96 x 192
    case has two such scores and flipped one block in 3 of 5 runs)."""
    rng = np.random.default_rng(12)
    for shape in [(96, 192), (70, 100)]:
        w = jnp.asarray(rng.standard_normal(shape), jnp.float32)
        parts = pruning.partial_scores(w, tile)
        got = pit_jax.block_topk(parts, pruning.partial_tile(tile), 0.3)
        want = pit_jax.block_topk(w, tile, 0.3)
        scores = np.asarray(pruning.block_scores(w, tile))
        np.testing.assert_allclose(np.asarray(got.scores), scores, rtol=1e-5)
        cut = float(np.asarray(want.thresholds))
        differ = np.asarray(got.live) != np.asarray(want.live)
        assert not (differ & (np.abs(scores - cut) > 1e-5 * cut)).any(), (shape, int(differ.sum()))
        assert differ.sum() <= 2, (shape, int(differ.sum()))


@pytest.mark.parametrize("tile, routes", [((32, 64), None), ((32, 64), MIXED_ROUTES), ((32, 1), None)])
def test_sparse_training_scored_state_matches_unscored(tile, routes):
    """The pit step on a `ScoredState` (the block scores of the W-axis linears half-summed
    by the previous update) takes the same steps as on a plain optimizer state (scoring
    the kernels): over three steps with masks that change (large sgd steps), the same
    losses, live fractions and parameters, and the state it returns holds the partial
    scores of the parameters it returns, for the W-axis linears only."""
    import sparse_training

    cfg = bert.BertConfig.tiny(layers=2)
    data = _batch(cfg, 4, 32, 13, lengths=[32] * 4)
    tx = optax.sgd(0.5)
    steps, _, dense = sparse_training.make_steps(cfg, tile, tx, routes=routes)
    params = jax.jit(dense.init)(jax.random.PRNGKey(13), data[0], data[1])
    step = jax.jit(steps["pit"])
    s_plain = sparse_training.init_state("dense", params, tx.init(params), tile, routes)
    s_scored = sparse_training.init_state("pit", params, tx.init(params), tile, routes)
    assert isinstance(s_scored, pruning.ScoredState) and not isinstance(s_plain, pruning.ScoredState)
    w_linears = {k for k in bert.LINEARS if (routes or {}).get(k, "w") == "w"}
    assert {n.split("/")[1] for n in s_scored.partials} == w_linears
    assert len(s_scored.partials) == 2 * len(w_linears)
    p_a, p_b = params, params
    for density in (0.3, 0.3, 0.1):
        p_a, s_plain, loss_a, live_a = step(p_a, s_plain, *data, jnp.float32(density))
        p_b, s_scored, loss_b, live_b = step(p_b, s_scored, *data, jnp.float32(density))
        assert isinstance(s_scored, pruning.ScoredState)
        assert abs(float(loss_a) - float(loss_b)) <= F32_TOL * max(1.0, abs(float(loss_a)))
        assert float(live_a) == float(live_b)
        for a, b in zip(jax.tree_util.tree_leaves(p_a), jax.tree_util.tree_leaves(p_b)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        want = pruning.scored_state(p_b, None, tile).partials
        assert {n.split("/")[1] for n in s_scored.partials} == w_linears
        for n, v in s_scored.partials.items():
            np.testing.assert_allclose(np.asarray(v), np.asarray(want[n]), rtol=1e-6, err_msg=n)
    with pytest.raises(ValueError, match="partials are read by impl='pit' only"):
        pruning.live_blocks_by_shape(params, 0.5, tile, impl="jax", partials=s_scored.partials)


def test_sparse_training_loss_decreases():
    import sparse_training

    cfg = bert.BertConfig.tiny(layers=1)
    data = _batch(cfg, 8, 32, 4, lengths=[32] * 8)
    tx = optax.adamw(3e-3)
    steps, _, dense = sparse_training.make_steps(cfg, (32, 64), tx)
    params = jax.jit(dense.init)(jax.random.PRNGKey(4), data[0], data[1])
    step = jax.jit(steps["pit"])
    p, s = params, tx.init(params)
    losses = []
    for i in range(8):
        p, s, loss, _ = step(p, s, *data, jnp.float32(sparse_training.schedule(i, 8, 0.5, 0.2)))
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0], losses


# -- the Switch MoE stack (PIT Fig. 8) --------------------------------------------------


# top-1 with two MoE layers (the second routes the first's output); top-2 after a dense FFN
@pytest.mark.parametrize("top_k,experts,moe_every", [(1, 4, 1), (2, 8, 2)])
def test_switch_modes_agree(top_k, experts, moe_every):
    """pit, ragged and dense expert computations on one parameter tree: same hidden
    states, same gradient for every parameter (router included, through the gates)."""
    cfg = switch.SwitchConfig.tiny(top_k=top_k, experts=experts, moe_every=moe_every)
    rng = np.random.default_rng()  # fresh data every run (float32: the modes agree on any input)
    tokens, labels = switch.synthetic_batch(rng, cfg, 3, 11)
    params = jax.jit(switch.SwitchClassifier(cfg, "pit").init)(jax.random.PRNGKey(int(rng.integers(1 << 30))), tokens)
    outs, grads = {}, {}
    for mode in switch.MODES:
        model = switch.SwitchClassifier(cfg, mode)
        outs[mode] = jax.jit(model.apply)(params, tokens)
        grads[mode] = jax.jit(jax.grad(functools.partial(switch.loss_fn, model)))(params, tokens, labels)
    assert np.isfinite(np.asarray(outs["pit"][1])).all()
    for mode in ("ragged", "dense"):
        assert _rel(outs["pit"][0], outs[mode][0]) < F32_TOL, mode
        assert _rel(outs["pit"][1], outs[mode][1]) < F32_TOL, mode
        errs = jax.tree_util.tree_map(_rel, grads["pit"], grads[mode])
        assert max(jax.tree_util.tree_leaves(errs)) < 1e-4, (mode, errs)
    router = grads["pit"]["params"]["layer_0" if moe_every == 1 else "layer_1"]["moe"]["router_kernel"]
    assert float(jnp.abs(router).max()) > 0, "the router trains through the gates"


def test_switch_rejects_unknown_mode():
    cfg = switch.SwitchConfig.tiny()
    tokens = jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="mode must be one of"):
        switch.SwitchClassifier(cfg, "sparse").init(jax.random.PRNGKey(0), tokens)


def test_switch_token_agreement_tolerates_few_rerouted_tokens():
    ref = np.linspace(-1.0, 1.0, 100 * 8, dtype=np.float32).reshape(100, 8)
    out = ref.copy()
    out[3] += 0.5  # one token sent to another expert: O(1) off
    r = switch.token_agreement(out, ref, 1e-1)
    assert r["ok"] and r["tokens_over_tol"] == 0.01 and r["max_rel_err"] == 0.5
    out[10:15] -= 0.5  # 6 % of the tokens off is arithmetic, not routing
    assert not switch.token_agreement(out, ref, 1e-1)["ok"]


def test_train_step_ms_runs_a_training_loop():
    """common.train_step_ms: the step's p and s are donated and chained (the first call on
    copies: the caller's arrays stay valid and unchanged); a positive median."""
    calls = []

    def step(p, s, x):
        calls.append(1)  # traced once
        return p + x, s + 1, jnp.sum(p)

    p0, s0, x = jnp.zeros((4,)), jnp.zeros((), jnp.int32), jnp.ones((4,))
    r = common.train_step_ms(step, (p0, s0, x), reps=3)
    assert r["median_ms"] > 0 and r["reps"] == 3 and r["min_ms"] <= r["median_ms"] <= r["max_ms"]
    assert float(jnp.sum(p0)) == 0.0 and int(s0) == 0 and len(calls) == 1
