"""pytest configuration shared by every test file."""

import os

# Tests compare against float64 references on the host.
os.environ.setdefault("JAX_ENABLE_X64", "0")


def pytest_report_header(config):
    import jax

    import pit_jax

    return [
        f"jax {jax.__version__}, devices {jax.devices()}",
        f"pit_jax native: {pit_jax._native.build_info()}",
    ]


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _exact_jax_matmuls():
    # References and jax.test_util.check_grads use jnp dots; on GPUs float32 dots default
    # to TF32, which is not the precision the tests compare at. pit_jax's own ops take
    # their precision from their arguments.
    import jax

    with jax.default_matmul_precision("highest"):
        yield
