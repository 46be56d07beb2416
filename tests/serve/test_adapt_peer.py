"""serve --adapt with --peer: a real peer process over a real socket; the drift monitor sees the
offloaded inputs too, and the adapted copy is one more candidate of the one decision (device only,
its memory and energy counted)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from adapt_bundle import ARCH, make_adaptable_bundle
from test_adapt import FAST

from hmt.deploy.offload import write_offload_bundles
from hmt.offload.session import PeerLink, open_device
from hmt.serve.running.adapt import ADAPTED_SUFFIX
from hmt.serve.running.session import SessionOptions
from tests.offload.test_fallback import TOKEN, _start_peer


def _until(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _inputs(x: torch.Tensor, n: int, seed: int, shift: bool) -> list[np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(x), (n,), generator=g)
    return [((0.3 * x[i:i + 1] - 1.0) if shift else x[i:i + 1]).numpy() for i in idx]


@pytest.mark.slow
def test_adapt_with_peer(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    source, _, x, _ = make_adaptable_bundle(tmp_path / "bundle")
    bundles = write_offload_bundles(source, tmp_path / "device", tmp_path / "peer", seed=0)
    proc, url = _start_peer(bundles.peer)
    wrapped: Any = None
    try:
        # An energy budget below the variant's all-local energy (1.0): only a cut meets it, so
        # requests cross the socket to the peer.
        options = SessionOptions(adapt=FAST, latency_ms=2000.0)
        wrapped = open_device(bundles.device, options, PeerLink(url, token=TOKEN), deadline_ms=2000.0)
        controller = wrapped._controller
        controller.set_budgets(2000.0, None, 0.9)
        wrapped.start()
        answered = [wrapped.predict(i).variant for i in _inputs(x, 48, 0, shift=False)]
        assert all(v.startswith(f"{ARCH}@peer") for v in answered), answered
        # Shifted inputs, answered by the peer: the device's drift monitor sees them and the adapted
        # copy is built and adopted on the device.
        for i in _inputs(x, 400, 1, shift=True):
            wrapped.predict(i)
            if controller.adapt.adopted_arch_id is not None:
                break
        _until(lambda: controller.adapt.adopted_arch_id is not None)
        assert wrapped.device.counts["peer"] >= 48 and wrapped.device.counts["fallback"] == 0
        # Still under the energy budget the adapted copy (all local, energy 1.0) is not feasible.
        controller.tick()
        assert not controller.route[0].adapted and controller.route[0].cut is not None
        # The energy budget lifted: the one decision runs the adapted copy, on the device.
        controller.set_budgets(2000.0, None, None, keep_energy=False)
        controller.tick()
        candidate = controller.route[0]
        assert candidate.adapted and candidate.cut is None
        assert candidate.memory_bytes > controller.optimizer.variant(ARCH).memory_bytes
        shifted = _inputs(x, 4, 2, shift=True)
        assert {wrapped.predict(i).variant for i in shifted} == {f"{ARCH}{ADAPTED_SUFFIX}@local"}
        status = wrapped.status()
        assert status["offload"]["route"]["adapted"] and status["adapt"]["serving_adapted"] == ARCH + ADAPTED_SUFFIX
    finally:
        if wrapped is not None:
            wrapped.stop()
        proc.kill()
        proc.wait(10)
