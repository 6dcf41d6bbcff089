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
