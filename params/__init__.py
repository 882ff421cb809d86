"""Registered experiments, one folder per domain (`params/lm/...`)."""
