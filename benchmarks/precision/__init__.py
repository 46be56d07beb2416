"""Benchmarks of precision: ``python -m benchmarks.precision [--quick]``."""
