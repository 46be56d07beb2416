"""Benchmarks of reliability: ``python -m benchmarks.reliability [--quick]``."""
