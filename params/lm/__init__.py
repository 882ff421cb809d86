"""Cadence params.lm package."""
