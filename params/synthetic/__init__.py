"""Registered experiments on synthetic data (tests, benchmarks, examples)."""
