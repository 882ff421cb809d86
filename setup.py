"""Installs the repository root as the package `cadence`.

TensorFlow is an extra so that a CPU-only machine does not download the
GPU wheel: `pip install -e ".[cpu]"` pulls `tensorflow-cpu`,
`pip install -e ".[gpu]"` pulls `tensorflow[and-cuda]`.
"""
import setuptools

_SUBPACKAGES = ['framework', 'layers', 'tasks', 'tasks.lm', 'params',
                'params.lm']

setuptools.setup(
    name='cadence',
    version='0.1.0',
    description='A Lingvo-style deep-learning framework on TensorFlow 2.',
    python_requires='>=3.10',
    package_dir={'cadence': '.'},
    packages=['cadence'] + ['cadence.' + p for p in _SUBPACKAGES],
    install_requires=['numpy', 'absl-py', 'sentencepiece'],
    extras_require={
        'cpu': ['tensorflow-cpu>=2.16'],
        'gpu': ['tensorflow[and-cuda]>=2.16'],
        'tf': ['tensorflow>=2.16'],
        'test': ['pytest'],
    },
)
