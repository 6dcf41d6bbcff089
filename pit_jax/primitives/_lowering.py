"""Lowering helpers shared by pit_jax's primitives: one FFI target per platform."""

from __future__ import annotations

import functools
import math
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir

from pit_jax import _activations, _native
from pit_jax.primitives import _partition
from pit_jax.primitives._vma import Primitive


def _attrs(params: dict, names: Sequence[str]) -> dict:
    # Ints go as i64 (Attr<int64_t>), bools as i1 (Attr<bool>).
    out = {}
    for name in names:
        value = params[name]
        if isinstance(value, (bool, np.bool_)):
            out[name] = bool(value)
        elif isinstance(value, (int, np.integer)):
            out[name] = np.int64(value)
        else:
            out[name] = value
    return out


def register_ffi_lowerings(prim: Primitive, target: str, attr_names: Sequence[str], *, core) -> None:
    """Lowers `prim` to the FFI target `target` on CPU and CUDA, passing `attr_names` params.
    `core` = (operands' ranks, results' ranks) without batch dims (`_partition`)."""
    lower = jax.ffi.ffi_lowering(target)

    def rule(ctx, *args, **params):
        return lower(ctx, *args, **_attrs(params, attr_names))

    _partition.register(prim, *core)
    register_platforms(prim, _partition.batch_partitioned(prim, rule), target)


def register_platforms(prim: Primitive, rule: Callable, target: str, cuda_rule: Callable | None = None) -> None:
    """Registers `rule` as `prim`'s CPU lowering and `cuda_rule` (default: `rule`) as its CUDA
    one, or, in a build without the CUDA module, a CUDA rule that names `target` and says why
    it cannot run. The CUDA rule first checks the GPU's compute capability (`check_cuda_device`)."""
    mlir.register_lowering(prim, rule, platform="cpu")
    cuda_rule = rule if cuda_rule is None else cuda_rule
    cuda = _device_checked(cuda_rule, target) if _native.has_cuda() else _missing_cuda(target)
    mlir.register_lowering(prim, cuda, platform="cuda")


# The generic kernels are built for sm_80 (machine code, and PTX that the driver compiles
# for newer GPUs on first use); the sm_90a ones run on compute capability 9.0 only.
MIN_COMPUTE_CAPABILITY = (8, 0)


def _first_cuda_device():
    try:
        devices = jax.devices("cuda")
    except RuntimeError:  # no GPU here (e.g. lowering for CUDA on a CPU machine)
        return None
    return devices[0] if devices else None


def _capability(device) -> tuple[int, int] | None:
    text = str(getattr(device, "compute_capability", "") or "")
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def check_cuda_device(target: str) -> None:
    """Raises at lowering time, naming `target`, where the GPU is older than any kernel pit_jax
    ships (the launch would otherwise fail with CUDA's "no kernel image is available")."""
    device = _first_cuda_device()
    cc = None if device is None else _capability(device)
    if cc is not None and cc < MIN_COMPUTE_CAPABILITY:
        need = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
        raise NotImplementedError(
            f"pit_jax's CUDA kernels need a GPU of compute capability {need} or newer (Ampere, Ada, "
            f"Hopper, Blackwell); {getattr(device, 'device_kind', 'this GPU')} has {cc[0]}.{cc[1]}, so "
            f"'{target}' cannot run on it. Run on the CPU, or set PIT_JAX_REFERENCE=1 to use the "
            f"pure-JAX references."
        )


def _device_checked(rule: Callable, target: str) -> Callable:
    def checked(ctx, *args, **params):
        check_cuda_device(target)
        return rule(ctx, *args, **params)

    return checked


def _missing_cuda(target: str) -> Callable:
    def rule(ctx, *args, **params):
        raise NotImplementedError(
            f"pit_jax was built without its CUDA module, so '{target}' cannot run on the GPU. "
            f"Rebuild where nvcc is available (see docs/gpu.md), run on the CPU, or set "
            f"PIT_JAX_REFERENCE=1 to use the pure-JAX references."
        )

    return rule


def register_traced_lowering(
    prim: Primitive, fn: Callable, targets: Sequence[str], cuda_fn: Callable | None = None, *, core
) -> None:
    """Lowers `prim` by tracing `fn` (jnp glue + jax.ffi.ffi_call to `targets`) per platform;
    `cuda_fn`, when given, replaces `fn` on CUDA (e.g. to feed a kernel its preferred layout).
    `core` = (operands' ranks, results' ranks) without batch dims, each a tuple or a
    callable of the params: under jit over several devices the op is split over its first
    batch dim (`_partition`)."""
    _partition.register(prim, *core)
    traced = lambda f: _partition.batch_partitioned(prim, mlir.lower_fun(f, multiple_results=prim.multiple_results))  # noqa: E731
    register_platforms(prim, traced(fn), ", ".join(targets), None if cuda_fn is None else traced(cuda_fn))


# PIT_JAX_HOPPER=0 runs the generic kernels on a Hopper too, as on any other GPU (testing
# them where the fast kernels would run, A/B timing). Read once per process, as the native
# launchers read it (cuda/kernels/sm90/launch_util.h): unset or empty means on, a value
# starting with "0" off.
HOPPER_ENV_VAR = "PIT_JAX_HOPPER"


def hopper_kernels_allowed() -> bool:
    return not os.environ.get(HOPPER_ENV_VAR, "").startswith("0")


@functools.lru_cache(maxsize=None)
def cuda_is_sm90() -> bool:
    """Whether the first CUDA device is a Hopper (compute capability 9.0), where the
    sm_90a kernels run and some lowerings feed them a layout of their own (and
    PIT_JAX_HOPPER does not turn them off)."""
    device = _first_cuda_device()
    return device is not None and _capability(device) == (9, 0) and hopper_kernels_allowed()


def tf32_k_major(b, trans_b, *, dtype, allow_tf32):
    """B as the CUDA row-gather target wants it for a TF32 product: Hopper's TF32 wgmma
    reads B K-major only, so one transposed copy of w (a small fraction of the product)
    keeps the product on tensor cores instead of FFMA. Other products: unchanged."""
    if allow_tf32 and dtype == jnp.float32 and not trans_b:
        return jnp.swapaxes(b, -1, -2), True
    return b, trans_b


# Codes of the `activation` attribute of the row-gather and grouped targets
# (cuda/common/matmul_params.h's Activation; the grouped one takes only none and relu).
ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_exact": 3, "silu": 4, "swish": 4}


def dead_row_value(bias, activation, dtype):
    """act(bias) [N] in `dtype`, the value the fused products' dead rows hold: the bias
    rounded to `dtype` first (as the kernels round a float32 one), the activation in
    float32, rounded once. The first rounding is lax.reduce_precision, not a convert
    pair: XLA on the GPU may fold f32 -> bf16 -> f32 away (excess precision allowed)."""
    b = bias.astype(jnp.float32)
    if bias.dtype != dtype and dtype != jnp.float32:
        fi = jnp.finfo(dtype)
        b = jax.lax.reduce_precision(b, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)
    return (b if activation is None else _activations.ACTIVATIONS[activation](b)).astype(dtype)


def row_index_folds(tiles, rows_shape, tile_h) -> bool:
    """Whether a row index (tiles [*B, M / tile_h] of x's [*B, M] rows in blocks of tile_h)
    can be folded into one index of the B * M stacked rows (`folded_row_index`): batched,
    at full capacity (live then dead slots), and M a multiple of tile_h so the entries'
    blocks line up in the stacked rows."""
    *lead, m = rows_shape
    return bool(lead) and m % tile_h == 0 and tuple(tiles.shape) == (*lead, m // tile_h)


def folded_row_index(tiles, count):
    """The row index of each entry of a batch [*B] -> one index of their stacked rows: the
    live slots of every entry first (entry order), then the dead ones (`-1 - id`), ids
    offset by the entry's first row block. A fixed function of the index, so the products
    stay deterministic."""
    n, tr = math.prod(tiles.shape[:-1]), tiles.shape[-1]
    tiles, count = tiles.reshape(n, tr), jnp.clip(count.reshape(n), 0, tr)
    dead = tr - count
    i = jnp.arange(tr, dtype=jnp.int32)
    off = (jnp.arange(n, dtype=jnp.int32) * tr)[:, None]
    live = i < count[:, None]
    pos = jnp.where(live, (jnp.cumsum(count) - count)[:, None] + i,
                    n * tr - 1 - ((jnp.cumsum(dead) - dead)[:, None] + (tr - 1 - i)))
    vals = jnp.where(live, tiles + off, tiles - off)  # a dead slot's -1 - id shifts the other way
    folded = jnp.zeros((n * tr,), jnp.int32).at[pos.reshape(-1)].set(vals.reshape(-1), unique_indices=True)
    return folded, count.sum(dtype=jnp.int32)


def pack_live_rows(m, tiles, count, *, tile_h):
    """pit_sread_live: the listed row blocks of m [..., rows, cols] packed in list order,
    [..., capacity * tile_h, cols], zeros past the count (the raw count: the target clamps
    it). One spelling for every caller, so that XLA's CSE merges identical packings (the M
    axis's weight gradient and dx both read dy's)."""
    lead, cap = tuple(tiles.shape[:-1]), tiles.shape[-1]
    packed = jax.ffi.ffi_call("pit_sread_live", jax.ShapeDtypeStruct(lead + (cap, tile_h, m.shape[-1]), m.dtype))(
        m, tiles, count, tile_h=np.int64(tile_h), tile_w=np.int64(m.shape[-1])
    )
    return packed.reshape(*lead, cap * tile_h, m.shape[-1])


def row_gather_call(a, b, tiles, count, out, *, tile_h, trans_b, allow_tf32, bias=None, activation=None, parts=1,
                    zero_dead=False, skip_dead=False, pre=False, pack_a=False):
    """pit_row_gather_matmul: C = act(A @ op(B) + bias) on the listed row blocks of A,
    act(bias) elsewhere (zeros without a bias or with `zero_dead`). `bias` [N] in A's dtype
    or float32 (the kernel rounds it to A's dtype); the dead rows' value act(bias) is
    computed here once (float32, rounded) and copied there.
    parts=3: pit_row_gather_matmul3, C written as three column parts, each of shape `out`
    (a list of three results). pre (with an activation): pit_row_gather_matmul_pre, [C, Z]
    with Z = A @ op(B) + bias, rounded, on the listed rows (its other rows unwritten).
    skip_dead: C's unlisted rows are left unwritten too (the caller never reads them).
    pack_a: a's listed rows packed first (pack_live_rows, after the fold below: the
    packing the M axis's weight gradient makes of the same operand, which XLA's CSE
    merges with this one), then pit_row_gather_matmul_packed, whose sm_90a kernel reads
    them by TMA (one part, no pre)."""
    if parts not in (1, 3):
        raise ValueError(f"row_gather_call: parts must be 1 or 3 (the targets), got {parts}")
    if pack_a and (parts != 1 or pre):
        raise ValueError("row_gather_call: pack_a needs one part and no pre")
    if b.ndim == 2 and row_index_folds(tiles, a.shape[:-1], tile_h):
        # x batched under a shared w: the entries' rows as one matrix and their lists as
        # one. Per-entry row tiles are cut at each entry's live count, so short entries
        # waste most of a tile (8 x 512 tokens on the H200: forward + backward 1.2-1.4x the
        # stacked rows' time).
        flat = jax.ShapeDtypeStruct((math.prod(a.shape[:-1]), out.shape[-1]), out.dtype)
        ys = row_gather_call(a.reshape(-1, a.shape[-1]), b, *folded_row_index(tiles, count), flat, tile_h=tile_h,
                             trans_b=trans_b, allow_tf32=allow_tf32, bias=bias, activation=activation, parts=parts,
                             zero_dead=zero_dead, skip_dead=skip_dead, pre=pre, pack_a=pack_a)
        unflat = lambda y: y.reshape(out.shape)  # noqa: E731
        return unflat(ys) if parts == 1 and not pre else [unflat(y) for y in ys]
    empty = jnp.zeros((0,), a.dtype)
    dead = empty
    if bias is None:
        bias = empty
    elif not (zero_dead or skip_dead):
        dead = dead_row_value(bias, activation, a.dtype)
    if pre and (parts != 1 or activation is None):
        raise ValueError("row_gather_call: pre needs one part and an activation")
    target, outs = ("pit_row_gather_matmul", out) if parts == 1 else ("pit_row_gather_matmul3", (out,) * parts)
    if pre:
        target, outs = "pit_row_gather_matmul_pre", (out, out)
    operands = (a, b)
    if pack_a:
        target, operands = "pit_row_gather_matmul_packed", (a, pack_live_rows(a, tiles, count, tile_h=tile_h), b)
    return jax.ffi.ffi_call(target, outs)(
        *operands, tiles, count, bias, dead, tile_h=np.int64(tile_h), trans_b=bool(trans_b), allow_tf32=bool(allow_tf32),
        activation=np.int64(ACTIVATION_CODES[activation]), skip_dead=bool(skip_dead),
    )
