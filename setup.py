"""Installs the repository root as the package `cadence`.

TensorFlow is an extra so that a CPU-only machine does not download the
GPU wheel: `pip install -e ".[cpu]"` pulls `tensorflow-cpu`,
`pip install -e ".[gpu]"` pulls `tensorflow[and-cuda]`; `.[tpu]` adds the
Google API client that looks a TPU's name up (cloud-tpu-client).
"""
import setuptools
from setuptools.command import build_py

# Folders of the repository root that are packages of `cadence`; tests/ and
# bench/ run from a checkout and are not installed.
_SUBPACKAGES = setuptools.find_packages(
    where='.', exclude=['tests', 'tests.*', 'bench', 'bench.*', 'build',
                        'build.*'])


class _BuildPy(build_py.build_py):
  """Leaves this script out: the root folder is the package itself."""

  def find_package_modules(self, package, package_dir):
    modules = super().find_package_modules(package, package_dir)
    return [m for m in modules if (m[0], m[1]) != ('cadence', 'setup')]


setuptools.setup(
    name='cadence',
    version='0.1.0',
    description='A Lingvo-style deep-learning framework on TensorFlow 2.',
    python_requires='>=3.10',
    package_dir={'cadence': '.'},
    packages=['cadence'] + ['cadence.' + p for p in _SUBPACKAGES],
    cmdclass={'build_py': _BuildPy},
    install_requires=['numpy', 'absl-py', 'sentencepiece'],
    extras_require={
        'cpu': ['tensorflow-cpu>=2.16'],
        'gpu': ['tensorflow[and-cuda]>=2.16'],
        'tf': ['tensorflow>=2.16'],
        # pytest-xdist: the README's test command runs three files at a
        # time (the suite's 10-minute budget on 2 cores).
        'test': ['pytest', 'pytest-xdist'],
        # A TPU named by --tpu=<name> is looked up with the Cloud TPU API
        # (a grpc://host:8470 address needs nothing more).
        'tpu': ['cloud-tpu-client'],
    },
)
