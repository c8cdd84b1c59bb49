"""Comparisons with other engines and tools: `python -m scripts.compare.NAME --help`."""
