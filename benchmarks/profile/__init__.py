"""Benchmarks of profile: ``python -m benchmarks.profile [--quick]``."""
