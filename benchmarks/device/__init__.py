"""Benchmarks of the device half on the device's instruction set (``python -m benchmarks.device``)."""
