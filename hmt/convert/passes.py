"""The two graph passes of CrowdHMTware III-B2.

Pass 1, fusion and redundancy removal: hmt's registered elimination passes (identity,
duplicate, noop) plus the two fusions that only simplify the graph (conv-batchnorm,
linear), each verified against ONNX Runtime by the pass runner.

Pass 2, constants: every node is classified constant (depends on no graph input) or
dynamic; constant subgraphs are evaluated and replaced by their values and dead nodes
removed, by onnxslim (default) or onnxsim.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from hmt.errors import ModelError, UsageError
from hmt.graph.model import constant_node_count, op_counts

if TYPE_CHECKING:
    import onnx

Folder = Literal["onnxslim", "onnxsim"]
FOLDERS: tuple[str, ...] = ("onnxslim", "onnxsim")
PASS1_NAMES = ("identity", "duplicate", "noop", "conv-batchnorm", "linear")


@dataclass(frozen=True)
class PassStage:
    name: str
    op_counts_before: dict[str, int]
    op_counts_after: dict[str, int]
    constant_nodes_before: int
    constant_nodes_after: int
    details: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nodes_before": sum(self.op_counts_before.values()),
            "nodes_after": sum(self.op_counts_after.values()),
            "op_counts_before": self.op_counts_before,
            "op_counts_after": self.op_counts_after,
            "constant_nodes_before": self.constant_nodes_before,
            "constant_nodes_after": self.constant_nodes_after,
            "details": self.details,
        }


def fuse_and_deduplicate(model: onnx.ModelProto, *, seed: int) -> tuple[onnx.ModelProto, PassStage]:
    """Pass 1."""
    from hmt.graph.passes import apply_passes, resolve_passes

    out, reports = apply_passes(model, resolve_passes(list(PASS1_NAMES)), seed=seed)
    stage = PassStage(
        "pass1-fusion-redundancy",
        op_counts(model),
        op_counts(out),
        constant_node_count(model),
        constant_node_count(out),
        [r.to_json() for r in reports],
    )
    return out, stage


def fold_constants(model: onnx.ModelProto, *, folder: Folder = "onnxslim") -> tuple[onnx.ModelProto, PassStage]:
    """Pass 2."""
    if folder not in FOLDERS:
        raise UsageError(f"unknown constant folder {folder!r}; choose from {', '.join(FOLDERS)}")
    constants_before = constant_node_count(model)
    sink = io.StringIO()
    quiet = logging.getLogger("onnxslim")
    level = quiet.level
    try:
        quiet.setLevel(logging.ERROR)
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            out = _fold_onnxslim(model) if folder == "onnxslim" else _fold_onnxsim(model)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"constant folding with {folder} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        quiet.setLevel(level)
    stage = PassStage(
        f"pass2-constant-folding[{folder}]",
        op_counts(model),
        op_counts(out),
        constants_before,
        constant_node_count(out),
        [{"folder": folder}],
    )
    return out, stage


def _fold_onnxslim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx
    import onnxslim

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    # Constant folding and dead-node removal only: fusions belong to pass 1 and to fuse.
    out = onnxslim.slim(
        copy,
        skip_optimizations=["graph_fusion", "subexpression_elimination", "weight_tying"],
    )
    if out is None:
        raise ModelError("onnxslim returned no model (its own output check failed)")
    return out


def _fold_onnxsim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx
    import onnxsim

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    out, ok = onnxsim.simplify(copy, skip_fuse_bn=True)
    if not ok:
        raise ModelError("onnxsim could not validate its simplified model")
    return out
