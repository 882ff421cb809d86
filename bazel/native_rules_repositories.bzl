"""Offline stand-ins for the rules_cc and rules_java repositories.

Bazel 4.2's built-in @bazel_tools packages (the C++ and JDK toolchains that
every py_binary/py_test resolves) load `@rules_cc//cc:defs.bzl` and
`@rules_java//java:defs.bzl`, which Bazel would download from GitHub. Those
4.2-era files only forward to Bazel's native rules, so these repositories
do the same, generated locally: the build never touches the network. (The
Debian package bazel-rules-cc is a newer rules_cc that Bazel 4.2 cannot
load.) Only the rules those @bazel_tools packages load are defined.
"""

def _forwarding_defs(names):
    """The text of a defs.bzl whose `names` call the native rule of the name."""
    lines = []
    for name in names:
        lines.append("def %s(**kwargs):\n    native.%s(**kwargs)\n" %
                     (name, name))
    return "\n".join(lines)

def _native_rules_repository_impl(rctx):
    package = rctx.attr.package
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)
    rctx.file("BUILD", "")
    rctx.file(package + "/BUILD", "")
    rctx.file(package + "/defs.bzl", _forwarding_defs(rctx.attr.rules))

native_rules_repository = repository_rule(
    implementation = _native_rules_repository_impl,
    attrs = {
        "package": attr.string(mandatory = True),
        "rules": attr.string_list(mandatory = True),
    },
    doc = "A repository whose `<package>/defs.bzl` forwards to native rules.",
)

def native_rules_repositories():
    """Declares @rules_cc and @rules_java before Bazel's defaults would."""
    native_rules_repository(
        name = "rules_cc",
        package = "cc",
        rules = [
            "cc_binary",
            "cc_library",
            "cc_test",
            "cc_toolchain",
            "cc_toolchain_suite",
        ],
    )
    native_rules_repository(
        name = "rules_java",
        package = "java",
        rules = [
            "java_import",
            "java_runtime",
            "java_toolchain",
        ],
    )
