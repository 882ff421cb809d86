"""Models and input generators, one folder per domain."""
