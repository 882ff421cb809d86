"""Task-agnostic layers, one family per file."""
