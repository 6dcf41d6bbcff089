"""`cuda_library`: compiles .cu files with nvcc (one genrule each) into a cc_library.

Bazel 4.2.3 has no CUDA rules we can use offline, so nvcc runs as a plain action.
Machine code is built for Hopper (sm_90a: wgmma, setmaxnreg) and, for kernels that
do not need Hopper-only instructions, for Ampere (sm_80) as well, with their
compute_80 PTX beside it: the driver compiles that PTX on first use for GPUs newer
than the machine code (Blackwell's sm_100 / sm_120; Ada runs the sm_80 code). The
PTX costs no compile time (nvcc makes it on the way to sm_80) but fatbin bytes.
Where the toolkit is absent every macro here defines nothing.
"""

load("@local_config_cuda//:defs.bzl", "CUDA_ENABLED", "CUDA_EXTRA_ARCHS")
load("@cutlass//:defs.bzl", "CUTLASS_FOUND")

ARCH_SM90A = "-gencode=arch=compute_90a,code=sm_90a"
ARCH_SM80 = "-gencode=arch=compute_80,code=sm_80"
ARCH_SM80_PTX = "-gencode=arch=compute_80,code=compute_80"
DEFAULT_ARCHS = [ARCH_SM90A, ARCH_SM80, ARCH_SM80_PTX] + CUDA_EXTRA_ARCHS  # PIT_CUDA_EXTRA_ARCHS

_NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-lineinfo",  # source lines in compute-sanitizer and ncu reports; no runtime cost
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC,-fvisibility=hidden",
]

def cuda_library(name, srcs, hdrs = [], textual_hdrs = [], src_hdrs = {}, archs = DEFAULT_ARCHS,
                 use_cutlass = False, nvcc_flags = [], deps = [], **kwargs):
    """A cc_library of nvcc-compiled objects; defines nothing where CUDA is not enabled.

    Args:
      srcs: .cu files.
      hdrs: headers of this library, exported to dependents and visible to nvcc.
      textual_hdrs: further headers (labels or filegroups) nvcc may include.
      src_hdrs: per source, the further headers it includes (directly or through others),
        in place of all of textual_hdrs, so that editing one header recompiles only the
        sources that include it. nvcc runs in the sandbox of its declared inputs: a
        header left out fails the build, it cannot go stale.
      archs: nvcc -gencode flags.
      use_cutlass: add CUTLASS/CuTe headers (fails where nvidia-cutlass is missing).
    """
    if not CUDA_ENABLED:
        return
    if use_cutlass and not CUTLASS_FOUND:
        fail("%s needs CUTLASS: pip install nvidia-cutlass for $PIT_PYTHON" % name)
    includes = ["-I.", "-I$(GENDIR)"]
    inputs = list(hdrs)
    if use_cutlass:
        includes.append("-Iexternal/cutlass/include")
        inputs.append("@cutlass//:headers")
    objs = []
    for src in srcs:
        obj = "_objs/%s/%s.pic.o" % (name, src.replace("/", "_"))
        native.genrule(
            name = "%s_%s_nvcc" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + inputs + list(src_hdrs.get(src, textual_hdrs)),
            outs = [obj],
            cmd = " ".join(
                ["$(location @local_config_cuda//:nvcc.sh) -c"] + _NVCC_FLAGS + archs + includes +
                nvcc_flags + ["-o $@ $(location %s)" % src],
            ),
            tools = ["@local_config_cuda//:nvcc.sh"],
            message = "nvcc %s" % src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_config_cuda//:cudart_static"],
        alwayslink = 1,
        linkstatic = 1,
        **kwargs
    )

def if_cuda(if_true, if_false = []):
    """`if_true` where the CUDA toolkit was found, else `if_false`."""
    return if_true if CUDA_ENABLED else if_false

def cuda_cc_library(**kwargs):
    """A host-compiled cc_library that uses CUDA; defined only where CUDA is enabled."""
    if CUDA_ENABLED:
        native.cc_library(**kwargs)
