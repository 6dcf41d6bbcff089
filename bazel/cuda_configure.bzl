"""@local_config_cuda: the CUDA toolkit on the machine the build runs on.

Finds the toolkit through $CUDA_PATH, $CUDA_HOME, /usr/local/cuda, then nvcc on PATH. Exports
`cuda_headers`, `cudart_static` (so the extension never needs libcudart.so at run
time), an `nvcc` wrapper for `cuda_library`, and `defs.bzl` with CUDA_ENABLED. Where
no toolkit is found (or PIT_DISABLE_CUDA=1) CUDA_ENABLED is False and the CUDA
targets are simply not defined, so everything else still builds.

PIT_CUDA_EXTRA_ARCHS (e.g. "sm_100,sm_120") adds machine code for those GPUs to the
generic kernels (defs.bzl's CUDA_EXTRA_ARCHS): without it such GPUs compile the kernels'
compute_80 PTX on first use.
"""

_ENVS = ["CUDA_PATH", "CUDA_HOME", "PIT_DISABLE_CUDA", "PIT_CUDA_EXTRA_ARCHS", "PATH"]

def _extra_archs(repository_ctx):
    """-gencode flags for PIT_CUDA_EXTRA_ARCHS: "sm_100,sm_120" or "100,120"."""
    value = repository_ctx.os.environ.get("PIT_CUDA_EXTRA_ARCHS", "")
    flags = []
    for item in value.replace(" ", ",").split(","):
        if not item:
            continue
        num = item[3:] if item.startswith("sm_") else item
        if not num.isdigit() or int(num) < 80:
            fail("PIT_CUDA_EXTRA_ARCHS=%r: expected GPU architectures like sm_100,sm_120 (sm_80 or newer)" % value)
        flags.append("-gencode=arch=compute_%s,code=sm_%s" % (num, num))
    return flags

def _is_cuda_root(repository_ctx, root):
    return (repository_ctx.path(root + "/bin/nvcc").exists and
            repository_ctx.path(root + "/include/cuda_runtime.h").exists)

def _find_cuda(repository_ctx):
    env = repository_ctx.os.environ
    candidates = [env.get("CUDA_PATH", ""), env.get("CUDA_HOME", ""), "/usr/local/cuda"]
    nvcc = repository_ctx.which("nvcc")
    if nvcc != None:
        # nvcc on PATH may be a wrapper script; only trust it when its root has the headers.
        real = repository_ctx.execute(["readlink", "-f", str(nvcc)]).stdout.strip()
        candidates.append(real[:-len("/bin/nvcc")])
    for root in candidates:
        if root and _is_cuda_root(repository_ctx, root):
            return root
    return None

def _disabled(repository_ctx, why):
    repository_ctx.file("defs.bzl", "CUDA_ENABLED = False\nCUDA_VERSION = None\nCUDA_EXTRA_ARCHS = []\nCUDA_WHY_DISABLED = %r\n" % why)
    repository_ctx.file("BUILD", "")

def _cuda_configure_impl(repository_ctx):
    if repository_ctx.os.environ.get("PIT_DISABLE_CUDA", "0") not in ["", "0"]:
        _disabled(repository_ctx, "PIT_DISABLE_CUDA is set")
        return
    root = _find_cuda(repository_ctx)
    if root == None:
        _disabled(repository_ctx, "nvcc not found")
        return
    version = repository_ctx.execute([root + "/bin/nvcc", "--version"]).stdout
    release = "unknown"
    for line in version.splitlines():
        if "release" in line:
            release = line.split("release")[1].split(",")[0].strip()
    lib = root + "/lib64"
    if not repository_ctx.path(lib + "/libcudart_static.a").exists:
        lib = root + "/targets/x86_64-linux/lib"
    repository_ctx.symlink(root + "/include", "include")
    repository_ctx.symlink(lib + "/libcudart_static.a", "lib/libcudart_static.a")
    repository_ctx.file("nvcc.sh", "#!/bin/sh\nexec %s/bin/nvcc \"$@\"\n" % root, executable = True)
    repository_ctx.file("defs.bzl", "CUDA_ENABLED = True\nCUDA_VERSION = %r\nCUDA_PATH = %r\nCUDA_EXTRA_ARCHS = %r\n" % (
        release, root, _extra_archs(repository_ctx)))
    repository_ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

exports_files(["nvcc.sh"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.inl"]),
    includes = ["include"],
)

cc_library(
    name = "cudart_static",
    srcs = ["lib/libcudart_static.a"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    deps = [":cuda_headers"],
)
""")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = _ENVS,
    local = True,
)
