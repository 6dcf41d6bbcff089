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


# -- which GPUs: the capability check and the switch to the generic kernels -----------------


class _FakeGpu:
    def __init__(self, cc: str, kind: str = "Fake GPU"):
        self.compute_capability, self.device_kind = cc, kind


@pytest.fixture
def fake_gpu(monkeypatch):
    """Sets what `_lowering` sees as the first CUDA device; clears cuda_is_sm90's cache around."""
    from pit_jax.primitives import _lowering

    def use(cc, kind="Fake GPU"):
        monkeypatch.setattr(_lowering, "_first_cuda_device", lambda: _FakeGpu(cc, kind))
        _lowering.cuda_is_sm90.cache_clear()

    yield use
    _lowering.cuda_is_sm90.cache_clear()


def test_gpu_older_than_the_kernels_is_a_clear_error(fake_gpu):
    """Below compute capability 8.0 no kernel of pit_jax can load (sm_80 machine code and
    compute_80 PTX): the CUDA lowering says so, naming the target, the device and its
    capability, instead of the launch failing with CUDA's "no kernel image is available"."""
    from pit_jax.primitives import _lowering

    fake_gpu("7.5", "Tesla T4")
    with pytest.raises(NotImplementedError, match=r"capability 8\.0 or newer .*Tesla T4 has 7\.5, so 'pit_index'"):
        _lowering.check_cuda_device("pit_index")
    for cc in ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0", ""):  # "": capability unknown, no check
        fake_gpu(cc)
        _lowering.check_cuda_device("pit_index")


def test_old_gpu_error_comes_from_the_lowering(fake_gpu):
    """The same error when a jitted pit_jax function is lowered for CUDA (here on the CPU)."""
    import jax
    import jax.numpy as jnp

    if not _native.has_cuda():
        pytest.skip("built without the CUDA module: its lowering says that instead")
    fake_gpu("7.0", "Tesla V100")
    f = jax.jit(lambda x: pit_jax.index(x, "row").count)
    with pytest.raises(NotImplementedError, match=r"Tesla V100 has 7\.0, so 'pit_index'"):
        f.trace(jnp.ones((8, 4), jnp.float32)).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("value,allowed", [(None, True), ("", True), ("1", True), ("0", False), ("0 (generic)", False)])
def test_hopper_switch(monkeypatch, fake_gpu, value, allowed):
    """PIT_JAX_HOPPER=0 runs the generic kernels on a Hopper too (the native launchers read
    the same variable): the lowerings then choose as for any other GPU."""
    from pit_jax.primitives import _lowering

    if value is None:
        monkeypatch.delenv("PIT_JAX_HOPPER", raising=False)
    else:
        monkeypatch.setenv("PIT_JAX_HOPPER", value)
    fake_gpu("9.0", "NVIDIA H200")
    assert _lowering.hopper_kernels_allowed() is allowed
    assert _lowering.cuda_is_sm90() is allowed
    fake_gpu("10.0", "NVIDIA B200")  # not Hopper: the generic kernels either way
    assert _lowering.cuda_is_sm90() is False


def _fatbin_entries(path: str) -> list:
    """(kind, arch) of every entry of the CUDA fat binaries in the ELF file `path`: kind 1 is
    PTX, 2 machine code; arch 80 is sm_80 / compute_80, 90 sm_90a. (The container's layout:
    a 16-byte header per fat binary, magic 0xBA55ED50, then entries of kind, header size and
    payload size, the arch at byte 28 of an entry's header; cuobjdump lists the same.)"""
    import struct

    data = open(path, "rb").read()
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]

    def name(sec):
        start = names + sec[0]
        return data[start:data.index(b"\0", start)].decode()

    out = []
    for sec in sections:
        if name(sec) != ".nv_fatbin":
            continue
        pos, end_all = sec[4], sec[4] + sec[5]
        while pos + 16 <= end_all:
            magic, _, header, size = struct.unpack_from("<IHHQ", data, pos)
            if magic != 0xBA55ED50:  # padding between fat binaries
                pos += 8
                continue
            entry, end = pos + header, pos + header + size
            while entry < end:
                kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
                out.append((kind, struct.unpack_from("<I", data, entry + 28)[0]))
                entry += entry_header + payload
            pos = end
    return out


def test_cuda_module_carries_ptx_for_newer_gpus():
    """The generic kernels ship compute_80 PTX beside their sm_80 code (one of each per
    kernel file), so GPUs newer than the machine code compile them on first use; the
    Hopper kernels ship sm_90a code (docs/gpu.md, "Which GPUs")."""
    if not _native.has_cuda():
        pytest.skip("built without the CUDA module")
    entries = _fatbin_entries(_native._cuda.__file__)
    ptx80, sass80 = entries.count((1, 80)), entries.count((2, 80))
    assert ptx80 > 0 and ptx80 == sass80, entries
    assert (2, 90) in entries, entries


def test_attention_shared_memory_is_checked_at_lowering(fake_gpu):
    """varlen_attention stages a whole short sequence in a block's shared memory (up to 171
    KB: head_dim 128, seq 128, backward), a longer one's chunks (103 KB at head_dim 128,
    backward; the backward of grouped kv heads at any length): where the GPU gives a block
    less, the CUDA lowering says so, naming the sizes and the device; where it fits, it
    lowers."""
    import jax
    import jax.numpy as jnp

    if not _native.has_cuda():
        pytest.skip("built without the CUDA module: its lowering says that instead")

    def lower(s, d, grad=False, grouped=False):
        q = jnp.ones((2, s, 2 if grouped else 1, d), jnp.bfloat16)
        ln = jnp.array([3, s], jnp.int32)
        def f(q):  # k, v: q's single head, or the first of q's two (grouped)
            return jnp.sum(pit_jax.varlen_attention(q, q[:, :, :1], q[:, :, :1], ln).astype(jnp.float32))
        return jax.jit(jax.grad(f) if grad else f).trace(q).lower(lowering_platforms=("cuda",))

    fake_gpu("8.0", "NVIDIA A100")  # 163 KB: head_dim 128's backward at seq 128 (171 KB) does not fit
    lower(128, 128)
    with pytest.raises(NotImplementedError, match=r"backward of seq 128 at head_dim 128 stages 171 KB .* 163 KB of "
                                                  r"NVIDIA A100 \(compute capability 8\.0\)"):
        lower(128, 128, grad=True)
    lower(128, 96, grad=True)
    lower(64, 128, grad=True)
    lower(128, 128, grad=True, grouped=True)  # grouped kv heads: the long kernels' 103 KB
    fake_gpu("8.9", "NVIDIA GeForce RTX 4090")  # 99 KB: head_dim 64's backward at seq 128 (107 KB) does not
    with pytest.raises(NotImplementedError, match=r"backward of seq 128 at head_dim 64 stages 107 KB .* 99 KB"):
        lower(128, 64, grad=True)
    lower(128, 64)
    lower(64, 64, grad=True)
    # Longer sequences stage 64-token chunks: 103 KB at head_dim 128 backward, any length.
    with pytest.raises(NotImplementedError, match=r"backward of seq 1000 at head_dim 128 stages 103 KB .* 99 KB"):
        lower(1000, 128, grad=True)
    lower(1000, 128)
    lower(4096, 64, grad=True)
    with pytest.raises(NotImplementedError, match=r"backward of seq 16 at head_dim 128 stages 103 KB .* 99 KB"):
        lower(16, 128, grad=True, grouped=True)
    lower(16, 128, grouped=True)
    fake_gpu("8.0", "NVIDIA A100")
    lower(1000, 128, grad=True)
    fake_gpu("9.0", "NVIDIA H200")
    for d in (64, 80, 96, 128):
        lower(128, d, grad=True)
        lower(2048, d, grad=True)
