"""ONNX graphs, below both convert and fuse: loading and counting (:mod:`hmt.graph.model`), the
mutable graph view (:mod:`hmt.graph.rewrite`) and the registered pass catalogue
(:mod:`hmt.graph.passes`). It imports nothing from convert or fuse (no cycle between them)."""
