"""hmt's benchmarks: one sub-package per area, results as data (see README.md)."""
