"""Macros that generate Cadence's Bazel targets from the folder layout.

One py_library per source folder and one py_test per `*_test.py` file, so
adding a file never means editing BUILD by hand. The rules are Bazel's
native Python rules (Bazel 4.2 needs no rules_python download). Third-party
packages (tensorflow, numpy, absl-py, sentencepiece, pytest) come from the
interpreter of the `@local_python` toolchain (see local_python.bzl).
"""

def cadence_py_library(name, folder, deps = [], exclude = []):
    """A py_library of every .py file directly in `folder` ("" = root).

    No `imports` attribute: the workspace is named `cadence` (WORKSPACE), so
    the runfiles root on sys.path makes `cadence.<folder>` importable.
    """
    pattern = folder + "/*.py" if folder else "*.py"
    native.py_library(
        name = name,
        srcs = native.glob([pattern], exclude = exclude),
        deps = deps,
        visibility = ["//visibility:public"],
    )

def cadence_py_tests(folder, deps = [], data = []):
    """One py_test per `folder/**/*_test.py`, run through pytest.

    Every test gets the shared helpers, the other `.py` files directly in
    `<folder>` (test_utils.py, readme_blocks.py, bad_units.py, and
    conftest.py's plugin slow_test_notice.py).

    Each test runs `<folder>/bazel_pytest_main.py <test file>`; pytest reads
    pyproject.toml (importlib mode) and `<folder>/conftest.py`, which
    configures the four logical CPUs before any test runs, as in a plain
    pytest run. A test_suite per folder holds the tests below it:
    `//:tests_framework` = tests/framework/**, `//:tests` = all of them.
    """
    main = folder + "/bazel_pytest_main.py"
    helpers = native.glob([folder + "/*.py"],
                          exclude = [folder + "/*_test.py", main])
    suites = {}
    for src in native.glob([folder + "/**/*_test.py"]):
        name = src[:-len(".py")].replace("/", "_")
        native.py_test(
            name = name,
            srcs = [src, main] + helpers,
            main = main,
            args = ["$(location %s)" % src],
            data = ["pyproject.toml"] + data,
            deps = deps,
            size = "medium",
            # Each file pays TensorFlow's import and tracing in its own
            # process: on 2 shared cores tests/trainer_test.py took 248 s,
            # too close to medium's default 300 s.
            timeout = "long",
        )
        parts = src.split("/")[:-1]
        for i in range(len(parts)):
            suites.setdefault("_".join(parts[:i + 1]), []).append(name)
    for suite, tests in suites.items():
        native.test_suite(name = suite, tests = tests)
