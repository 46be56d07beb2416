"""The on-device floor: verified graph loading, ORT and TVM sessions, chain runners. No torch.

Everything that runs a graph goes through here: ``hmt serve`` (its variant pool),
``hmt deploy --verify`` (each bundled chain) and ``hmt fuse`` (timing its candidates).

- :mod:`hmt.runtime.verified`: read a file an artifact lists, checking its size and
  sha256 against the manifest on *every* load (a file changed after start-up is refused);
- :mod:`hmt.runtime.ort`: :class:`OrtOptions` (what fuse measured and serve rebuilds) and
  :func:`ort_session`, the one place an ONNX Runtime session is built (providers with a
  clean CPU fallback that is recorded as a note, threads, spinning);
- :mod:`hmt.runtime.tvm`: a TVM Relax module exported as a shared library, as a callable;
- :mod:`hmt.runtime.chain`: a variant's chain of graphs with early exit by confidence, and
  the merged single-graph chain fuse may choose (one call per inference, no early exit);
- :mod:`hmt.runtime.variant`: a bundled variant loaded the way fuse chose to run it.

Heavy runtimes (onnxruntime, tvm) are imported inside the functions that need them.
This package imports nothing from the offline stages (supernet, profile, pareto,
convert, fuse, deploy); ``tests/runtime/test_layers.py`` checks it.
"""

from __future__ import annotations
