"""Cadence: a Lingvo-style deep-learning framework on TensorFlow 2.

The repository root is the package ``cadence``; import its parts as
``cadence.framework.hyperparams``, ``cadence.layers.linear`` and so on.
"""
