"""The examples run (small sizes) and the training loss goes down."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import sparse_mlp  # noqa: E402


def test_sparse_mlp_trains():
    losses, _ = sparse_mlp.train(steps=40, batch=128, dim=32, hidden=96, log_every=0)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
