"""``hmt serve BUNDLE --peer URL``: the device API with offloading, over the ordinary controller.

The serve controller keeps doing what it does (monitor, load index, ``/v1/status``,
``/metrics``); :class:`OffloadingController` puts :class:`OffloadDevice` on the request
path, which chooses variant and cut together and finishes locally when the peer fails.
It wraps the controller instead of changing it, so the API needs no change: everything
but ``predict``, ``status`` and ``stop`` is the controller's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hmt.errors import ModelError
from hmt.offload.client import PeerClient
from hmt.offload.device import DeviceOptions, OffloadDevice
from hmt.offload.parts import SplitChain
from hmt.offload.plan import load_plan
from hmt.offload.planner import PlannerConfig
from hmt.runtime.chain import Runner
from hmt.serve.controller import Controller, Prediction
from hmt.serve.http.api import ApiOptions
from hmt.serve.http.server import ServerOptions
from hmt.serve.running.session import SessionOptions, open_controller, run_until_stopped

PEER_TOKEN_ENV = "HMT_PEER_TOKEN"


@dataclass(frozen=True)
class PeerLink:
    url: str
    token: str | None = None
    cafile: Path | None = None


class OffloadingController:
    """A :class:`Controller` whose requests go through an :class:`OffloadDevice`."""

    def __init__(self, controller: Controller, device: OffloadDevice) -> None:
        self._controller = controller
        self.device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._controller, name)

    def predict(self, x: np.ndarray, queued_ms: float = 0.0) -> Prediction:
        ticks = self._controller.ticks
        if ticks:  # the loop's mu (from the battery) weighs accuracy against the device's energy
            self.device.mu = ticks[-1].mu
        result = self.device.predict(x)
        latency_ms = queued_ms + result.latency_ms
        return Prediction(result.class_index, result.confidence, result.exit,
                          f"{result.variant}@{result.where}" + ("" if result.cut is None else f":cut{result.cut}"),
                          result.latency_ms, latency_ms, latency_ms > self.device.options.budget_ms)

    def status(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        doc: dict[str, Any] = self._controller.status(*args, **kwargs)
        doc["offload"] = self.device.status()
        return doc

    def start(self) -> None:
        self._controller.start()
        self.device.start()

    def stop(self) -> None:
        self.device.stop()
        self._controller.stop()


def open_device(bundle_path: Path | str, options: SessionOptions, link: PeerLink, *, deadline_ms: float,
                planner: PlannerConfig | None = None, seed: int = 0) -> OffloadingController:
    # One set of sessions: the controller's pool gets its runners from the offload device's
    # chains (the same graph objects) instead of loading every variant a second time.
    chains: dict[str, SplitChain] = {}

    def shared(arch_id: str) -> Runner:
        chain = chains.get(arch_id)
        if chain is None:
            raise ModelError(f"variant {arch_id!r} is not loaded by the offload device")
        return chain.runner()

    controller = open_controller(bundle_path, options, loader=shared)
    budget = controller.budgets.latency_ms if controller.budgets.latency_ms is not None else deadline_ms
    early = controller.settings.early_exit
    device = OffloadDevice(controller.bundle, load_plan(controller.bundle),
                           PeerClient(link.url, token=link.token, cafile=link.cafile),
                           DeviceOptions(budget_ms=budget, confidence=early.confidence if early.enabled else None,
                                         fixed_variant=options.fixed_variant),
                           planner_config=planner, rng=np.random.default_rng(seed),
                           threads=max(1, options.threads or 1), engine=controller.engine)
    chains.update(device.chains)
    return OffloadingController(controller, device)


def serve_device_forever(bundle_path: Path | str, options: SessionOptions, api: ApiOptions, server: ServerOptions,
                         link: PeerLink, *, on_listening: Callable[[str], None] | None = None,
                         seed: int = 0) -> dict[str, Any]:
    """Serve with a peer until SIGTERM/SIGINT; returns the final status after the drain."""
    wrapped = open_device(bundle_path, options, link, deadline_ms=api.deadline_ms, seed=seed)
    return run_until_stopped(wrapped, api, server, on_listening=on_listening)
