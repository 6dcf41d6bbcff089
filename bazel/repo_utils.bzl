"""Helpers shared by pit_jax's repository rules (Bazel 4.2.3, offline)."""

PYTHON_ENV = "PIT_PYTHON"

def find_python(repository_ctx):
    """The interpreter to build for: $PIT_PYTHON (a name or a path), default `python3`."""
    name = repository_ctx.os.environ.get(PYTHON_ENV, "python3").strip() or "python3"
    if "/" in name:
        path = repository_ctx.path(name)
        if not path.exists:
            fail("%s=%s does not exist" % (PYTHON_ENV, name))
        return str(path)
    found = repository_ctx.which(name)
    if found == None:
        fail("cannot find the Python interpreter '%s' on PATH; set %s to its path" % (name, PYTHON_ENV))
    return str(found)

def run_python(repository_ctx, python, code, what):
    """Runs `code` with `python` and returns its stripped stdout, failing with `what` on error."""
    result = repository_ctx.execute([python, "-c", code])
    if result.return_code != 0:
        fail("%s: %s failed:\n%s%s" % (what, python, result.stdout, result.stderr))
    return result.stdout.strip()

def symlink_dir(repository_ctx, src, dst, what):
    path = repository_ctx.path(src)
    if not path.exists:
        fail("%s: directory %s does not exist" % (what, src))
    repository_ctx.symlink(path, dst)
