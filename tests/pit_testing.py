"""Helpers for pit_jax's tests: fresh random data, platforms, tile-level checks."""

from __future__ import annotations

import math
import os
import secrets

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def available_platforms() -> list[str]:
    """"cpu" always; "gpu" where JAX sees a GPU (the CUDA targets run there)."""
    platforms = ["cpu"]
    try:
        if jax.devices("gpu"):
            platforms.append("gpu")
    except RuntimeError:
        pass
    return platforms


PLATFORMS = available_platforms()

# kPackedRowPad (cuda/common/moe_params.h): pit_sread_live zeroes packed rows up to the next
# multiple of it, so the packed weight gradient may read whole stages.
PACKED_ROW_PAD = 192

requires_gpu = pytest.mark.skipif("gpu" not in PLATFORMS, reason="no GPU visible to JAX")


def device(platform: str):
    return jax.devices(platform)[0]


def put(platform: str, *arrays):
    """Commits arrays to `platform`'s first device, so jit runs them there."""
    out = tuple(jax.device_put(a, device(platform)) for a in arrays)
    return out if len(out) > 1 else out[0]


def assert_call_raises(platform, pattern, call):
    """jit(call)() on `platform`'s device raises an error matching `pattern` (a raw FFI
    target's handler refusing its operands: the message names the target)."""
    with jax.default_device(device(platform)):
        with pytest.raises(Exception, match=pattern):
            jax.block_until_ready(jax.jit(call)())


def run(platform, fn, *arrays):
    """jit(fn) on `platform`'s device; results as NumPy."""
    args = put(platform, *arrays)
    out = jax.jit(fn)(*(args if len(arrays) > 1 else (args,)))
    return jax.tree_util.tree_map(np.asarray, out)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a test's child Python process: this one's, with the child's GPU
    memory taken on demand (this process has already preallocated most of the GPU), plus
    `extra`."""
    env = dict(os.environ)
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env.update(extra)
    return env


def randn(rng, shape, dtype):
    """Dense random values, none zero, exactly representable in `dtype`."""
    x = rng.standard_normal(shape).astype(np.float32)
    x = np.where(np.abs(x) < 1e-2, 0.5, x)
    return x.astype(jnp.dtype(dtype))


def f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def bits(x) -> np.ndarray:
    """A float array's bit patterns (32- or 16-bit words), for bit-for-bit comparisons."""
    x = np.asarray(x)
    return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16)


def assert_trees_close(got, want, rtol, atol):
    """assert_allclose leaf by leaf over two pytrees of the same structure."""
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol),
                           got, want)


def dname(dtype) -> str:
    return jnp.dtype(dtype).name


def fresh_rng() -> tuple[np.random.Generator, int]:
    """A new generator on every call (fresh data every run); PIT_TEST_SEED replays one."""
    seed = int(os.environ.get("PIT_TEST_SEED", secrets.randbits(32)))
    return np.random.default_rng(seed), seed


def tiled_sparse(rng, shape, tile, density, dtype):
    """Random array whose live micro-tiles (any element non-zero) have the given density.

    Live tiles hold a random subset of non-zero normal values (at least one element);
    dead tiles hold zeros, half of them -0.0 for float dtypes (which must count as zero).
    Returns (array as numpy in `dtype`, live tile mask [..., tile_rows, tile_cols]).
    """
    *lead, rows, cols = shape
    h, w = tile
    tr, tc = math.ceil(rows / h), math.ceil(cols / w)
    live = rng.random((*lead, tr, tc)) < density
    elem_live = np.repeat(np.repeat(live, h, -2), w, -1)[..., :rows, :cols]
    keep = elem_live & (rng.random(shape) < 0.5)
    # Every live tile keeps at least its top-left element.
    corner = np.zeros((*lead, tr * h, tc * w), bool)
    corner[..., ::h, ::w] = live
    keep |= corner[..., :rows, :cols]
    if np.dtype(dtype) == np.bool_:
        return keep, live
    values = rng.standard_normal(shape).astype(np.float32)
    values = np.where(np.abs(values) < 1e-3, 1.0, values)  # no value rounds to zero in f16/bf16
    zeros = np.where(rng.random(shape) < 0.5, -0.0, 0.0).astype(np.float32)
    x = np.where(keep, values, zeros)
    return np.asarray(jnp.asarray(x, dtype)), live


def live_tiles(x: np.ndarray, tile) -> np.ndarray:
    """NumPy reference: bool [..., tile_rows, tile_cols], any element non-zero."""
    x = np.asarray(x, np.float32) if x.dtype != np.bool_ else x
    *lead, rows, cols = x.shape
    h, w = tile
    tr, tc = math.ceil(rows / h), math.ceil(cols / w)
    nz = np.zeros((*lead, tr * h, tc * w), bool)
    nz[..., :rows, :cols] = x != 0
    return nz.reshape(*lead, tr, h, tc, w).any(axis=(-3, -1))


def live_rows(rng, lead, m, tile_h, density) -> np.ndarray:
    """bool [*lead, M]: whole row blocks of tile_h rows live with probability `density`."""
    blocks = rng.random((*lead, math.ceil(m / tile_h))) < density
    return np.repeat(blocks, tile_h, -1)[..., :m]


def row_index(live, tile_h, capacity=None):
    """(the PitIndex of a [..., M] row mask's blocks of tile_h rows, its flat (tiles, count))."""
    import pit_jax
    from pit_jax.ops.sread_swrite import flat_index

    idx = pit_jax.index(live[..., None], (tile_h, 1), capacity=capacity)
    return idx, flat_index(idx, tuple(live.shape[:-1]), "test", "x")


def check_sums(got, want, dtype, rows, msg):
    """Column sums over `rows` rows (float32 accumulation, rounded once to `dtype`) against
    float64: max error relative to the largest sum (at least 1) within the rounding (2^-9
    / 2^-12 for bf16 / f16) plus float32's accumulation error."""
    tol = {"float32": 1e-6 * max(1.0, math.sqrt(rows)), "bfloat16": 4e-3, "float16": 1e-3}[dname(dtype)]
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    err = np.abs(f64(got) - want).max(initial=0.0) / scale
    assert err <= tol, f"{msg}: max error {err} relative to max |sum| = {scale}"


def listed_rows(index, rows: int) -> np.ndarray:
    """bool [rows]: the rows a row index (micro-tile (1, ...)) lists within its capacity,
    i.e. its first min(count, capacity) slots (a list too short for every live row drops
    the rest)."""
    tiles = np.asarray(index.tiles)
    listed = np.zeros(rows, bool)
    listed[tiles[:min(int(index.count), tiles.shape[-1])]] = True
    return listed


def check_list(slots: np.ndarray, count: int, expected: np.ndarray, what: str, capacity: int | None = None,
               universe: int | None = None):
    """`slots[:count]` is exactly the set `expected` (any order, no duplicates); the rest is
    negative: the other ids of range(universe) as -1 - id when given (a full-capacity flat
    list), else -1."""
    expected = np.sort(np.asarray(expected))
    assert count == len(expected), f"{what}: count {count} != {len(expected)} live"
    n = min(count, slots.shape[-1] if capacity is None else capacity)
    got = np.sort(slots[:n])
    assert len(np.unique(got)) == n, f"{what}: duplicate slots {got}"
    if n == len(expected):
        np.testing.assert_array_equal(got, expected, err_msg=f"{what}: wrong tiles")
    else:
        assert np.isin(got, expected).all(), f"{what}: listed tiles that are not live"
    if universe is not None:
        dead = np.setdiff1d(np.arange(universe), expected)
        np.testing.assert_array_equal(np.sort(-1 - slots[n:]), dead, err_msg=f"{what}: dead tail is not -1 - dead ids")
    else:
        assert (slots[n:] == -1).all(), f"{what}: unused slots not marked -1: {slots[n:]}"


# Step for check_grads on the (bi)linear ops. What it differentiates numerically is a
# polynomial of degree <= 3 (order-2 "rev" differentiates vjp(f)(f(x))), so the central
# difference's truncation error is ~step^2 while float32 rounding of the quotient is
# ~1e-7 / step: at the default step 1e-4 rounding alone reached ~5 % of the projections
# in about 1 run in 15. 1e-2 keeps both near 1e-4 relative.
BILINEAR_FD_STEP = 1e-2

# Raw FFI targets: max error allowed, relative to the reference's max abs value.
FFI_TOL = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2}
FFI_TF32_TOL = 5e-3  # float32 with allow_tf32: TF32 tensor cores (10-bit mantissa) may be used


def check_close(got, ref, dtype, msg, allow_tf32=False, exact=None):
    """A target's output against a float64 reference: max error <= tol * max|ref|, no NaN
    left from the poison; `exact` (bool mask) elements must equal ref exactly."""
    got = f64(got)
    assert got.shape == ref.shape, f"{msg}: shape {got.shape} != {ref.shape}"
    assert not np.isnan(got).any(), f"{msg}: NaN in the output (an element was not written)"
    tol = FFI_TF32_TOL if allow_tf32 and dname(dtype) == "float32" else FFI_TOL[dname(dtype)]
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    scale = scale if scale > 0 else 1.0
    err = float(np.abs(got - ref).max()) if ref.size else 0.0
    assert err <= tol * scale, f"{msg}: max error {err:.3g} > {tol} * {scale:.3g}"
    if exact is not None:
        bad = np.flatnonzero((got != ref) & exact)
        assert bad.size == 0, f"{msg}: {bad.size} elements differ where they must be exact (e.g. flat {bad[:5]})"


# The FFI's `activation` codes (pit_row_gather_matmul) by sparse_dense's names.
ACTIVATION_NAMES = {0: None, 1: "relu", 2: "gelu", 3: "gelu_exact", 4: "silu"}


def activation64(v, name):
    """sparse_dense's named activations in float64 (jax.nn's formulas; "gelu" is the tanh
    approximation)."""
    if name == "relu":
        return np.maximum(v, 0.0)
    if name == "gelu":
        return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))
    if name == "gelu_exact":
        return 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0)))
    if name in ("silu", "swish"):
        return v / (1.0 + np.exp(-v))
    return v


def unfused_z64(x, w, b64, dtype) -> np.ndarray:
    """x @ w + b in float64 as sparse_dense's unfused path (a callable activation) forms
    it: the product rounded to dtype, then its sum with the bias (b64, a value of dtype)
    rounded again. With cancellation that differs from the exact sum by more than the
    16-bit tolerances, so references of that path round the same way."""
    return f64(jnp.asarray(f64(jnp.asarray(f64(x) @ f64(w)).astype(dtype)) + b64).astype(dtype))


def attention64(q, k, v, dout, scale, causal=False, window=None, out_dtype=None):
    """(out, lse, dq, dk, dv) of one sequence and head in float64 (q, k, v, dout [n, d]
    float64; causal: keys j <= i; a window (left, right): keys i - left <= j <= i + right).
    out_dtype: the dtype the forward stores its output in. The backward reads that stored
    output for delta = rowsum(dout * out), as FlashAttention's does; at bfloat16 its
    rounding alone moves dK and dQ by up to ~1 % of their largest element (seen: 1.1 %)."""
    n = q.shape[0]
    s = scale * q @ k.T
    ahead = np.arange(n)[None, :] - np.arange(n)[:, None]  # key - query
    sees = np.ones((n, n), bool) if not causal else ahead <= 0
    if window is not None:
        sees &= (ahead <= window[1]) & (ahead >= -window[0])
    s = np.where(sees, s, -np.inf)
    m = s.max(1, keepdims=True)
    p = np.exp(s - m)
    l_ = p.sum(1, keepdims=True)
    p /= l_
    o = p @ v
    dp = dout @ v.T
    o_stored = o if out_dtype is None else o.astype(out_dtype).astype(np.float64)
    ds = p * (dp - (dout * o_stored).sum(1, keepdims=True))
    return o, (m + np.log(l_))[:, 0], scale * ds @ k, scale * ds.T @ q, p.T @ dout
