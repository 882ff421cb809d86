"""Installs the repository root as the package `cadence`.

TensorFlow is an extra so that a CPU-only machine does not download the
GPU wheel: `pip install -e ".[cpu]"` pulls `tensorflow-cpu`,
`pip install -e ".[gpu]"` pulls `tensorflow[and-cuda]`, `.[tf]` plain
`tensorflow` (where there is no `tensorflow-cpu` wheel: macOS, Linux on
ARM). These three are alternatives: pick one. `gpu` with `tf` is one
wheel, but `cpu` with `gpu` or `tf` installs two wheels into the same
`tensorflow/` folder (pip check passes; the one written last wins, and
uninstalling either breaks the other), so the trainer refuses to start on
such a mix (framework/jobs/install_check.py). On a Cloud TPU VM, install no
TensorFlow extra (`pip install -e .` in a venv with
--system-site-packages: the TensorFlow of the VM's TPU software version is
the one that drives the TPU) and run with `--tpu=local`.

`.[tpu]` adds the Cloud TPU API client that looks a TPU's *name* up
(google-api-python-client >= 2); install it in the same command as the
TensorFlow extra (`.[cpu,tpu]`) so that pip resolves both together. It used
to be cloud-tpu-client, which pins google-api-python-client 1.8 and, through
google-api-core 1.x, protobuf < 4: installed into a TensorFlow venv it
downgraded protobuf and broke `import tensorflow` (tests/setup_test.py
keeps such packages out of the extras).

A wheel (`pip wheel .`) installs the command `cadence-trainer`, the
trainer of `trainer.py` (`cadence.trainer:ConsoleMain`; `python -m
cadence.trainer` is the same).
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
    entry_points={
        'console_scripts': ['cadence-trainer = cadence.trainer:ConsoleMain'],
    },
    install_requires=['numpy', 'absl-py', 'sentencepiece'],
    extras_require={
        'cpu': ['tensorflow-cpu>=2.16'],
        'gpu': ['tensorflow[and-cuda]>=2.16'],
        'tf': ['tensorflow>=2.16'],
        # pytest-xdist: the README's test command runs three files at a
        # time (the suite's 10-minute budget on 2 cores).
        'test': ['pytest', 'pytest-xdist'],
        # A TPU named by --tpu=<name> is looked up with the Cloud TPU API:
        # TensorFlow's TPUClusterResolver calls it through this client,
        # with credentials from google-auth (one of its dependencies); see
        # framework/distribute/tpu.py. --tpu=local (on a TPU VM) and a
        # grpc://host:8470 address need nothing more.
        'tpu': ['google-api-python-client>=2'],
    },
)
