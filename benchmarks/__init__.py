"""Benchmark scripts: each runs as ``python -m benchmarks.<name>`` and prints a table of ratios."""
