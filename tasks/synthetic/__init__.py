"""Synthetic tasks: tiny models on generated data, for tests and benchmarks."""
