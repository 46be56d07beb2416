"""TVM Relax as a fuse engine: import, compile for the host (or CUDA), export, run, tune.

TVM 0.27 pitfalls handled here (shared/measurements/README.md):
- CLI target strings such as ``"llvm -mcpu=native"`` are refused and ``mcpu: native`` is
  ignored: the target is a dict with the host CPU that LLVM detects (e.g. ``znver4``).
- MetaSchedule's ``LocalBuilder`` workers import ``tvm.s_tir.tensor_intrin`` (~40 s
  each here) and time out; :class:`InProcessBuilder` builds the already-scheduled
  candidates in this process without those intrinsics, and tuning calls
  ``meta_schedule.tune_tasks`` on the extracted tasks directly.
- The tuning work dir must exist beforehand; its JSON database is reused across runs
  and variants (records match identical layer shapes only).
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.errors import DeviceError, ModelError
from hmt.graph.model import cpu_count_physical
from hmt.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    import numpy as np
    import onnx


def host_cpu() -> str:
    """The LLVM name of this machine's CPU (e.g. ``znver4``), or ``generic``."""
    from tvm.target import codegen

    name = str(codegen.llvm_get_system_cpu())
    return name if name and name != "generic" else "generic"


def target_config(device: str = "cpu", *, mcpu: str | None = None, cuda_arch: str | None = None) -> dict[str, Any]:
    """The dict form of the TVM target for ``device`` ("cpu" or "cuda")."""
    import tvm

    host: dict[str, Any] = {"kind": "llvm", "mcpu": mcpu or host_cpu(), "num-cores": cpu_count_physical()}
    if device == "cpu":
        return host
    if device == "cuda":
        dev = tvm.cuda(0)
        if not dev.exist:
            raise DeviceError("TVM finds no CUDA device here")
        arch = cuda_arch or "sm_" + str(dev.compute_version).replace(".", "")
        return {"kind": "cuda", "arch": arch, "host": host}
    raise DeviceError(f"unknown device {device!r}; expected cpu or cuda")


def import_onnx(model: onnx.ModelProto) -> Any:
    """The Relax IRModule of a static-shape ONNX model (weights bound as constants)."""
    from tvm.relax.frontend.onnx import from_onnx

    try:
        return from_onnx(model, keep_params_in_input=False)
    except Exception as exc:
        first = str(exc).strip().splitlines()
        raise ModelError(f"TVM's ONNX frontend cannot import the model: {type(exc).__name__}: "
                         f"{first[-1] if first else exc}") from exc


def compile_module(mod: Any, target: dict[str, Any], *, database_dir: Path | None = None) -> Any:
    """``tvm.compile`` (untuned), or the MetaSchedule database applied when ``database_dir`` is given."""
    import tvm

    tvm_target = tvm.target.Target(target)
    try:
        if database_dir is None:
            return tvm.compile(mod, target=tvm_target)
        from tvm.s_tir import meta_schedule as ms

        database = ms.database.JSONDatabase(work_dir=str(database_dir))
        return ms.relax_integration.compile_relax(database, mod, tvm_target, params=None)
    except Exception as exc:
        raise ModelError(f"TVM cannot compile the model for {target}: {type(exc).__name__}: {exc}") from exc


def export_library(executable: Any, path: Path) -> None:
    try:
        executable.export_library(str(path))
    except Exception as exc:
        raise ModelError(f"TVM cannot export the shared library {path.name}: {exc}") from exc


def make_runner(library: Path, feeds: dict[str, np.ndarray], *, device: str = "cpu") -> Callable[[], list[Any]]:
    """A zero-argument callable running the exported module once; returns numpy outputs."""
    import tvm
    from tvm import relax

    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    module = tvm.runtime.load_module(str(library))
    vm = relax.VirtualMachine(module, dev)
    args = [tvm.runtime.tensor(value, dev) for value in feeds.values()]
    vm.set_input("main", *args)

    def run() -> list[Any]:
        vm.invoke_stateful("main")
        out = vm.get_outputs("main")
        if device == "cuda":
            dev.sync()
        return flatten_outputs(out)

    return run


def flatten_outputs(value: Any) -> list[Any]:
    import tvm

    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    if isinstance(value, (list, tuple)) or (hasattr(value, "__len__") and not hasattr(value, "numpy")):
        items: list[Any] = []
        for item in value:
            items.extend(flatten_outputs(item))
        return items
    return [value.numpy()]


@dataclass(frozen=True)
class TuningRecord:
    trials_requested: int
    tasks: int
    tuning_s: float
    work_dir: str
    records_before: int
    records_after: int
    cost_model: str

    def to_json(self) -> dict[str, Any]:
        return {
            "trials_requested": self.trials_requested,
            "tasks": self.tasks,
            "tuning_s": round(self.tuning_s, 2),
            "work_dir": self.work_dir,
            "database_records_before": self.records_before,
            "database_records_after": self.records_after,
            "cost_model": self.cost_model,
        }


def _in_process_builder() -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder

    @derived_object
    class InProcessBuilder(PyBuilder):
        """Build scheduled candidates here, without importing every tensor intrinsic."""

        def build(self, build_inputs: list[Any]) -> list[Any]:
            from tvm.driver import build as tvm_build
            from tvm.s_tir.meta_schedule.builder.local_builder import default_export
            from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

            results = []
            for item in build_inputs:
                try:
                    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(item.mod)
                    results.append(BuilderResult(default_export(tvm_build(mod, target=item.target)), None))
                except Exception as exc:  # noqa: BLE001 - a failed candidate is a result, not a crash
                    results.append(BuilderResult(None, f"{type(exc).__name__}: {exc}"))
            return results

    return InProcessBuilder()


def _count_records(work_dir: Path) -> int:
    path = work_dir / "database_tuning_record.json"
    if not path.is_file():
        return 0
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())


def _fused_for_tuning(mod: Any, target: Any) -> Any:
    """The module after the same dispatch/legalize/fuse passes ``compile_relax`` runs before it
    applies the database, so that the extracted tasks and the database keys match."""
    import tvm
    from tvm import relax

    passes = [
        *relax.pipeline.library_dispatch_passes(target),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    with target:
        return tvm.transform.Sequential(passes)(mod)


def tune(
    mod: Any,
    target: dict[str, Any],
    *,
    work_dir: Path,
    trials: int,
    seed: int,
    progress: ProgressCallback = no_progress,
) -> TuningRecord:
    """MetaSchedule tuning of ``mod``'s tasks into the JSON database in ``work_dir`` (created if absent)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    work_dir.mkdir(parents=True, exist_ok=True)
    before = _count_records(work_dir)
    tvm_target = tvm.target.Target(target)
    cost_model = "xgb" if importlib.util.find_spec("xgboost") is not None else "random"
    # MetaSchedule's console handler takes the package logger's level when it is set up:
    # ERROR keeps the library quiet; the full logs still go to work_dir/logs.
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    previous_level = ms_logger.level
    ms_logger.setLevel(logging.ERROR)
    start = time.perf_counter()
    try:
        extracted = ms.relax_integration.extract_tasks(_fused_for_tuning(mod, tvm_target), tvm_target)
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            extracted, str(work_dir), seed=seed
        )
        progress("tune", 0, trials, f"{len(contexts)} tasks")
        if contexts:
            ms.tune_tasks(
                tasks=contexts,
                task_weights=weights,
                work_dir=str(work_dir),
                max_trials_global=trials,
                num_trials_per_iter=min(64, max(4, trials // max(1, len(contexts)))),
                builder=_in_process_builder(),
                runner=ms.runner.LocalRunner(timeout_sec=60),
                database=ms.database.JSONDatabase(work_dir=str(work_dir)),
                cost_model=cost_model,
            )
    except Exception as exc:
        raise ModelError(f"TVM MetaSchedule tuning failed: {type(exc).__name__}: {exc}") from exc
    finally:
        ms_logger.setLevel(previous_level)
    progress("tune", trials, trials, None)
    return TuningRecord(trials, len(extracted), time.perf_counter() - start, str(work_dir), before,
                        _count_records(work_dir), cost_model)
