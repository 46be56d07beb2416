"""TVM (Relax) compilation of one ONNX graph into a shared library for a deploy target.

The graph is imported and compiled with the target's dict-form TVM target (``mtriple``,
``mcpu``, ``mattr``); the objects are linked by the target's compiler, which for an Arm
board is the cross-compiler (Debian's ``aarch64-linux-gnu-gcc``). TVM's import and
compile helpers are fuse's, so both stages see the same frontend behaviour.
"""

from __future__ import annotations

import time
from pathlib import Path

from hmt.deploy.elf import read_elf_header
from hmt.deploy.targets import Target
from hmt.errors import ModelError


def compile_graph(onnx_path: Path, target: Target, out_path: Path) -> float:
    """Compile ``onnx_path`` for ``target`` into ``out_path``; returns the compile time in s.

    Raises :class:`ModelError` naming the graph when TVM cannot import, compile or link
    it, or when the library it links is not for the target's machine.
    """
    import onnx
    from tvm.support import cc

    from hmt.fuse.engines import tvm as tvm_engine

    compiler = target.compiler()
    start = time.perf_counter()
    try:
        model = onnx.load(str(onnx_path))
    except Exception as exc:
        raise ModelError(f"{onnx_path}: not a loadable ONNX model ({exc})") from exc
    try:
        mod = tvm_engine.import_onnx(model)
        executable = tvm_engine.compile_module(mod, target.tvm_target)
    except ModelError as exc:
        raise ModelError(f"{onnx_path.name}: {exc}") from exc
    # "-s": no symbol table or debug info (a third of the size); the dynamic symbols the
    # TVM runtime looks up stay.
    fcompile = cc.cross_compiler(compiler, options=["-s"])
    try:
        executable.export_library(str(out_path), fcompile=fcompile)
    except Exception as exc:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower() and not line.startswith("Command line")]
        detail = (errors or lines or [type(exc).__name__])[-1]
        raise ModelError(f"{onnx_path.name}: linking with {compiler} failed: {detail}") from exc
    compile_s = time.perf_counter() - start
    machine = read_elf_header(out_path).machine
    if machine != target.elf_machine:
        raise ModelError(f"{out_path.name}: linked for {machine}, expected {target.elf_machine} "
                         f"(compiler {compiler})")
    return compile_s
