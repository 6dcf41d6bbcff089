"""@cutlass: CUTLASS/CuTe headers from the pip package `nvidia-cutlass`, if installed.

Looked up with $PIT_PYTHON (or taken from $PIT_CUTLASS_INCLUDE). `defs.bzl` says
whether they were found; kernels that need them are only built when they were.
"""

load(":repo_utils.bzl", "PYTHON_ENV", "find_python")

_QUERY = """
import importlib.util, os
spec = importlib.util.find_spec("cutlass_library")
print(os.path.join(os.path.dirname(spec.origin), "source", "include") if spec else "")
"""

def _cutlass_configure_impl(repository_ctx):
    include = repository_ctx.os.environ.get("PIT_CUTLASS_INCLUDE", "")
    if not include:
        result = repository_ctx.execute([find_python(repository_ctx), "-c", _QUERY])
        include = result.stdout.strip() if result.return_code == 0 else ""
    if not include or not repository_ctx.path(include + "/cute").exists:
        repository_ctx.file("defs.bzl", "CUTLASS_FOUND = False\n")
        repository_ctx.file("BUILD", "")
        return
    repository_ctx.symlink(include + "/cute", "include/cute")
    repository_ctx.symlink(include + "/cutlass", "include/cutlass")
    repository_ctx.file("defs.bzl", "CUTLASS_FOUND = True\n")
    repository_ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

filegroup(
    name = "headers",
    srcs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.inl"]),
)
""")

cutlass_configure = repository_rule(
    implementation = _cutlass_configure_impl,
    environ = [PYTHON_ENV, "PIT_CUTLASS_INCLUDE", "PATH"],
    local = True,
)
