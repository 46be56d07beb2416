"""Tensor-lifetime memory plan over an ONNX graph (CrowdHMTware III-C1, item 3).

Every activation (graph inputs, node outputs) lives from the step that produces it to
the last step that reads it, in the graph's execution (topological) order; graph
outputs live to the end. Tensors are placed in one arena by greedy best-fit in order of
decreasing size (the "greedy by size" planner of TFLite): each goes into the smallest
gap left between already placed tensors whose lifetimes overlap its own, or on top.

Reported: the planned arena peak, the naive total (every tensor its own buffer) and the
lower bound no placement can beat (the largest sum of simultaneously live tensors).
Weights are not activations and are not planned, nor is what is computed from weights alone
(:func:`constant_tensors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hmt.errors import ModelError

if TYPE_CHECKING:
    import onnx

DEFAULT_ALIGNMENT_BYTES = 64


@dataclass(frozen=True)
class TensorLifetime:
    name: str
    size_bytes: int
    first_step: int
    last_step: int

    def overlaps(self, other: TensorLifetime) -> bool:
        return self.first_step <= other.last_step and other.first_step <= self.last_step


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    size_bytes: int
    first_step: int
    last_step: int
    offset_bytes: int


@dataclass(frozen=True)
class MemoryPlan:
    tensors: tuple[PlannedTensor, ...]
    planned_peak_bytes: int
    naive_bytes: int
    lower_bound_bytes: int
    alignment_bytes: int
    steps: int

    @property
    def planned_over_naive(self) -> float:
        return self.planned_peak_bytes / self.naive_bytes if self.naive_bytes else 0.0

    @property
    def planned_over_lower_bound(self) -> float:
        return self.planned_peak_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "planned_peak_bytes": self.planned_peak_bytes,
            "naive_bytes": self.naive_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "planned_over_naive": round(self.planned_over_naive, 4),
            "planned_over_lower_bound": round(self.planned_over_lower_bound, 4),
            "tensors": len(self.tensors),
            "steps": self.steps,
            "alignment_bytes": self.alignment_bytes,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "placements": [
                {"name": t.name, "size_bytes": t.size_bytes, "first_step": t.first_step,
                 "last_step": t.last_step, "offset_bytes": t.offset_bytes}
                for t in self.tensors
            ],
        }


def _aligned(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment


def live_set_lower_bound(lifetimes: list[TensorLifetime], steps: int, *, alignment: int = 1) -> int:
    """The largest total size of tensors live at one step (sizes aligned as the arena aligns them)."""
    totals = [0] * max(steps, 1)
    for t in lifetimes:
        for step in range(t.first_step, t.last_step + 1):
            totals[step] += _aligned(t.size_bytes, alignment)
    return max(totals, default=0)


def plan_arena(
    lifetimes: list[TensorLifetime], *, steps: int, alignment: int = DEFAULT_ALIGNMENT_BYTES
) -> MemoryPlan:
    """Greedy best-fit placement of ``lifetimes`` in one arena."""
    order = sorted(lifetimes, key=lambda t: (-t.size_bytes, t.first_step, t.name))
    placed: list[PlannedTensor] = []
    for tensor in order:
        size = _aligned(tensor.size_bytes, alignment)
        conflicts = sorted(
            (p for p in placed if p.first_step <= tensor.last_step and tensor.first_step <= p.last_step),
            key=lambda p: p.offset_bytes,
        )
        best_offset, best_gap = None, None
        cursor = 0
        for other in conflicts:
            gap = other.offset_bytes - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best_offset, best_gap = cursor, gap
            cursor = max(cursor, other.offset_bytes + _aligned(other.size_bytes, alignment))
        offset = cursor if best_offset is None else best_offset
        placed.append(PlannedTensor(tensor.name, tensor.size_bytes, tensor.first_step, tensor.last_step, offset))
    peak = max((p.offset_bytes + _aligned(p.size_bytes, alignment) for p in placed), default=0)
    placed.sort(key=lambda p: (p.first_step, p.name))
    return MemoryPlan(
        tensors=tuple(placed),
        planned_peak_bytes=peak,
        naive_bytes=sum(t.size_bytes for t in lifetimes),
        lower_bound_bytes=live_set_lower_bound(lifetimes, steps, alignment=alignment),
        alignment_bytes=alignment,
        steps=steps,
    )


def constant_tensors(model: onnx.ModelProto) -> set[str]:
    """Initializers and what is computed from them alone (Constant nodes, an int8 graph's
    DequantizeLinear of a quantized weight): weights, folded or fused when a runtime loads the
    graph, not activations. Planned as activations, an int8 variant's dequantized float weights
    made its arena larger than its float twin's."""
    constants = {init.name for init in model.graph.initializer}
    for node in model.graph.node:  # topological order: a constant's inputs come first
        if node.op_type == "Constant" or (node.input and all(not i or i in constants for i in node.input)):
            constants.update(o for o in node.output if o)
    return constants


def tensor_lifetimes(model: onnx.ModelProto) -> tuple[list[TensorLifetime], int]:
    """Lifetimes of every activation of a static-shape model, in node order. Returns (lifetimes, steps)."""
    import numpy as np
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as exc:
        raise ModelError(f"memory plan: shape inference failed ({exc})") from exc
    infos: dict[str, Any] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        infos[value.name] = value.type.tensor_type
    initializers = constant_tensors(model)
    nodes = [n for n in model.graph.node if not all(o in initializers for o in n.output if o)]
    steps = len(nodes)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for value in model.graph.input:
        if value.name not in initializers:
            first[value.name] = 0
            last[value.name] = 0
    for step, node in enumerate(nodes):
        for name in node.input:
            if name in first:
                last[name] = max(last[name], step)
        for name in node.output:
            if name:
                first[name] = step
                last[name] = step
    for value in model.graph.output:
        if value.name in first:
            last[value.name] = max(steps - 1, 0)
    lifetimes = []
    for name, start in first.items():
        info = infos.get(name)
        if info is None or not info.HasField("shape"):
            raise ModelError(f"memory plan: shape of tensor {name!r} is unknown; the plan needs static shapes")
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in info.shape.dim]
        if any(d < 0 for d in dims):
            raise ModelError(f"memory plan: tensor {name!r} has a symbolic shape {dims}; convert with static shapes")
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(info.elem_type)).itemsize
        lifetimes.append(TensorLifetime(name, int(np.prod(dims, dtype=np.int64)) * itemsize, start, last[name]))
    return lifetimes, steps


def plan_memory(model: onnx.ModelProto, *, alignment: int = DEFAULT_ALIGNMENT_BYTES) -> MemoryPlan:
    """The arena plan of a static-shape ONNX model's activations."""
    lifetimes, steps = tensor_lifetimes(model)
    return plan_arena(lifetimes, steps=steps, alignment=alignment)
