"""Registered experiments of the README's examples (a model of one's own)."""
