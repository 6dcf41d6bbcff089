"""Loads pit_jax's binding modules and registers their FFI targets with XLA.

`_pit_cpu` is required: it carries the CPU implementation of every target, so the
whole primitive -> FFI -> native path runs on any machine. `_pit_cuda` is optional:
it exists where the build found nvcc, links the CUDA runtime statically and needs a
GPU only when a kernel runs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from types import ModuleType

import jax

# XLA FFI C API version shipped by each jaxlib release (first release carrying it).
# A handler compiled against API (major, minor) is rejected by a runtime whose minor is
# older, with XLA's unhelpful "No FFI handler registered"; we say it plainly instead.
_FFI_API_SINCE_JAXLIB = (
    ((0, 11, 1), (0, 4)),
    ((0, 9, 1), (0, 3)),
    ((0, 8, 1), (0, 2)),
)

CPU_PLATFORM = "cpu"
CUDA_PLATFORM = "CUDA"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def runtime_ffi_api_version(jaxlib_version: str) -> tuple[int, int] | None:
    """The FFI API a jaxlib release provides, or None when it predates typed FFI."""
    v = _version_tuple(jaxlib_version)
    for since, api in _FFI_API_SINCE_JAXLIB:
        if v >= since:
            return api
    return None


def check_ffi_compatible(build_info: dict, jaxlib_version: str) -> None:
    """Raises ImportError when the running jaxlib cannot run handlers built as `build_info` says."""
    built = tuple(build_info["ffi_api_version"])
    runtime = runtime_ffi_api_version(jaxlib_version)
    if runtime is None or runtime[0] != built[0] or runtime[1] < built[1]:
        raise ImportError(
            f"pit_jax's {build_info['platform']} module was built against the XLA FFI API "
            f"{built[0]}.{built[1]} (headers of jaxlib {build_info['jaxlib_version']}), but the "
            f"installed jaxlib {jaxlib_version} provides FFI API "
            f"{'none' if runtime is None else f'{runtime[0]}.{runtime[1]}'}. Rebuild pit_jax against "
            f"the oldest jaxlib you run (PIT_PYTHON=<python with that jaxlib> pip install .), or "
            f"upgrade jaxlib."
        )


def _jaxlib_version() -> str:
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source builds
        import jaxlib

        return jaxlib.__version__


def _load(name: str, required: bool) -> ModuleType | None:
    try:
        module = importlib.import_module(f"pit_jax.{name}")
    except ImportError as err:
        if required:
            raise ImportError(
                f"pit_jax's native module {name} is missing or does not match this Python "
                f"({err}). Build it with `pip install .` (or `pip install -e .`) from the pit_jax "
                f"source tree, or run the tests through `bazel test //...`."
            ) from err
        return None
    check_ffi_compatible(module.build_info(), _jaxlib_version())
    return module


_cpu = _load("_pit_cpu", required=True)
_cuda = _load("_pit_cuda", required=False)

for _name, _capsule in _cpu.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform=CPU_PLATFORM)
if _cuda is not None:
    for _name, _capsule in _cuda.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform=CUDA_PLATFORM)


def has_cuda() -> bool:
    """Whether the CUDA targets were built and registered."""
    return _cuda is not None


def targets(platform: str = CPU_PLATFORM) -> frozenset[str]:
    """Names of the FFI targets registered for `platform` ("cpu" or "CUDA")."""
    module = _cpu if platform == CPU_PLATFORM else _cuda
    return frozenset(module.registrations()) if module is not None else frozenset()


def build_info() -> dict:
    """What the native modules were built against, per platform."""
    info = {CPU_PLATFORM: _cpu.build_info()}
    if _cuda is not None:
        info[CUDA_PLATFORM] = _cuda.build_info()
    return info


def export_checks() -> list:
    """The `jax.export` safety checks that pit_jax's custom calls need disabled:

        exp = jax.export.export(jax.jit(f), disabled_checks=pit_jax.export_checks())(*args)

    jax.export refuses custom calls without a compatibility guarantee, and pit_jax's FFI
    targets have none across pit_jax versions (their attributes may change): call or
    deserialize an export with the pit_jax version that made it (importing pit_jax
    registers the targets)."""
    from jax import export

    names = targets(CPU_PLATFORM) | targets(CUDA_PLATFORM)
    return [export.DisabledSafetyCheck.custom_call(name) for name in sorted(names)]
