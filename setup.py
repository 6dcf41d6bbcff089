"""pip install . / pip install -e . : builds pit_jax's native modules through Bazel.

`build_ext` runs `bazel build //pit_jax:extensions` for the Python running this
build (PIT_PYTHON) and copies the modules into the package. `_pit_cuda` is included
when the build found nvcc. Bazel 4.2.3 (Debian's bazel-bootstrap) must be installed;
scripts/env.sh does that. The Bazel disk cache lives in $PIT_JAX_HOME (default
~/.cache/pit_jax), outside the source tree.
"""

import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class BazelExtension(Extension):
    def __init__(self, name, optional=False):
        super().__init__(name, sources=[], optional=optional)


class BazelBuildExt(build_ext):
    """Builds every extension in one Bazel invocation, then copies each into place."""

    _built = False

    def _bazel_build(self):
        if BazelBuildExt._built:
            return
        if shutil.which("bazel") is None:
            raise RuntimeError("pit_jax builds with Bazel: run scripts/env.sh (apt-get install bazel-bootstrap)")
        home = os.environ.get("PIT_JAX_HOME", os.path.expanduser("~/.cache/pit_jax"))
        cmd = [
            "bazel",
            "build",
            f"--repo_env=PIT_PYTHON={sys.executable}",
            f"--disk_cache={os.path.join(home, 'bazel-disk')}",
            "//pit_jax:extensions",
        ]
        print(" ".join(cmd), flush=True)
        subprocess.check_call(cmd, cwd=ROOT)
        BazelBuildExt._built = True

    def build_extension(self, ext):
        self._bazel_build()
        name = ext.name.split(".")[-1] + sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(ROOT, "bazel-bin", "pit_jax", name)
        if not os.path.exists(built):
            if ext.optional:
                print(f"skipping {ext.name}: not built (no CUDA toolkit found)", flush=True)
                return
            raise RuntimeError(f"Bazel did not produce {built}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.exists(dest):
            os.chmod(dest, 0o755)
        shutil.copyfile(built, dest)
        os.chmod(dest, 0o755)


setup(
    name="pit_jax",
    version="0.1.0",
    description="PIT dynamic sparsity (permutation invariant transformation) for JAX on NVIDIA GPUs",
    packages=find_packages(include=["pit_jax", "pit_jax.*"]),
    package_data={"pit_jax": ["stile_db/*.json"]},  # STile databases (pit_jax/optimizer)
    python_requires=">=3.10",
    install_requires=["jax>=0.10.2", "jaxlib>=0.10.2", "numpy"],
    extras_require={"flax": ["flax"]},
    ext_modules=[BazelExtension("pit_jax._pit_cpu"), BazelExtension("pit_jax._pit_cuda", optional=True)],
    cmdclass={"build_ext": BazelBuildExt},
    zip_safe=False,
)
