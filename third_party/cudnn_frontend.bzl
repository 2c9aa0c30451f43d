"""cudnn_frontend_repository: NVIDIA's header-only cuDNN frontend, from the PyPI package
nvidia-cudnn-frontend installed for /usr/bin/python3 (tools/setup.sh). Its headers sit under
<site-packages>/include, which depends on the Python version, so the path is asked of pip."""

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cudnn_frontend",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)
"""

def _impl(ctx):
    r = ctx.execute([ctx.attr.python, "-m", "pip", "show", "nvidia-cudnn-frontend"])
    location = ""
    for line in r.stdout.splitlines():
        if line.startswith("Location:"):
            location = line[len("Location:"):].strip()
    if r.return_code != 0 or not location:
        fail("nvidia-cudnn-frontend is not installed for %s (run tools/setup.sh): %s" %
             (ctx.attr.python, r.stderr))
    ctx.symlink(location + "/include", "include")
    ctx.file("BUILD.bazel", _BUILD)
    ctx.file("WORKSPACE", "")

cudnn_frontend_repository = repository_rule(
    implementation = _impl,
    attrs = {"python": attr.string(default = "/usr/bin/python3")},
    local = True,
)
