"""@pybind11: pybind11's headers, from the pip package installed for $PIT_PYTHON."""

load(":repo_utils.bzl", "PYTHON_ENV", "find_python", "run_python", "symlink_dir")

def _pybind11_configure_impl(repository_ctx):
    python = find_python(repository_ctx)
    include = run_python(
        repository_ctx,
        python,
        "import pybind11; print(pybind11.get_include())",
        "pybind11_configure (pip install pybind11 for %s)" % python,
    )
    symlink_dir(repository_ctx, include, "include", "pybind11_configure")
    repository_ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "pybind11",
    hdrs = glob(["include/pybind11/**/*.h"]),
    includes = ["include"],
    deps = ["@local_config_python//:python_headers"],
)
""")

pybind11_configure = repository_rule(
    implementation = _pybind11_configure_impl,
    environ = [PYTHON_ENV, "PATH"],
    local = True,
)
