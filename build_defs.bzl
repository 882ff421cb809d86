"""Macros that generate Cadence's Bazel targets from the folder layout.

One py_library per source folder and one py_test per `*_test.py` file, so
adding a file never means editing BUILD by hand. Third-party packages
(tensorflow, numpy, absl-py, sentencepiece, pytest) come from the Python
environment Bazel runs in.
"""

load("@rules_python//python:defs.bzl", "py_library", "py_test")

def cadence_py_library(name, folder, deps = []):
    """A py_library of every .py file directly in `folder` ("" = root)."""
    pattern = folder + "/*.py" if folder else "*.py"
    py_library(
        name = name,
        srcs = native.glob([pattern], exclude = ["setup.py"]),
        imports = [".."],
        deps = deps,
        visibility = ["//visibility:public"],
    )

def cadence_py_tests(folder, deps = []):
    """One py_test per `folder/**/*_test.py`, run through pytest."""
    for src in native.glob([folder + "/**/*_test.py"]):
        py_test(
            name = src[:-len(".py")].replace("/", "_"),
            srcs = [src, "tests/bazel_pytest_main.py", "tests/conftest.py"],
            main = "tests/bazel_pytest_main.py",
            args = ["$(location %s)" % src],
            data = native.glob(["pyproject.toml"]),
            deps = deps,
            size = "medium",
        )
