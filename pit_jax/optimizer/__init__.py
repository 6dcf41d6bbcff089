"""The STile optimizer: pick the micro-tile, compute tile and PIT axis (or dense) that
covers an observed sparsity at the least cost.

    p = pit_jax.plan(sample_x, w.shape, jnp.bfloat16)   # on the host, milliseconds
    print(p)                                             # chosen STile, expected ms, runner-up
    y = pit_jax.sparse_dense(x, w, plan=p)               # p is static: fine under jit

`database` holds the profiled variants per GPU model (pit_jax/stile_db/*.json),
`cost_model` simulates covering a sample with each candidate, `plan` is the result.
See docs/optimizer.md.
"""

from pit_jax.optimizer.database import Database, DatabaseError
from pit_jax.optimizer.plan import Candidate, Plan
from pit_jax.optimizer.planner import plan

__all__ = ["Candidate", "Database", "DatabaseError", "Plan", "plan"]
