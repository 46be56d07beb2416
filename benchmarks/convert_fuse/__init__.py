"""Benchmarks of convert_fuse: ``python -m benchmarks.convert_fuse [--quick]``."""
