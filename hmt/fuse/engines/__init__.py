"""Inference engines fuse measures and chooses from: ONNX Runtime and TVM Relax."""
