"""Cadence tasks.image package."""
