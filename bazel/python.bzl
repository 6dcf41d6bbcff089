"""Macros for pit_jax's Python extension modules and pytest-driven tests."""

load("@local_config_cuda//:defs.bzl", "CUDA_ENABLED")
load("@local_config_python//:defs.bzl", "EXT_SUFFIX")

def pybind_extension(name, srcs, deps = [], copts = [], **kwargs):
    """A pybind11 extension module `name`, built as `name + EXT_SUFFIX` for $PIT_PYTHON.

    Also defines the filegroup `name`, so other rules need not know the suffix.
    """
    so = name + EXT_SUFFIX
    native.cc_binary(
        name = so,
        srcs = srcs,
        deps = deps + ["@pybind11"],
        copts = copts + ["-fvisibility=hidden", "-fexceptions"],
        linkshared = 1,
        linkstatic = 1,
        **kwargs
    )
    native.filegroup(name = name, srcs = [":" + so], visibility = kwargs.get("visibility"))

def pytest_test(name, srcs, deps = [], data = [], args = [], **kwargs):
    """A py_test that runs pytest over `srcs` (one or more test_*.py files)."""
    native.py_test(
        name = name,
        srcs = srcs + ["//tests:pytest_main.py"],
        main = "//tests:pytest_main.py",
        args = ["$(rootpath %s)" % s for s in srcs] + args,
        deps = deps,
        data = data,
        python_version = "PY3",
        srcs_version = "PY3",
        **kwargs
    )

def cuda_pybind_extension(name, **kwargs):
    """`pybind_extension` defined only where the CUDA toolkit was found."""
    if CUDA_ENABLED:
        pybind_extension(name = name, **kwargs)
