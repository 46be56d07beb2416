"""Every exit's logits of every variant of a bundle, through hmt's runtime layer (ONNX Runtime).

Run on the host by the emulated-device test and inside the device by the same test
(``python arm64_chain.py BUNDLE INPUTS.npy OUT.npz``): the two must agree. Imports only
what the device half has (numpy, onnxruntime, hmt.bundle, hmt.runtime).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from hmt.bundle import load_bundle
from hmt.runtime.variant import graph_fn


def chain_logits(bundle_dir: Path, inputs: np.ndarray) -> dict[str, np.ndarray]:
    """``"<arch_id>/exit<k>"`` -> logits ``[len(inputs), classes]`` of that exit."""
    bundle = load_bundle(bundle_dir)
    out: dict[str, np.ndarray] = {}
    for variant in bundle.spec.variants:
        segments = [graph_fn(bundle, s, "onnxruntime", threads=1) for s in variant.segments]
        heads = [graph_fn(bundle, h, "onnxruntime", threads=1) for h in variant.exits]
        rows: dict[int, list] = {k: [] for k in range(len(heads))}
        for x in inputs:
            features = x[None]
            for k, (segment, head) in enumerate(zip(segments, heads, strict=True)):
                features = segment(features)
                rows[k].append(head(features)[0])
        for k, values in rows.items():
            out[f"{variant.arch_id}/exit{k}"] = np.stack(values)
    return out


if __name__ == "__main__":
    bundle_arg, inputs_arg, out_arg = sys.argv[1:4]
    np.savez(out_arg, **chain_logits(Path(bundle_arg), np.load(inputs_arg)))
