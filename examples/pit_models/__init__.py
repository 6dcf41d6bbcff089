"""Flax models of PIT's workloads (issue 7), shared by the examples, the tests and
`benchmarks/bench_workloads.py`.

- `bert`: a BERT-shaped encoder whose linears skip padding rows (M axis, one row index
  per batch) or pruned weight blocks (W axis); `dense=True` gives its nn.Dense twin with
  the same parameter tree.
- `opt`: an OPT-style decoder layer whose fc2 skips dead ReLU activations (K axis).
- `pruning`: per-block magnitude masks and their indexes, recomputed every step.
- `switch`: a Switch-style encoder stack whose MoE FFNs run through pit_jax, through
  sort + `ragged_dot`, or densely (every expert on every token), on one parameter tree.
- `common`: attention with sequence lengths (cuDNN where it serves, else XLA), synthetic
  lengths, a text progress bar, latency and memory measurement.
"""

from pit_models import bert, common, opt, pruning, switch  # noqa: F401
