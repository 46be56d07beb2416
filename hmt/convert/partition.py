"""Cut points inside one static ONNX graph, and its head/tail split verified against the whole.

A cut after node ``i`` (graph order is a topological order) is valid when exactly one
computed tensor is live across it: produced by nodes ``0..i`` (or the graph input) and
read by a later node or returned. The head is then ``inputs -> tensor`` and the tail
``tensor -> outputs``; nothing else needs to travel. Residual blocks have two live
tensors inside them, so cuts fall between blocks and inside the branch-free parts.

Which cuts are worth keeping is the caller's choice; :func:`smaller_than_before` keeps a
cut only when its tensor is smaller than every earlier kept one (and the graph input):
a later cut that sends more bytes does more work locally *and* sends more, which only
pays when the peer is slower than the device, the case offloading is not for.

onnx and onnxruntime are imported inside functions (offline half only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hmt.errors import ModelError, VerificationError

if TYPE_CHECKING:
    import onnx

# The largest |head then tail - whole| accepted, relative to max(1, |whole|) (fp32).
SPLIT_TOLERANCE = 1e-5


@dataclass(frozen=True)
class InnerCut:
    """One single-tensor cut inside a graph: ``nodes_before`` nodes go to the head."""

    tensor: str
    shape: tuple[int, ...]
    dtype: str
    nodes_before: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "shape": list(self.shape), "dtype": self.dtype,
                "nodes_before": self.nodes_before}


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], str]]:
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as exc:
        raise ModelError(f"shape inference failed on graph {model.graph.name!r}: {exc}") from exc
    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tensor_type = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
        if not tensor_type.HasField("shape") or any(d <= 0 for d in dims):
            continue  # a dynamic tensor cannot be a static cut
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
        shapes[value.name] = (dims, dtype)
    return shapes


def find_inner_cuts(model: onnx.ModelProto) -> list[InnerCut]:
    """Every single-tensor cut strictly inside ``model``'s main graph, in graph order."""
    graph = model.graph
    constants = {init.name for init in graph.initializer}
    nodes = list(graph.node)
    for node in nodes:  # Constant nodes and what only they feed are weights, not activations
        if node.op_type == "Constant" or (node.input and all(i in constants or not i for i in node.input)):
            constants.update(node.output)
    inputs = [v.name for v in graph.input if v.name not in constants]
    if len(inputs) != 1 or len(graph.output) != 1:
        return []  # the chain format carries one tensor in, one out
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name and name not in constants:
                last_use[name] = i
    outputs = {v.name for v in graph.output}
    shapes = _shapes(model)
    live: set[str] = {inputs[0]}
    cuts: list[InnerCut] = []
    for i, node in enumerate(nodes[:-1]):
        live.update(o for o in node.output if o and o not in constants)
        live = {t for t in live if last_use.get(t, -1) > i or t in outputs}
        if len(live) != 1:
            continue
        (tensor,) = live
        if tensor == inputs[0] or tensor in outputs or tensor not in shapes:
            continue
        shape, dtype = shapes[tensor]
        cuts.append(InnerCut(tensor, shape, dtype, i + 1))
    return cuts


def smaller_than_before(cuts: list[InnerCut], input_numel: int) -> list[InnerCut]:
    """The cuts whose tensor is smaller than the graph input and every earlier kept cut."""
    kept: list[InnerCut] = []
    smallest = input_numel
    for cut in cuts:
        if cut.numel < smallest:
            kept.append(cut)
            smallest = cut.numel
    return kept


def split_model(model: onnx.ModelProto, tensor: str) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``model`` split at ``tensor``: (head: input -> tensor, tail: tensor -> output)."""
    import onnx
    from onnx.utils import Extractor

    inputs = [v.name for v in model.graph.input if v.name not in {i.name for i in model.graph.initializer}]
    outputs = [v.name for v in model.graph.output]
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        extractor = Extractor(inferred)
        head = extractor.extract_model(inputs, [tensor])
        tail = extractor.extract_model([tensor], outputs)
    except Exception as exc:
        raise ModelError(f"cannot split graph {model.graph.name!r} at {tensor!r}: {exc}") from exc
    for part in (head, tail):
        part.ir_version = model.ir_version
        del part.opset_import[:]
        part.opset_import.extend(model.opset_import)
        del part.graph.value_info[:]  # shape inference redoes these; stale entries only cost bytes
    try:
        onnx.checker.check_model(head)
        onnx.checker.check_model(tail)
    except Exception as exc:
        raise ModelError(f"split of graph {model.graph.name!r} at {tensor!r} is not a valid model: {exc}") from exc
    return head, tail


def verify_split(model: onnx.ModelProto, head: onnx.ModelProto, tail: onnx.ModelProto, *, seed: int,
                 samples: int = 2, tolerance: float = SPLIT_TOLERANCE) -> float:
    """Run whole vs head-then-tail on seeded inputs; the worst relative error, or VerificationError."""
    import numpy as np

    from hmt.convert.graph import graph_inputs, ort_session, seeded_inputs

    whole_s, head_s, tail_s = (ort_session(m, level="basic", threads=1) for m in (model, head, tail))
    tail_input = tail_s.get_inputs()[0].name
    worst = 0.0
    for k in range(samples):
        feeds = seeded_inputs(graph_inputs(model), seed=seed + k)
        expected = whole_s.run(None, feeds)[0]
        middle = head_s.run(None, feeds)[0]
        got = tail_s.run(None, {tail_input: middle})[0]
        if got.shape != expected.shape:
            raise VerificationError(f"split of {model.graph.name!r}: tail gives shape {list(got.shape)}, "
                                    f"the whole graph {list(expected.shape)}")
        scale = max(1.0, float(np.max(np.abs(expected))) if expected.size else 1.0)
        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - expected))) / scale)
    if not worst <= tolerance:
        raise VerificationError(f"split of {model.graph.name!r}: head then tail differs from the whole graph by "
                                f"{worst:.3g} (relative), above {tolerance:g}")
    return worst
