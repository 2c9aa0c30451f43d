"""cudnn_frontend_repository: NVIDIA's header-only cuDNN frontend, from the PyPI package
nvidia-cudnn-frontend that tools/setup.sh installs into the project's .venv. Its headers sit
under <site-packages>/include, which depends on the Python version, so the path is asked of the
venv's pip. Only the CUDA targets depend on it, so a build without CUDA never looks."""

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cudnn_frontend",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)
"""

def _impl(ctx):
    python = str(ctx.path(Label("//:WORKSPACE")).dirname) + "/.venv/bin/python"
    if not ctx.path(python).exists:
        fail("%s does not exist: run tools/setup.sh" % python)
    r = ctx.execute([python, "-m", "pip", "show", "nvidia-cudnn-frontend"])
    location = ""
    for line in r.stdout.splitlines():
        if line.startswith("Location:"):
            location = line[len("Location:"):].strip()
    if r.return_code != 0 or not location:
        fail("nvidia-cudnn-frontend is not installed for %s (run tools/setup.sh): %s" %
             (python, r.stderr))
    ctx.symlink(location + "/include", "include")
    ctx.file("BUILD.bazel", _BUILD)
    ctx.file("WORKSPACE", "")

cudnn_frontend_repository = repository_rule(
    implementation = _impl,
    local = True,
)
