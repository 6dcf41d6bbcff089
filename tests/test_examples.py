"""The examples run (small sizes) and the training loss goes down."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import sparse_mlp  # noqa: E402


def test_sparse_mlp_trains():
    losses, _ = sparse_mlp.train(steps=40, batch=128, dim=32, hidden=96, log_every=0)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


# -- issue 7 workloads (examples/bert_varlen.py, opt_activation.py, sparse_training.py, switch_moe.py) --


def test_bert_varlen_example():
    import bert_varlen

    r = bert_varlen.main(["--batch", "4", "--layers", "1", "--steps", "3", "--no-timing"])
    assert r["ok"] and len(r["losses"]) == 3 and 0 < r["density"] < 1


def test_opt_activation_example():
    import opt_activation

    r = opt_activation.main(["--batch", "2", "--max-len", "64"])
    assert r["ok"] and 0 < r["tile_density"] < 1 and set(r["ms"]) == {"pit", "pit_m", "dense"}


def test_sparse_training_example():
    import sparse_training

    r = sparse_training.main(["--layers", "1", "--steps", "3", "--no-timing", "--tile", "32x1"])
    assert r["ok"] and r["dead_grad"] == 0.0 and r["live"][-1] < r["live"][0]


def test_switch_moe_example():
    import switch_moe

    r = switch_moe.main(["--layers", "2", "--top-k", "2", "--steps", "8", "--no-timing"])
    assert r["ok"] and len(r["losses"]) == 8 and r["losses"][-1] < r["losses"][0]


# -- issue 5: a transformer block with pit_jax.flax.MoE (examples/moe_transformer.py) --


def test_moe_transformer_trains():
    import math

    import moe_transformer

    losses, _ = moe_transformer.train(steps=60, experts=8, top_k=2, batch=16, log_every=0)
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


def test_data_parallel_example():
    """Plain jit over the host devices (conftest: 4): nothing of pit_jax's is gathered and
    the loss goes down."""
    import jax
    import pytest

    if len(jax.devices()) < 2:
        pytest.skip("needs 2+ devices of the default backend")
    import data_parallel

    r = data_parallel.main(["--steps", "30", "--batch", str(2 * len(data_parallel.devices()))])
    assert r["gathers"] == 0 and r["devices"] >= 2
    assert sum(r["losses"][-5:]) / 5 < 0.7 * sum(r["losses"][:5]) / 5
