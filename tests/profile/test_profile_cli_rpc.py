"""The command line, background load, and TVM RPC on loopback (slow)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from commands.app import _register, app
from hmt.profile.load import background_load, measure_load_model
from hmt.profile.timing import time_callable

_register()


def test_cli_unknown_device_and_estimated_profile(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["profile-device", "--device", "pixel-9", "--out", str(tmp_path / "p")])
    assert bad.exit_code == 2 and "unknown device 'pixel-9'" in bad.output
    ok = runner.invoke(app, ["profile-device", "--device", "raspberry-pi-4b", "--out", str(tmp_path / "pi"), "--json"])
    assert ok.exit_code == 0, ok.output
    document = json.loads(ok.stdout)
    assert document["origin"] == "estimated" and document["device"] == "raspberry-pi-4b"
    assert (tmp_path / "pi" / "manifest.json").is_file()


def test_cli_two_power_sources_and_missing_trace(tmp_path: Path) -> None:
    runner = CliRunner()
    both = runner.invoke(app, ["profile-device", "--monsoon", "--power", "rapl", "--out", str(tmp_path / "p")])
    assert both.exit_code == 2 and "choose one power source" in both.output
    missing = runner.invoke(app, ["profile-device", "--power-trace", str(tmp_path / "none.csv"), "--out",
                                  str(tmp_path / "p")])
    assert missing.exit_code == 3 and "does not exist; expected a power trace" in missing.output
    assert not (tmp_path / "p").exists()


def test_help_teaches_with_examples() -> None:
    result = CliRunner().invoke(app, ["profile-device", "--help"])
    assert result.exit_code == 0 and "hmt profile-device --quick --out runs/profile" in result.output


def test_background_load_is_seen_and_cleaned_up() -> None:
    data = np.ones(1 << 16, dtype=np.float32)

    def timer():  # type: ignore[no-untyped-def]
        return time_callable(lambda: data.sum(), warmup=1, repeats=5, min_window_s=0.3)

    with background_load(1) as procs:
        pids = [p.pid for p in procs]
        loaded = timer()
    assert loaded.conditions.background_util > 0.2
    time.sleep(0.1)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    model, samples = measure_load_model([("sum", timer)], processes=(1,))
    assert len(samples) == 2 and model.alpha >= 0


def test_torch_runner_on_cpu() -> None:
    from torch import nn

    from hmt.profile.timing import TorchRunner

    runner = TorchRunner(device="cpu")
    m = runner.time(nn.Conv2d(4, 8, 3, padding=1).eval(), (1, 4, 8, 8), warmup=1, repeats=3)
    assert m.n >= 3 and m.median_ms > 0 and runner.engine == "torch"
    assert runner.overhead_ms((1, 4, 8, 8), warmup=1, repeats=3) > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_rpc_tracker_loopback() -> None:
    pytest.importorskip("tornado")
    from torch import nn
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    from hmt.errors import DeviceError, UsageError
    from hmt.profile.rpc import TvmRunner, parse_tracker

    tracker = Tracker(host="127.0.0.1", port=_free_port(), port_end=65000, silent=True)
    server = Server(host="127.0.0.1", port=_free_port(), port_end=65000, tracker_addr=("127.0.0.1", tracker.port),
                    key="loopback", silent=True)
    try:
        time.sleep(1.0)
        runner = TvmRunner(tracker=f"127.0.0.1:{tracker.port}", key="loopback", target="llvm")
        module = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU()).eval()
        measurement = runner.time(module, (1, 4, 8, 8), warmup=1, repeats=3)
        assert measurement.n == 3 and 0 < measurement.median_ms < 1000
        assert 0 < runner.overhead_ms((1, 4, 8, 8), warmup=1, repeats=3) < 1000
        runner.close()
        with pytest.raises(UsageError, match="--key"):
            TvmRunner(tracker=f"127.0.0.1:{tracker.port}", key=None)
        with pytest.raises(DeviceError, match="no server with key .no-such-board"):
            TvmRunner(tracker=f"127.0.0.1:{tracker.port}", key="no-such-board", session_timeout_s=2)
    finally:
        server.terminate()
        tracker.terminate()
    with pytest.raises(UsageError, match="host:port"):
        parse_tracker("localhost")
