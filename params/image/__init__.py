"""Cadence params.image package."""
