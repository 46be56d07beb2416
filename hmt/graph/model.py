"""ONNX graph helpers shared by convert and fuse: safe loading, counts, a mutable graph view.

Everything here works on ``onnx.ModelProto`` objects; onnx and numpy are imported inside
functions so that importing this module stays cheap.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.artifacts import safe_join
from hmt.errors import InputError, ModelError

if TYPE_CHECKING:
    import numpy as np
    import onnx

# Protobuf refuses to serialise a single message above 2 GiB; larger models keep their
# weights in one external data file beside the graph.
_SINGLE_FILE_LIMIT_BYTES = (1 << 31) - (1 << 24)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Nodes of the main graph by op type (domain-qualified when not the default domain)."""
    counts: Counter[str] = Counter()
    for node in model.graph.node:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        counts[key] += 1
    return dict(sorted(counts.items()))


def _iter_graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    import onnx

    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _iter_graph_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _iter_graph_tensors(sub)


def iter_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor stored in the model: initializers and tensor attributes, subgraphs included."""
    yield from _iter_graph_tensors(model.graph)


def load_onnx(path: Path | str) -> onnx.ModelProto:
    """Load an ONNX file, reading external data only from inside the model's own folder.

    Refused with :class:`UnsafePathError`: external-data locations that are absolute,
    contain ``..``, or resolve (through symlinks) outside the folder. A truncated or
    non-ONNX file raises :class:`InputError` naming the file.
    """
    import onnx

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: does not exist; expected an ONNX file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise InputError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc
    if not model.graph.node and not model.graph.output:
        raise InputError(f"{path}: not an ONNX model (no graph nodes or outputs; truncated or wrong file?)")
    if not model.opset_import:
        raise InputError(f"{path}: ONNX model declares no opset (truncated or wrong file?)")
    base = path.resolve().parent
    for tensor in iter_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        target = safe_join(base, location, what=f"external data of tensor {tensor.name!r} in {path.name}")
        if not target.is_file():
            raise InputError(f"{path}: external data file {location!r} of tensor {tensor.name!r} is missing")
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else None
            with open(target, "rb") as handle:
                handle.seek(offset)
                data = handle.read() if length is None else handle.read(length)
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: cannot read external data {location!r} ({exc})") from exc
        if length is not None and len(data) != length:
            raise InputError(
                f"{path}: external data {location!r} of tensor {tensor.name!r} is truncated "
                f"({len(data)} of {length} bytes)"
            )
        tensor.raw_data = data
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return model


def save_onnx(model: onnx.ModelProto, path: Path) -> list[Path]:
    """Save as one self-contained file, or graph + ``<name>.data`` when above protobuf's 2 GiB.

    Returns the files written.
    """
    import onnx

    if model.ByteSize() < _SINGLE_FILE_LIMIT_BYTES:
        path.write_bytes(model.SerializeToString())
        return [path]
    data_name = path.name + ".data"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data_name)
    return [path, path.with_name(data_name)]


def check_model(model: onnx.ModelProto, *, what: str) -> None:
    """``onnx.checker`` with the full check (shape inference included); ModelError on failure."""
    import onnx

    try:
        if model.ByteSize() < _SINGLE_FILE_LIMIT_BYTES:
            onnx.checker.check_model(model, full_check=True)
        else:  # the checker cannot take a >2 GiB proto in memory
            onnx.checker.check_model(model, full_check=False)
    except Exception as exc:
        raise ModelError(f"{what}: onnx.checker refused the model: {exc}") from exc


def unknown_ops(model: onnx.ModelProto) -> list[str]:
    """Op types that no registered ONNX schema (for the model's opsets) defines."""
    import onnx

    opsets = {entry.domain or "": entry.version for entry in model.opset_import}
    missing = []
    for node in model.graph.node:
        domain = node.domain or ""
        if domain in ("", "ai.onnx", "ai.onnx.ml"):
            version = opsets.get(domain, opsets.get("", 1))
            if not onnx.defs.has(node.op_type, domain if domain != "ai.onnx" else ""):
                missing.append(f"{domain + '.' if domain else ''}{node.op_type}")
                continue
            try:
                onnx.defs.get_schema(node.op_type, version, domain if domain != "ai.onnx" else "")
            except Exception:  # noqa: BLE001
                missing.append(f"{node.op_type} (opset {version})")
        elif domain != "com.microsoft":
            missing.append(f"{domain}.{node.op_type}")
    return sorted(set(missing))


def constant_node_names(model: onnx.ModelProto) -> set[str]:
    """Outputs of nodes whose value does not depend on any graph input (the 'constant' class)."""
    constants = {init.name for init in model.graph.initializer}
    graph_inputs = {value.name for value in model.graph.input} - constants
    constant_outputs: set[str] = set()
    for node in model.graph.node:
        inputs = [name for name in node.input if name]
        if node.op_type in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"):
            continue
        if all((name in constants or name in constant_outputs) and name not in graph_inputs for name in inputs):
            constant_outputs.update(out for out in node.output if out)
    return constant_outputs


def constant_node_count(model: onnx.ModelProto) -> int:
    outputs = constant_node_names(model)
    return sum(1 for node in model.graph.node if node.output and all(out in outputs for out in node.output if out))


@dataclass(frozen=True)
class TensorSpec:
    """A named graph input or output with a static shape."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


def graph_inputs(model: onnx.ModelProto, *, default_dim: int = 1) -> list[TensorSpec]:
    """The model's real inputs (initializers excluded); symbolic dims become ``default_dim``."""
    return _specs(model, model.graph.input, default_dim=default_dim, skip_initializers=True)


def graph_outputs(model: onnx.ModelProto, *, default_dim: int = 1) -> list[TensorSpec]:
    return _specs(model, model.graph.output, default_dim=default_dim, skip_initializers=False)


def _specs(model: onnx.ModelProto, values: Any, *, default_dim: int, skip_initializers: bool) -> list[TensorSpec]:
    import onnx

    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in values:
        if skip_initializers and value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dims = []
        for dim in tensor_type.shape.dim:
            dims.append(dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else default_dim)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name if tensor_type.elem_type else "float32"
        specs.append(TensorSpec(value.name, tuple(dims), dtype))
    return specs


def seeded_inputs(specs: list[TensorSpec], *, seed: int) -> dict[str, np.ndarray]:
    """Random inputs for verification: standard normal floats, small non-negative ints."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        dtype = np.dtype(spec.dtype)
        if np.issubdtype(dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[spec.name] = rng.integers(0, 2, spec.shape).astype(np.bool_)
        else:
            feeds[spec.name] = rng.integers(0, 4, spec.shape).astype(dtype)
    return feeds


def ort_optimization_level(level: str) -> Any:
    """ONNX Runtime's enum for a level name: disable, basic, extended or all."""
    from hmt.runtime.ort import optimization_level

    return optimization_level(level)


def ort_session(model: onnx.ModelProto, *, level: str = "all", threads: int = 0) -> Any:
    """An ONNX Runtime CPU session on an in-memory model; ModelError naming the cause on failure."""
    from hmt.runtime.ort import OrtOptions
    from hmt.runtime.ort import ort_session as build_session

    return build_session(model.SerializeToString(), OrtOptions(level=level, intra_op_threads=threads),
                         what="the model").session


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, level: str = "all") -> list[np.ndarray]:
    session = ort_session(model, level=level)
    try:
        return list(session.run(None, feeds))
    except Exception as exc:
        raise ModelError(f"ONNX Runtime failed to run the model: {exc}") from exc


def cpu_count_physical() -> int:
    """Physical cores (falls back to logical ones), for thread pools and TVM's num-cores."""
    try:
        import psutil

        count = psutil.cpu_count(logical=False)
    except Exception:  # noqa: BLE001
        count = None
    return max(1, count or os.cpu_count() or 1)
