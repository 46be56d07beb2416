"""Benchmarks of pareto: ``python -m benchmarks.pareto [--quick]``."""
