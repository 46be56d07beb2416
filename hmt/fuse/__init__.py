"""fuse: fusion passes, memory plan and engine choice for converted graphs (CrowdHMTware III-C)."""

import hmt.offline_python  # noqa: F401 - refuses Python < 3.10 with a message saying what runs there
from hmt.fuse.memory_plan import MemoryPlan, TensorLifetime, plan_arena, plan_memory, tensor_lifetimes
from hmt.fuse.pipeline import ENGINES, FUSED_KIND, FuseOptions, fuse_model
from hmt.fuse.result import FusedVariant, FuseResult

__all__ = [
    "ENGINES",
    "FUSED_KIND",
    "FuseOptions",
    "FuseResult",
    "FusedVariant",
    "MemoryPlan",
    "TensorLifetime",
    "fuse_model",
    "plan_arena",
    "plan_memory",
    "tensor_lifetimes",
]
