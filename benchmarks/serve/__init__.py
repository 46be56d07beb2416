"""Benchmarks of serve: ``python -m benchmarks.serve [--quick]``."""
