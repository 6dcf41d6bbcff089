"""Device time of a fixed set of kernel cases, for A/B timing of two or more builds.

    python3 benchmarks/device_ab.py [--only stile,moe,index] [--small]

Run it by path, not with `-m`: `python -m` puts the working directory first on sys.path,
and with it the checkout's own `pit_jax/`, so `PYTHONPATH=build/ab/pkg_X:.` could not
pick the build under test. `scripts/gpu_ab.sh` runs it (or any other script) once per
build, alternating the builds over rounds in one machine start; builds differ between
machine starts by 1-4 %, which is the size of the effects these cases look for
(docs/gpu.md, docs/notes/sm90_stile.md runs 9-10).

Cases (bf16, random normal data, 4 rotated input sets, device time of 10 traced calls):
  stile  sparse_dense with a given index: 4096^3, K axis 32x1 at sparsity 0.5 / 0.9 /
         0.99 (x's live tiles), 1x64 weight blocks at 0.9 (the Hopper STile kernel).
  moe    moe_index + grouped_matmul at PIT Fig. 8 shapes (D 768, F 3072, top-1):
         T 4096 E 64 uniform and Zipf, T 1024 E 64 uniform (bench_moe's pit_first).
  index  pit_jax.index of a 4096^2 matrix at 90 % sparsity: 1x64 by column, 32x64 both,
         32x1 by row, 1x8 by row (the walk, narrow-walk and register modes).
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

# The checkout's root last, so that a pit_jax earlier on PYTHONPATH is the one under test.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pit_jax  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.bench_index import matrix_sets  # noqa: E402
from benchmarks.bench_moe import input_sets, pit_first  # noqa: E402

GROUPS = ("stile", "moe", "index")
ROTATIONS = 4


def stile_cases(small):
    n = 256 if small else 4096
    key = jax.random.PRNGKey(0)
    for axis, tile, s in (("k", (32, 1), 0.5), ("k", (32, 1), 0.9), ("k", (32, 1), 0.99), ("w", (1, 64), 0.9)):
        # The sparse operand's (h, w) tiles live with probability 1 - s, the other dense.
        sparse = [m for (m,) in matrix_sets(key, n, tile, 1 - s, jnp.bfloat16, ROTATIONS)]
        dense = [common.random_normal(jax.random.fold_in(key, i), (n, n), jnp.bfloat16) for i in range(ROTATIONS)]
        if axis == "k":
            sets = [(x, w, pit_jax.index(x, tile, group_by="row")) for x, w in zip(sparse, dense)]
        else:
            sets = [(x, w, pit_jax.index(w, tile, group_by="col")) for x, w in zip(dense, sparse)]

        def fn(x, w, i, a=axis, t=tile):
            return pit_jax.sparse_dense(x, w, axis=a, micro_tile=t, index=i)

        yield f"{axis} {tile[0]}x{tile[1]} s={s}", fn, sets


def moe_cases(small):
    d, f = (64, 128) if small else (768, 3072)
    shapes = ((256, 8, "uniform"), (256, 8, "zipf")) if small else (
        (4096, 64, "uniform"), (4096, 64, "zipf"), (1024, 64, "uniform"))
    for t, e, kind in shapes:
        # Seeded: every build times the same data.
        yield f"T={t} E={e} {kind}", pit_first, input_sets(np.random.default_rng(0), t, d, f, e, 1, kind, ROTATIONS)


def index_cases(small):
    n = 256 if small else 4096
    for tile, by in (((1, 64), "col"), ((32, 64), "both"), ((32, 1), "row"), ((1, 8), "row")):
        sets = matrix_sets(jax.random.PRNGKey(0), n, tile, 0.1, jnp.bfloat16, ROTATIONS)

        def fn(x, t=tile, b=by):
            return pit_jax.index(x, t, group_by=b)

        yield f"{tile[0]}x{tile[1]} {by}", fn, sets


CASES = {"stile": stile_cases, "moe": moe_cases, "index": index_cases}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated subset of {','.join(GROUPS)}")
    ap.add_argument("--small", action="store_true", help="tiny shapes (a CPU smoke run; no device time there)")
    args = ap.parse_args(argv)
    groups = args.only.split(",")
    bad = [g for g in groups if g not in CASES]
    if bad:
        ap.error(f"--only: unknown groups {bad}; expected a subset of {list(GROUPS)}")
    print(f"device_ab on {common.device_info()['device']}, jax {jax.__version__}, pit_jax from "
          f"{os.path.dirname(pit_jax.__file__)}", flush=True)
    rows = []
    for group in groups:
        for label, fn, sets in CASES[group](args.small):
            r = common.time_op(fn, sets, reps=3 if args.small else 9, device_calls=10, min_calls=2 if args.small else 20)
            row = {"group": group, "case": label, "wall_us": r["median_ms"] * 1e3}
            if r.get("device_ms"):
                row["device_us"] = r["device_ms"] * 1e3
            rows.append(row)
            device = f"{row['device_us']:.1f} us" if "device_us" in row else "-"
            print(f"{group} {label}: wall {row['wall_us']:.1f} us, device {device}", flush=True)
    return rows


if __name__ == "__main__":
    main()
