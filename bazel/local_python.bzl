"""A Python toolchain for the interpreter of a local virtualenv.

TensorFlow, numpy, absl-py, sentencepiece and pytest are pip packages, not
Bazel dependencies: Bazel runs Python targets with an interpreter that has
them installed. By default that is `<workspace>/.venv/bin/python` (the venv
the README creates); `CADENCE_PYTHON=/abs/path/to/python` picks another.
Nothing is downloaded, so the build works offline.
"""

_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _local_python_impl(rctx):
    python = rctx.os.environ.get("CADENCE_PYTHON", "")
    if python:
        if not python.startswith("/"):
            fail("CADENCE_PYTHON=%s: must be an absolute path" % python)
        if not rctx.path(python).exists:
            fail("CADENCE_PYTHON=%s: no such file" % python)
    else:
        root = rctx.path(Label("//:WORKSPACE")).dirname
        python = "%s/.venv/bin/python" % root
        if not rctx.path(python).exists:
            fail(("%s not found: create the venv first (python3 -m venv " +
                  ".venv && .venv/bin/pip install -e \".[cpu,test]\") or " +
                  "set CADENCE_PYTHON=/abs/path/to/python") % python)
    rctx.file("BUILD", _BUILD.format(python = python))

local_python = repository_rule(
    implementation = _local_python_impl,
    environ = ["CADENCE_PYTHON"],
    local = True,
)
