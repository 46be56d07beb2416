"""A bundle of one tiny conv-BN image variant with BN-adaptable graphs, for the serve --adapt tests.

The served chain (segment_k.onnx, exit_k.onnx, batch 1) is exported from the model in eval
mode; the adaptable graphs go in with ``hmt.deploy.adaptable.write_adaptable``, the function
``hmt deploy --adaptable`` uses, so the bundle layout is deploy's.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from hmt.artifacts import ArtifactWriter
from hmt.deploy.adaptable import write_adaptable
from hmt.pareto.index import FrontIndex, IndexEntry

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.adapt.conftest import TinyVariant, trained_tiny

ARCH = "tiny"


def _export(module: torch.nn.Module, x: torch.Tensor, path: Path, names: tuple[str, str]) -> None:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (x,), str(path), input_names=[names[0]], output_names=[names[1]],
                          opset_version=17, dynamo=False)


def _tensor(name: str, t: torch.Tensor) -> dict[str, Any]:
    return {"name": name, "shape": list(t.shape), "dtype": "float32"}


def make_adaptable_bundle(out: Path, serve: dict[str, Any] | None = None) -> tuple[Path, TinyVariant, torch.Tensor,
                                                                                  torch.Tensor]:
    """(bundle, model, its source inputs x [100, 3, 12, 12], labels y)."""
    model, x, y = trained_tiny()
    folder = f"variants/{ARCH}"
    segments, exits = [], []
    with ArtifactWriter(out, kind="bundle", config={"test": True}) as writer, torch.no_grad():
        h = x[:1]
        for k, (segment, head) in enumerate(zip(model.segments, model.exit_heads, strict=True)):
            feat_in = f"features_{k - 1}" if k else "input"
            out_h = segment(h)
            _export(segment, h, writer.path(f"{folder}/segment_{k}.onnx"), (feat_in, f"features_{k}"))
            _export(head, out_h, writer.path(f"{folder}/exit_{k}.onnx"), (f"features_{k}", f"logits_{k}"))
            segments.append({"index": k, "input": _tensor(feat_in, h), "output": _tensor(f"features_{k}", out_h),
                             "onnx": f"{folder}/segment_{k}.onnx"})
            exits.append({"index": k, "input": _tensor(f"features_{k}", out_h),
                          "output": _tensor(f"logits_{k}", head(out_h)), "onnx": f"{folder}/exit_{k}.onnx",
                          "consumes_segment": k})
            h = out_h
        record = write_adaptable(writer, folder, model, x[:2], x, expected_segments=2)
        writer.write_json("bundle.json", {
            "version": 1, "target": {"name": "host"}, "classes": 10, "input": _tensor("input", x[:1]),
            "variants": [{"arch_id": ARCH, "exit_stage": 1, "accuracy": 0.9, "accuracy_per_exit": [0.8, 0.9],
                          "latency_ms": 1.0, "energy": 1.0, "memory_mb": 1.0, "segments": segments, "exits": exits,
                          "preferred_engine": "onnxruntime", "engines": ["onnxruntime"],
                          "extra": {"adaptable": record}}]})
        writer.write_json("profile.json", {"device": "test"})
        writer.write_json("index.json", FrontIndex([IndexEntry(ARCH, 0.9, 1.0, 1.0, 1.0, 1, (0.8, 0.9),
                                                               "onnxruntime")]).to_json_dict())
        writer.write_json("serve.json", serve if serve is not None else {})
    return out, model, x, y
