"""Benchmarks of adapt: ``python -m benchmarks.adapt [--quick]``."""
