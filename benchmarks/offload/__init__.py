"""Benchmarks of offload: ``python -m benchmarks.offload [--quick]``."""
