"""Test-time adaptation (CrowdHMTware III-A2, III-C2).

Torch-free (numpy, ONNX Runtime), for the device: ``bn_runtime`` (BN statistics
re-estimation on exported graphs), ``online`` (the serve hook), ``drift``, ``guard``.
Torch-land, for offline runs and devices that ship torch: ``tent``, ``memory`` (the
memory-saving engine), ``bn_export``, ``run``, ``offline``. ``corruptions`` builds the
CIFAR-10-C-style shift benchmark. Importing this package imports nothing heavy.
"""
