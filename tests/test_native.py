"""The native registry: FFI targets registered, build versions, FFI API mismatch errors."""

import pytest

import pit_jax
from pit_jax import _native


def test_cpu_targets_registered():
    assert "pit_index" in _native.targets("cpu")
    info = _native.build_info()["cpu"]
    assert info["platform"] == "cpu" and len(info["ffi_api_version"]) == 2


def test_cuda_module_is_optional():
    # Present where nvcc was found at build time, absent elsewhere; importing pit_jax
    # never needs a GPU either way.
    if _native.has_cuda():
        assert _native.targets("CUDA") == _native.targets("cpu")
        assert _native.build_info()["CUDA"]["cuda_runtime_version"] >= 12000
    else:
        assert _native.targets("CUDA") == frozenset()


@pytest.mark.parametrize(
    "jaxlib,api",
    [("0.8.0", None), ("0.8.1", (0, 2)), ("0.9.0", (0, 2)), ("0.9.1", (0, 3)), ("0.10.2", (0, 3)),
     ("0.11.0", (0, 3)), ("0.11.1", (0, 4)), ("0.11.2", (0, 4)), ("1.0.0", (0, 4)), ("0.11.2.dev20261001", (0, 4))],
)
def test_runtime_ffi_api_table(jaxlib, api):
    assert _native.runtime_ffi_api_version(jaxlib) == api


def test_newer_headers_than_runtime_is_a_readable_error():
    info = {"platform": "CUDA", "jaxlib_version": "0.11.2", "ffi_api_version": (0, 4)}
    with pytest.raises(ImportError, match=r"built against the XLA FFI API 0\.4 .*jaxlib 0\.10\.2 provides FFI API 0\.3"):
        _native.check_ffi_compatible(info, "0.10.2")
    _native.check_ffi_compatible(info, "0.11.2")  # same: fine
    older = {"platform": "cpu", "jaxlib_version": "0.10.2", "ffi_api_version": (0, 3)}
    _native.check_ffi_compatible(older, "0.11.2")  # older headers run on newer runtimes


def test_version():
    assert pit_jax.__version__
