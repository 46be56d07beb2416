"""Benchmarks of supernet: ``python -m benchmarks.supernet [--quick]``."""
