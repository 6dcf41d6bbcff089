"""pytest configuration shared by every test file."""

import os

# Tests compare against float64 references on the host.
os.environ.setdefault("JAX_ENABLE_X64", "0")
# Four host devices, so that test_sharding can build a mesh without GPUs (set before any
# backend starts; where GPUs are the default backend this only adds host devices).
_xla_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _xla_flags:
    os.environ["XLA_FLAGS"] = (_xla_flags + " --xla_force_host_platform_device_count=4").strip()


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


@pytest.fixture(scope="module")
def poison_outputs():
    """Native handlers fill their outputs with NaN bytes before computing, so an element a
    kernel fails to write shows up. Modules opt in with
    `pytestmark = pytest.mark.usefixtures("poison_outputs")`."""
    import pit_jax

    modules = [m for m in (pit_jax._native._cpu, pit_jax._native._cuda) if m is not None]
    for m in modules:
        m.set_poison_outputs(True)
    yield
    for m in modules:
        m.set_poison_outputs(False)
