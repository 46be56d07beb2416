"""A small mutable view of an ONNX graph for pattern rewrites.

Passes find a pattern, edit the node list through this view and call :meth:`refresh`.
Graphs here are a few hundred nodes, so rebuilding the indices after each rewrite is
cheap and keeps every pass simple.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx


class GraphView:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph
        self._counter = 0
        self.refresh()

    # -- indices -----------------------------------------------------------------------
    def refresh(self) -> None:
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.graph.node:
            for out in node.output:
                if out:
                    self.producer[out] = node
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)
        self.initializers = {init.name: init for init in self.graph.initializer}
        self.graph_outputs = {value.name for value in self.graph.output}
        self._shapes: dict[str, tuple[int | None, ...]] | None = None
        self._dtypes: dict[str, int] = {}
        self.opset = next((entry.version for entry in self.model.opset_import if entry.domain in ("", "ai.onnx")), 1)

    def shape(self, name: str) -> tuple[int | None, ...] | None:
        """The inferred shape of a value (None entries for unknown dims), or None when unknown."""
        if self._shapes is None:
            self._shapes, self._dtypes = _infer_shapes(self.model)
        if name in self.initializers:
            return tuple(int(d) for d in self.initializers[name].dims)
        return self._shapes.get(name)

    def dtype(self, name: str) -> int | None:
        """The ONNX element type of a value (TensorProto enum), or None when unknown."""
        if name in self.initializers:
            return int(self.initializers[name].data_type)
        if self._shapes is None:
            self._shapes, self._dtypes = _infer_shapes(self.model)
        return self._dtypes.get(name)

    def nodes(self, op_type: str) -> list[onnx.NodeProto]:
        return [node for node in self.graph.node if node.op_type == op_type and node.domain in ("", "ai.onnx")]

    def only_consumer(self, name: str) -> onnx.NodeProto | None:
        """The single node reading ``name``, or None if several read it or it is a graph output."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.graph_outputs:
            return None
        return users[0]

    # -- constants ---------------------------------------------------------------------
    def const(self, name: str) -> np.ndarray | None:
        """The value of an initializer or of a Constant node's output, else None."""
        from onnx import numpy_helper

        if not name:
            return None
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
                if attr.name == "value_float":
                    import numpy as np

                    return np.array(attr.f, dtype=np.float32)
                if attr.name == "value_floats":
                    import numpy as np

                    return np.array(list(attr.floats), dtype=np.float32)
        return None

    def add_initializer(self, hint: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh_name(hint)
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        self.initializers[name] = self.graph.initializer[-1]
        return name

    def fresh_name(self, hint: str) -> str:
        taken = set(self.producer) | set(self.initializers) | {value.name for value in self.graph.input}
        while True:
            self._counter += 1
            name = f"{hint}__hmt{self._counter}"
            if name not in taken:
                return name

    # -- edits -------------------------------------------------------------------------
    def remove(self, *nodes: onnx.NodeProto) -> None:
        doomed = {id(node) for node in nodes}
        keep = [node for node in self.graph.node if id(node) not in doomed]
        del self.graph.node[:]
        self.graph.node.extend(keep)

    def rename_uses(self, old: str, new: str) -> None:
        """Make every reader of ``old`` read ``new`` (graph outputs keep their name via the producer)."""
        for node in self.graph.node:
            for i, name in enumerate(node.input):
                if name == old:
                    node.input[i] = new

    def bypass(self, node: onnx.NodeProto, *, keep_input: str) -> None:
        """Remove a node whose output equals ``keep_input`` (identity-like).

        If the node's output is a graph output, the producer of ``keep_input`` is renamed
        to write the graph output directly (when that is safe).
        """
        out = node.output[0]
        if out in self.graph_outputs:
            producer = self.producer.get(keep_input)
            if producer is None or keep_input in self.graph_outputs or len(self.consumers.get(keep_input, [])) != 1:
                return
            for i, name in enumerate(producer.output):
                if name == keep_input:
                    producer.output[i] = out
            self.remove(node)
        else:
            self.rename_uses(out, keep_input)
            self.remove(node)
        self.refresh()

    def replace_output_producer(self, old_tail: onnx.NodeProto, new_node: onnx.NodeProto) -> None:
        """Insert ``new_node`` where ``old_tail`` was, so the order stays topological."""
        index = next(i for i, node in enumerate(self.graph.node) if node is old_tail)
        self.graph.node.insert(index, new_node)

    def prune(self) -> int:
        """Remove nodes whose outputs nobody reads, and unused initializers. Returns nodes removed."""
        removed = 0
        while True:
            used = {name for node in self.graph.node for name in node.input if name} | self.graph_outputs
            for node in self.graph.node:
                for attr in node.attribute:
                    if attr.type in (5, 10):  # GRAPH, GRAPHS: subgraphs may read outer names
                        used |= _subgraph_reads(attr)
            dead = [node for node in self.graph.node if not any(out in used for out in node.output if out)]
            if not dead:
                break
            removed += len(dead)
            self.remove(*dead)
        used = {name for node in self.graph.node for name in node.input if name} | self.graph_outputs
        for node in self.graph.node:
            for attr in node.attribute:
                if attr.type in (5, 10):
                    used |= _subgraph_reads(attr)
        keep = [init for init in self.graph.initializer if init.name in used]
        if len(keep) != len(self.graph.initializer):
            del self.graph.initializer[:]
            self.graph.initializer.extend(keep)
            input_keep = [
                value for value in self.graph.input if value.name in used or value.name not in self.initializers
            ]
            del self.graph.input[:]
            self.graph.input.extend(input_keep)
        self.refresh()
        return removed


def _infer_shapes(model: onnx.ModelProto) -> tuple[dict[str, tuple[int | None, ...]], dict[str, int]]:
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - a pass then simply does not fire where it needs shapes
        return {}, {}
    shapes: dict[str, tuple[int | None, ...]] = {}
    dtypes: dict[str, int] = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tensor_type = value.type.tensor_type
        if tensor_type.elem_type:
            dtypes[value.name] = int(tensor_type.elem_type)
        if not tensor_type.HasField("shape"):
            continue
        shapes[value.name] = tuple(
            dim.dim_value if dim.HasField("dim_value") else None for dim in tensor_type.shape.dim
        )
    return shapes, dtypes


def _subgraph_reads(attr: Any) -> set[str]:
    graphs = [attr.g] if attr.type == 5 else list(attr.graphs)
    names: set[str] = set()
    for graph in graphs:
        for node in graph.node:
            names.update(name for name in node.input if name)
            for sub in node.attribute:
                if sub.type in (5, 10):
                    names |= _subgraph_reads(sub)
    return names


def apply_until_fixed(view: GraphView, rules: Sequence[Callable[[GraphView], bool]]) -> int:
    """Apply each rewrite rule until it stops firing (one rewrite per call); the count."""
    fired = 0
    for rule in rules:
        while rule(view):
            fired += 1
    return fired


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    import onnx

    for entry in node.attribute:
        if entry.name == name:
            return onnx.helper.get_attribute_value(entry)
    return default


def set_attr(node: onnx.NodeProto, name: str, value: Any) -> None:
    import onnx

    for i, entry in enumerate(node.attribute):
        if entry.name == name:
            del node.attribute[i]
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))


def is_float(value: np.ndarray) -> bool:
    import numpy as np

    return bool(np.issubdtype(value.dtype, np.floating))
