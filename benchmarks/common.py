"""Timing and reporting shared by pit_jax's benchmarks.

Timing: each timed call runs the op on several independent input sets (rotation,
so inputs do not sit in L2 between uses) inside ONE jitted function, and that
function is dispatched back to back many times; wall time over the number of ops,
after warm-up, median over repeats. With ops of tens of microseconds or more the GPU
queue never drains, so this is device time; for shorter ops it is an upper bound.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

L2_BYTES = 50 * 2**20  # H100; rotate through several times this


def device_info() -> dict:
    dev = jax.devices()[0]
    import pit_jax

    return {
        "device": dev.device_kind,
        "platform": dev.platform,
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "pit_jax": pit_jax.__version__,
        "pit_jax_build": {k: {kk: str(vv) for kk, vv in v.items()} for k, v in pit_jax._native.build_info().items()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        # XLA's flags change what is timed (e.g. its command buffers' scheduling mode)
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def rotations(bytes_per_set: int, max_sets: int = 16) -> int:
    """How many input sets to rotate through so that together they overflow L2 4x."""
    return int(max(2, min(max_sets, -(-4 * L2_BYTES // max(1, bytes_per_set)))))


def time_calls(call: Callable[[], object], *, reps: int, target_s: float, budget_s: float | None = None,
               min_calls: int = 20, max_calls: int = 1000) -> dict:
    """Milliseconds per `call()` (warm already), back to back: "samples" (one per repeat),
    "reps", "calls_per_rep". The calls per repeat come from a median of 3 blocked calls:
    at least `min_calls`, since a repeat pays the first call's dispatch and the last one's
    drain unoverlapped (with 3-5 calls of a ~2 ms model that added 0.3 ms per call to a
    1.6 ms BERT inference on the H200). `budget_s` caps the repeats (at least 3)."""
    once_s = []
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        once_s.append(time.perf_counter() - t0)
    once = max(statistics.median(once_s), 1e-6)
    calls = int(max(min_calls, min(max_calls, target_s / once)))
    if budget_s is not None:
        reps = int(max(3, min(reps, budget_s / (calls * once))))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = None
        for _ in range(calls):
            out = call()
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / calls * 1e3)
    return {"samples": samples, "reps": reps, "calls_per_rep": calls}


def time_op(
    fn: Callable,
    arg_sets: Sequence[tuple],
    *,
    reps: int = 15,
    target_s: float = 0.02,
    keep_output: bool = False,
    budget_s: float | None = None,
    device_calls: int = 0,
    min_calls: int = 20,
) -> dict:
    """Median milliseconds of one `fn(*args)` over the rotated `arg_sets`.

    With `keep_output`, the result also holds "output": what `fn` returned for
    `arg_sets[0]` on the warm-up call (for a correctness check at no extra compile).
    With `budget_s`, an op so slow that `reps` repeats would take longer than that
    gets fewer repeats (at least 3). With `device_calls`, the same compiled function is
    then traced over that many calls and the result also holds the device time
    ("device_ms", "kernels_per_op"; see `_traced_kernels`) when the trace has GPU kernels.
    """
    k = len(arg_sets)
    flat = [a for args in arg_sets for a in args]
    n_args = len(arg_sets[0])

    @jax.jit
    def many(*flat_args):
        return [fn(*flat_args[i * n_args : (i + 1) * n_args]) for i in range(k)]

    first = jax.block_until_ready(many(*flat))  # compile + warm up
    first = first[0] if keep_output else None
    t = time_calls(lambda: many(*flat), reps=reps, target_s=target_s, budget_s=budget_s, min_calls=min_calls,
                   max_calls=1000)
    samples = [v / k for v in t["samples"]]
    out = {
        "median_ms": statistics.median(samples),
        "min_ms": min(samples),
        "max_ms": max(samples),
        "reps": t["reps"],
        "calls_per_rep": t["calls_per_rep"],
        "rotations": k,
    }
    if keep_output:
        out["output"] = first
    if device_calls and jax.default_backend() != "cpu":  # a CPU trace holds no GPU kernels
        out.update(_traced_kernels(many, flat, device_calls, k) or {})
    return out


def trace_kernels(call: Callable[[], object], calls: int) -> list:
    """The GPU kernels of `calls` back-to-back `call()`s in a profiler trace, as
    (name, start_us, duration_us) tuples; empty when the trace holds none (CPU)."""
    import glob
    import gzip
    import shutil
    import tempfile

    d = tempfile.mkdtemp()
    try:
        with jax.profiler.trace(d):
            out = None
            for _ in range(calls):
                out = call()
            jax.block_until_ready(out)
        files = glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True)
        if not files:
            return []
        with gzip.open(files[0]) as f:
            events = json.load(f)["traceEvents"]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    gpu = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
           and "gpu" in e["args"]["name"].lower()}
    return [(e["name"], e["ts"], e["dur"]) for e in events if e.get("ph") == "X" and e.get("pid") in gpu and "dur" in e]


def _traced_kernels(many: Callable, flat: Sequence, calls: int, ops_per_call: int) -> dict | None:
    """Device time per op of an already warm `many`: the summed durations of its GPU
    kernels in a profiler trace of `calls` back-to-back dispatches. Unlike the wall time
    it leaves out the gaps between dispatches (host work per jitted call). None when the
    trace holds no GPU kernels.
    """
    kernels = [dur for _, _, dur in trace_kernels(lambda: many(*flat), calls)]
    if not kernels:
        return None
    ops = calls * ops_per_call
    return {"device_ms": sum(kernels) / ops * 1e-3, "kernels_per_op": len(kernels) / ops}


class TooSlow(RuntimeError):
    """A bounded baseline's single call went over its time budget."""


def time_bounded(
    fn: Callable,
    arg_sets: Sequence[tuple],
    *,
    budget_s: float = 2.0,
    reps: int = 5,
    slow_s: float = 0.05,
    keep_output: bool = False,
) -> dict:
    """Times a baseline that may be very slow, never spending much more than needed.

    Compiles `fn` for `arg_sets[0]` alone and runs it once. If that call takes more
    than `budget_s`, raises `TooSlow` (the caller records null with the reason).
    A call slower than `slow_s` is timed on that one input set (L2 residency does not
    matter at that scale): the median of `reps` calls counting the first. Faster ones
    go through `time_op` on (at most) two rotated sets with `reps` repeats.
    """
    args = tuple(arg_sets[0])
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    first = jax.block_until_ready(compiled(*args))
    once = time.perf_counter() - t0
    if once > budget_s:
        raise TooSlow(f"one call took {once:.2f} s (budget {budget_s:g} s)")
    if once > slow_s:
        samples = [once * 1e3]
        for _ in range(max(0, reps - 1)):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            samples.append((time.perf_counter() - t0) * 1e3)
        out = {
            "median_ms": statistics.median(samples),
            "min_ms": min(samples),
            "max_ms": max(samples),
            "reps": len(samples),
            "calls_per_rep": 1,
            "rotations": 1,
        }
        if keep_output:
            out["output"] = first
    else:
        del first
        out = time_op(fn, list(arg_sets[:2]), reps=reps, target_s=0.01, keep_output=keep_output)
    out["compile_s"] = compile_s
    return out


def target_verdict(entries: Sequence[dict]) -> dict:
    """What a suite reports of one target from its entries (each with `met` True, False or
    None and, when known, `margin_pct`, positive = headroom): met only when every entry is
    known and met, how many are, and the worst entry (the least headroom)."""
    known = [e for e in entries if e["met"] is not None]
    met = None if not known or len(known) < len(entries) else all(e["met"] for e in known)
    worst = min(known, key=lambda e: e["margin_pct"]) if known else None
    return {"met": met, "cases_met": sum(1 for e in known if e["met"]), "cases": len(entries), "worst": worst}


def rescore_file(path: str, score: Callable[[dict], list]) -> list:
    """Rewrites the `targets` of an existing results file as `score(data)` computes them
    now, and notes when in its meta; the measurements are not touched."""
    with open(path) as f:
        data = json.load(f)
    data["targets"] = score(data)
    data["meta"].setdefault("rescored", []).append(
        datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    dump_json(path, data)
    return data["targets"]


def copy_bandwidth_gbs(nbytes: int = 2**30) -> float:
    """Device copy bandwidth, bytes read + written per second, in GB/s."""
    sets = [(jnp.full((nbytes // 4,), float(i), jnp.float32),) for i in range(2)]
    t = time_op(lambda x: x + 1.0, sets, reps=7)
    return 2 * nbytes / (t["median_ms"] * 1e-3) / 1e9


def write_results(suite: str, payload: dict, out: str | None = None) -> str:
    """Writes `payload` as `<suite>_<device>_<date>.json` in the folder `out` (default
    benchmarks/results), or as `out` itself when it names a .json file; returns the path
    (the suites put their PNG beside it)."""
    if out is not None and out.endswith(".json"):
        path = out
    else:
        dev = payload["meta"]["device"].replace(" ", "_")
        day = payload["meta"]["date"][:10]
        path = os.path.join(out or os.path.join(os.path.dirname(__file__), "results"), f"{suite}_{dev}_{day}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    dump_json(path, payload)
    return path


def add_out_argument(ap) -> None:
    """The suites' `--out`: where `write_results` puts the results (and the PNG beside them)."""
    ap.add_argument("--out", default=None, help="output folder (default benchmarks/results) or a .json file path")


def save_figure(fig, path: str) -> None:
    """Lays out, writes (PNG at 110 dpi) and closes a suite's matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def dump_json(path: str, payload: dict) -> None:
    """Writes a results file the one way every suite does (also when it is rewritten)."""
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)


def table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))
    return "\n".join(out)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def random_normal(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def np_bytes(*arrays) -> int:
    return int(sum(np.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in arrays))
