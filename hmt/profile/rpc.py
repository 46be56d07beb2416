"""Timing on a remote device through TVM's RPC tracker (or in-process with TVM).

Each model is imported from ONNX into Relax, built for ``target`` here, exported as a
shared library (cross-compiled with ``cc`` when given), uploaded to a device the tracker
hands out for ``key`` and timed there with ``time_evaluator``. The runner has the same
``time()`` as the ONNX Runtime one, so the block table, probe fits and validation run
unchanged on a remote device.

Untuned TVM 0.27 CPU code is far slower than ONNX Runtime on the same CPU (see
shared/measurements): a remote table measures the engine the device will run, so it
should be built with the same target and tuning database as deploy will use.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hmt.errors import DeviceError, UsageError
from hmt.profile.parsers import spread
from hmt.profile.timing import Conditions, Measurement, sustained_ms


def parse_tracker(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(f"--rpc expects host:port of a TVM RPC tracker, got {address!r}")
    return host, int(port)


def parse_target(text: str) -> Any:
    """A TVM target from a kind name ('llvm') or a JSON dict (the form TVM 0.27 accepts with -mcpu)."""
    import tvm

    spec: Any = text
    if text.strip().startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--rpc-target is not valid JSON: {exc}") from exc
    try:
        return tvm.target.Target(spec)
    except Exception as exc:
        raise UsageError(f"--rpc-target {text!r} is not a TVM target ({exc})") from exc


class TvmRunner:
    """Times ONNX models with TVM Relax on a session: remote (tracker) or local."""

    engine = "tvm"
    interleaves = False  # timed on the device by time_evaluator: no local callable to interleave

    def __init__(self, *, tracker: str | None = None, key: str | None = None, target: str = "llvm",
                 cc: str | None = None, session_timeout_s: int = 600, priority: int = 1) -> None:
        import tvm
        from tvm import rpc

        self.version = tvm.__version__
        self.target = parse_target(target)
        self.cc = cc
        self.remote = tracker is not None
        if tracker is not None:
            if not key:
                raise UsageError("--rpc needs --key: the device key the RPC server registered with the tracker")
            host, port = parse_tracker(tracker)
            try:
                client = rpc.connect_tracker(host, port)
                keys = sorted(client.summary().get("queue_info", {}))
            except Exception as exc:
                raise DeviceError(f"TVM RPC: cannot reach the tracker at {tracker} ({exc})") from exc
            if key not in keys:
                # A request for an unknown key would wait in the tracker's queue forever.
                raise DeviceError(f"TVM RPC: tracker {tracker} has no server with key {key!r} (keys: {keys or 'none'});"
                                  " start one with python -m tvm.exec.rpc_server --tracker HOST:PORT --key NAME")
            try:
                self.session = client.request(key, priority=priority, session_timeout=session_timeout_s)
            except Exception as exc:
                raise DeviceError(f"TVM RPC: cannot get a device with key {key!r} from tracker {tracker} ({exc})") \
                    from exc
            self.where = f"rpc://{tracker}/{key}"
        else:
            self.session = rpc.LocalSession()
            self.where = "local"
        self._dir = tempfile.TemporaryDirectory(prefix="hmt-tvm-")
        self._count = 0

    def _build(self, onnx_bytes: bytes) -> Any:
        import onnx
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx

        model = onnx.load_from_string(onnx_bytes)
        try:  # fold shape arithmetic into constants: TVM's importer refuses dynamic Pad/Reshape inputs
            import onnxslim

            model = onnxslim.slim(model)
        except ImportError:
            pass
        module = from_onnx(model, keep_params_in_input=False)
        executable = relax.build(module, target=self.target)
        self._count += 1
        name = f"m{self._count}.so"
        path = Path(self._dir.name) / name
        if self.cc:
            from tvm.contrib import cc as tvm_cc

            executable.export_library(str(path), fcompile=tvm_cc.cross_compiler(self.cc))
        else:
            executable.export_library(str(path))
        self.session.upload(str(path))
        return self.session.load_module(name)

    def prepare(self, module: Any, shape: Sequence[int], *, seed: int = 0) -> Any:
        raise UsageError("TVM runs are timed on the device by time_evaluator; energy calibration needs "
                         "--engine onnxruntime (or torch) on this machine")

    def time(self, module: Any, shape: Sequence[int], *, warmup: int, repeats: int) -> Measurement:
        import onnx

        from hmt.profile.timing import export_onnx_bytes, identity_onnx_bytes

        onnx_bytes = export_onnx_bytes(module, shape[1:], batch=shape[0])
        if all(node.op_type == "Identity" for node in onnx.load_from_string(onnx_bytes).graph.node):
            # A pass-through block (a skipped layer): time the engine's fixed cost instead,
            # since a Relax function returning its own argument trips time_evaluator.
            onnx_bytes = identity_onnx_bytes(shape, op="Relu")
        return self.time_onnx(onnx_bytes, shape, warmup=warmup, repeats=repeats)

    def overhead_ms(self, shape: Sequence[int], *, warmup: int, repeats: int) -> float:
        from hmt.profile.timing import identity_onnx_bytes

        # Relu, not Identity: a Relax function that returns its own argument trips time_evaluator.
        return self.time_onnx(identity_onnx_bytes(shape, op="Relu"), shape, warmup=warmup,
                              repeats=repeats).sustained_or_median_ms

    def time_onnx(self, onnx_bytes: bytes, input_shape: Sequence[int], *, warmup: int, repeats: int,
                  seed: int = 0) -> Measurement:
        import datetime as dt

        import tvm
        from tvm import relax

        try:
            library = self._build(onnx_bytes)
            device = self.session.cpu()
            vm = relax.VirtualMachine(library, device)
            x = np.random.default_rng(seed).standard_normal(tuple(input_shape)).astype(np.float32)
            data = tvm.runtime.tensor(x, device)
            evaluator = vm.time_evaluator("main", device, number=1, repeat=repeats, min_repeat_ms=0)
            for _ in range(warmup):
                vm["main"](data)
            seconds = list(evaluator(data).results)
        except Exception as exc:
            raise DeviceError(f"TVM ({self.where}): timing failed: {exc}") from exc
        s = spread([t * 1e3 for t in seconds])
        return Measurement(s.median, s.p10, s.p90, s.iqr, s.n, warmup, Conditions(None, 0.0, sum(seconds)),
                           dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                           sustained_ms([t * 1e3 for t in seconds]))

    def close(self) -> None:
        self._dir.cleanup()
