"""Cadence tasks.lm package."""
