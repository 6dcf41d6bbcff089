"""What the workload models and their drivers share: attention over padded batches,
synthetic sequence lengths, a text progress bar, latency and memory measurement."""

from __future__ import annotations

import functools
import math
import os
import statistics
import sys
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import pit_jax

ATTENTION_IMPLS = ("auto", "cudnn", "xla", "pit")


# -- attention ---------------------------------------------------------------------------


def attention(q, k, v, *, lengths=None, key_mask=None, causal=False, padding="right", implementation="xla",
              local_window_size=None):
    """Multi-head attention over a padded batch. q, k, v: [B, S, heads, head_dim].

    `lengths` [B] int32: the first lengths[b] tokens are valid (`padding="right"`: cuDNN
    then skips the padded work) or the last (`padding="left"`: the other implementations
    take it as a key mask); "pit" (`pit_jax.varlen_attention`) computes the valid tokens
    only. `key_mask` [B, S] bool: any padding, applied as a mask (not with "pit"). Rows of
    padded queries are garbage-free (no NaN) but meaningless: callers read valid tokens
    only. `local_window_size`: a sliding window, as jax.nn.dot_product_attention's.
    """
    if implementation == "pit":
        # pit_jax.varlen_attention: padding by lengths, on the valid tokens.
        if lengths is None or key_mask is not None:
            raise ValueError("attention: implementation='pit' takes padding by `lengths` (and `padding`), "
                             "not key_mask")
        return pit_jax.varlen_attention(q, k, v, lengths, causal=causal, padding=padding,
                                        local_window_size=local_window_size)
    if padding == "left":
        if lengths is None or key_mask is not None:
            raise ValueError("attention: padding='left' takes `lengths`, not key_mask")
        key_mask, lengths = left_padding_mask(lengths, q.shape[1]), None
    mask = None
    if key_mask is not None:
        mask = key_mask[:, None, None, :]
    if implementation == "cudnn" and mask is not None:
        # cuDNN takes padding as lengths only; other masks go in as an additive bias, which
        # it takes as [B, 1, S, S] only ("Bias must have same seq length as QKV" for [B, 1,
        # 1, S]: until 2026-11-30 the OPT layer's "auto" fell back to XLA on that).
        s = q.shape[1]
        bias = jnp.broadcast_to(jnp.where(mask, 0.0, -1e9).astype(q.dtype), (q.shape[0], 1, s, s))
        return jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=causal, local_window_size=local_window_size,
                                            implementation="cudnn")
    seq = None if lengths is None else lengths.astype(jnp.int32)
    dtype = q.dtype
    if dtype == jnp.float16 and jax.default_backend() == "cpu":
        q, k, v = (a.astype(jnp.float32) for a in (q, k, v))  # XLA:CPU has no f16 dot accumulating in f32
    out = jax.nn.dot_product_attention(
        q, k, v, mask=mask, is_causal=causal, query_seq_lengths=seq, key_value_seq_lengths=seq,
        local_window_size=local_window_size, implementation=implementation,
    )
    return out.astype(dtype)


def varlen_kernels_apply(batch, seq, cfg, attention=None, causal=False, train=True) -> bool:
    """Whether a model attends by `pit_jax.varlen_attention`'s kernels for a batch of this
    config (its heads, head_dim and dtype), rather than by `attention` (the implementation
    it would use otherwise: "auto", "cudnn" or "xla"; resolved only where it decides).
    Past 128 tokens, bidirectional, the long kernels' forward is faster than cuDNN's and
    their backward slower (8 documents of max 2048 on the H200: 81 against 115 us forward,
    317 against 301 forward + backward; docs/notes/varlen_attention.md), so there cuDNN
    serves where it runs when the call is differentiated (`train`); the kernels beat XLA's
    masked softmax ~11x, and cuDNN with a causal mask over left padding ~5x."""
    from pit_jax.primitives.varlen_attention import SHORT_SEQ, kernel_applies

    if not kernel_applies((batch, seq, cfg.heads, cfg.head_dim), cfg.dtype):
        return False
    if seq <= SHORT_SEQ or causal or attention is None or not train:
        return True
    return resolve_attention(attention, batch, seq, cfg.heads, cfg.head_dim, cfg.dtype) != "cudnn"


@functools.lru_cache(maxsize=None)
def cudnn_attention_works(batch, seq, heads, head_dim, dtype_name, causal=False, key_mask=False):
    """Whether cuDNN attention compiles and runs here for these shapes (tried once, cached).

    jax raises at trace time for unsupported dtypes/shapes and cuDNN itself may refuse
    at compile time (version, head dim, sequence length): trying is the reliable test.
    """
    if jax.default_backend() != "gpu":
        return False
    dtype = jnp.dtype(dtype_name)
    try:
        with jax.ensure_compile_time_eval():  # run it now, also when called while tracing a model
            return _try_cudnn(batch, seq, heads, head_dim, dtype, causal, key_mask)
    except Exception as e:  # noqa: BLE001 - any failure means "do not use it"
        print(f"  (cuDNN attention unavailable for {batch}x{seq}x{heads}x{head_dim} {dtype_name}: "
              f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}; using XLA)", file=sys.stderr)
        return False


def _try_cudnn(batch, seq, heads, head_dim, dtype, causal, key_mask):
    """One cuDNN attention call on zeros of these shapes; True when its output is finite."""
    q = jnp.zeros((batch, seq, heads, head_dim), dtype)
    lengths = jnp.full((batch,), seq, jnp.int32)
    km = jnp.ones((batch, seq), bool) if key_mask else None
    fn = jax.jit(lambda q, l, m: attention(q, q, q, lengths=None if key_mask else l, key_mask=m,
                                           causal=causal, implementation="cudnn"))
    out = jax.block_until_ready(fn(q, lengths, km))
    return bool(np.isfinite(np.asarray(out[0, 0, 0, :1], np.float32)).all())


def resolve_attention(implementation, batch, seq, heads, head_dim, dtype, *, causal=False, key_mask=False):
    """"auto" -> "cudnn" where it works for these shapes, else "xla"."""
    if implementation not in ATTENTION_IMPLS:
        raise ValueError(f"attention implementation must be one of {ATTENTION_IMPLS}, got {implementation!r}")
    if implementation != "auto":
        return implementation
    ok = cudnn_attention_works(batch, seq, heads, head_dim, jnp.dtype(dtype).name, causal, key_mask)
    return "cudnn" if ok else "xla"


# -- synthetic data -----------------------------------------------------------------------

GLUE = dict(max_len=128, mean=40.0, sigma=0.6, min_len=4)
LONG_DOC = dict(max_len=2048, mean=600.0, sigma=0.8, min_len=32)


def sample_lengths(rng: np.random.Generator, batch, *, max_len, mean, sigma, min_len=1):
    """Clipped log-normal lengths with the given mean (before clipping): GLUE's sentence
    lengths are skewed like this, most short, a few near the maximum."""
    mu = math.log(mean) - sigma**2 / 2
    lengths = np.round(np.exp(rng.normal(mu, sigma, size=batch)))
    return np.clip(lengths, min_len, max_len).astype(np.int32)


def right_padding_mask(lengths, seq):
    return jnp.arange(seq)[None, :] < jnp.asarray(lengths)[:, None]


def left_padding_mask(lengths, seq):
    return jnp.arange(seq)[None, :] >= seq - jnp.asarray(lengths)[:, None]


# -- progress ----------------------------------------------------------------------------


class Progress:
    """A text progress bar: redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, total, label="", width=28, stream=None):
        self.total, self.label, self.width = max(1, total), label, width
        self.stream = stream or sys.stdout
        self.done = 0
        self.t0 = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, note=""):
        self.done += 1
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        line = f"{self.label} [{bar}] {self.done}/{self.total} {time.perf_counter() - self.t0:6.1f}s {note}"
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if self.done >= self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


# -- measurement -------------------------------------------------------------------------


def _benchmarks_common():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:
        sys.path.append(root)
    try:
        from benchmarks import common as bc
    except ImportError:  # a packaged example without the benchmarks folder
        return None
    return bc


def latency_ms(fn: Callable, args: Sequence, *, reps=7, budget_s=None) -> dict:
    """Median latency of `fn(*args)` (jitted here): `benchmarks.common.time_op` with one
    input set (a whole model's weights overflow L2 anyway); a plain median of timed calls
    where the benchmarks folder is not shipped."""
    bc = _benchmarks_common()
    if bc is not None:
        t = bc.time_op(fn, [tuple(args)], reps=reps, budget_s=budget_s)
        return {"median_ms": t["median_ms"], "min_ms": t["min_ms"], "max_ms": t["max_ms"], "reps": t["reps"]}
    jf = jax.jit(fn)
    jax.block_until_ready(jf(*args))
    samples = _blocked_samples(lambda: jf(*args), reps)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples), "reps": reps}


class ChainedStep:
    """Calls a training step `step(p, s, *batch) -> (p, s, ...)` (jitted or compiled with p
    and s donated) as a training loop does: each call on the previous call's p and s, the
    first on copies of args' (which stay valid). Called with the same arguments every time
    instead, XLA updates its command buffers on every call, and on the H100 the PIT BERT
    step was host-bound that way: dispatch 6.5 ms per step (5.0-8.2), chained and donated
    3.5 ms (docs/benchmarks.md, "Timing")."""

    def __init__(self, step: Callable, args: Sequence):
        self.step, self.rest = step, tuple(args[2:])
        self.state = jax.tree_util.tree_map(jnp.copy, tuple(args[:2]))

    def __call__(self):
        out = self.step(*self.state, *self.rest)
        self.state = tuple(out[:2])
        return out


def train_step_ms(step: Callable, args: Sequence, *, reps=7, budget_s=None) -> dict:
    """Median ms of a training step `step(p, s, *batch) -> (p, s, ...)` run as a training
    loop (ChainedStep, p and s donated)."""
    call = ChainedStep(jax.jit(step, donate_argnums=(0, 1)), args)
    jax.block_until_ready(call())
    bc = _benchmarks_common()
    if bc is not None:
        samples = bc.time_calls(call, reps=reps, target_s=0.02, budget_s=budget_s)["samples"]
    else:
        samples = _blocked_samples(call, reps)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples),
            "reps": len(samples)}


def _blocked_samples(call: Callable, reps: int) -> list:
    """ms of `reps` calls, each waited for (where the benchmarks folder is not shipped)."""
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def compiled_memory(fn: Callable, args: Sequence) -> Optional[dict]:
    """XLA's memory plan of `fn` compiled alone (bytes): arguments, outputs, temporaries.
    Per executable and deterministic, unlike the process-wide peak counter."""
    try:
        ma = jax.jit(fn).lower(*args).compile().memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend reports it
        return None
    if ma is None:
        return None
    out = {k: int(getattr(ma, k + "_size_in_bytes", 0) or 0) for k in ("argument", "output", "temp", "alias")}
    out["total"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def peak_bytes_in_use() -> Optional[int]:
    """The device allocator's process-wide peak (GPU only; never reset, so it only grows)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001
        return None
    return None if not stats else stats.get("peak_bytes_in_use")


def max_rel_err(a, b, valid=None) -> float:
    """max |a - b| / max |b| over the rows where `valid` (all rows when None), in float32."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if valid is not None:
        valid = np.asarray(valid, bool).reshape(-1)
        a, b = a.reshape(valid.shape[0], -1)[valid], b.reshape(valid.shape[0], -1)[valid]
    scale = max(float(np.abs(b).max()) if b.size else 0.0, 1e-30)
    return float(np.abs(a - b).max()) / scale if a.size else 0.0


# -- drivers ------------------------------------------------------------------------------

TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-1, "float16": 2e-2}  # max |diff| / max |ref|, PIT vs dense


def tolerance(dtype) -> float:
    return TOLERANCE[jnp.dtype(dtype).name]


def describe_device() -> str:
    dev = jax.devices()[0]
    return f"{dev.platform.upper()} ({dev.device_kind}), jax {jax.__version__}"


def speed_lines(times: dict, baseline="dense", alternative=None) -> list:
    """One line per variant: median ms and speed-ups over the dense model and the alternative."""
    lines = []
    base = times.get(baseline)
    alt = times.get(alternative) if alternative else None
    for name, ms in times.items():
        if ms is None:
            lines.append(f"  {name:<14} failed")
            continue
        s = f"  {name:<14} {ms:9.3f} ms"
        if base:
            s += f"   x{base / ms:5.2f} vs {baseline}"
        if alt and name != alternative:
            s += f"   x{alt / ms:5.2f} vs {alternative}"
        lines.append(s)
    return lines


def print_speeds(title: str, times: dict, baseline="dense", alternative=None) -> None:
    """A titled block of `speed_lines`."""
    print(title)
    print("\n".join(speed_lines(times, baseline, alternative)))


def loss_trend(losses: Sequence[float]) -> str:
    """'mean of first / last k steps a -> b' over the first and last fifth of a run."""
    k = max(1, len(losses) // 5)
    return f"mean of first / last {k} steps {np.mean(losses[:k]):.4f} -> {np.mean(losses[-k:]):.4f}"
