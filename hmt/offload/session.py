"""``hmt serve BUNDLE --peer URL``: the device API with offloading, over the ordinary controller.

The serve controller decides, as without a peer, but over every gene at once
(:mod:`hmt.serve.deciding.joint`): variant (and precision), offload cut and codec, and the
adapted copy under ``--adapt``, within the latency, memory and energy budgets, with the load
index and the measured-first estimates. :class:`OffloadDevice` supplies the cut costs and the
measured link and runs the route chosen: the head here, the tail on the peer, the tail here
when the peer fails. Variants over the memory budget are not loaded at all. The wrapper keeps
the API unchanged: everything but ``predict``, ``status``, ``start`` and ``stop`` is the
controller's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from hmt.errors import ModelError, UsageError
from hmt.offload.client import PeerClient
from hmt.offload.device import WHERE_LOCAL, DeviceOptions, OffloadDevice
from hmt.offload.plan import load_plan
from hmt.offload.planner import Choice as PlannerChoice
from hmt.offload.planner import Option, PlannerConfig
from hmt.runtime.chain import Runner
from hmt.serve.controller import Controller, Prediction
from hmt.serve.http.api import ApiOptions
from hmt.serve.http.server import ServerOptions, is_loopback
from hmt.serve.running.session import SessionOptions, open_controller, run_until_stopped

PEER_TOKEN_ENV = "HMT_PEER_TOKEN"
DEADLINE_SHARE = 0.9  # of the request deadline the device plans with when serve.json sets no latency budget


@dataclass(frozen=True)
class PeerLink:
    url: str
    token: str | None = None
    cafile: Path | None = None

    def checked(self) -> list[str]:
        """Refuses a peer off loopback without a token: such a peer answers every segment 401 (it
        refuses to serve off loopback without one), so the device would serve alone, silently. Returns
        a note for a plain-HTTP peer off loopback (tensors cross the network unencrypted)."""
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--peer {self.url[:200]}: expected http://HOST:PORT or https://HOST:PORT")
        if is_loopback(parts.hostname):
            return []
        if self.token is None:
            raise UsageError(f"--peer {self.url[:200]} is off loopback: pass --peer-token or set {PEER_TOKEN_ENV} "
                             "(the peer's own token; a peer off loopback answers nothing without it)")
        if parts.scheme == "http":
            return [f"the peer {parts.hostname} is reached over plain HTTP: tensors and the token cross the "
                    "network unencrypted; serve the peer with --ssl-certfile and give https:// (and --peer-cafile)"]
        return []


class OffloadingController:
    """A :class:`Controller` whose requests go through an :class:`OffloadDevice`."""

    def __init__(self, controller: Controller, device: OffloadDevice) -> None:
        self._controller = controller
        self.device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._controller, name)

    def predict(self, x: np.ndarray, queued_ms: float = 0.0) -> Prediction:
        controller = self._controller
        route = controller.route
        active = controller.active_arch_id
        if route is None or route[0].cut is None or route[0].arch_id != active or active not in self.device.chains:
            # All on the device: the controller's own path (measured into the estimates; the adapted
            # copy when the decision's adapt gene says so).
            prediction = controller.predict(x, queued_ms)
            self.device.counts[WHERE_LOCAL] += 1
            return replace(prediction, variant=f"{prediction.variant}@local")
        candidate, predicted_ms, remote_ms, energy = route
        option = Option(candidate.arch_id, candidate.cut, candidate.codec, predicted_ms, energy, 0.0, True, remote_ms)
        self.device.last_choice = PlannerChoice(option, option, False, "serve's joint decision")
        result = self.device.run(x, option, spent_ms=queued_ms)
        if controller.adapt is not None:
            controller.adapt.offer(x)  # drift is watched on every input, offloaded or not
        latency_ms = queued_ms + result.latency_ms
        budget_ms = controller.budgets.latency_ms
        miss = budget_ms is not None and latency_ms > budget_ms
        with controller.state_lock:
            controller.stats.add_request(latency_ms, miss, result.exit, result.variant)
        if miss:
            controller.request_tick()
        return Prediction(result.class_index, result.confidence, result.exit,
                          f"{result.variant}@{result.where}" + ("" if result.cut is None else f":cut{result.cut}"),
                          result.latency_ms, latency_ms, miss, result.probabilities)

    def status(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        doc: dict[str, Any] = self._controller.status(*args, **kwargs)
        offload = self.device.status()
        route = self._controller.route
        offload["route"] = None if route is None else {
            "candidate": route[0].label, "precision": route[0].precision, "cut": route[0].cut,
            "codec": route[0].codec, "adapted": route[0].adapted, "predicted_ms": route[1],
            "memory_bytes": route[0].memory_bytes, "energy": route[3]}
        offload["loaded"] = sorted(self.device.chains)
        doc["offload"] = offload
        return doc

    def start(self) -> None:
        self.device.start()  # the peer's status first: the first decision knows whether it is usable
        self._controller.start()

    def stop(self) -> None:
        self.device.stop()
        self._controller.stop()


def open_device(bundle_path: Path | str, options: SessionOptions, link: PeerLink, *, deadline_ms: float,
                planner: PlannerConfig | None = None, seed: int = 0) -> OffloadingController:
    # One set of sessions: the controller's pool gets its runners from the offload device's
    # chains (the same graph objects) instead of loading every variant a second time.
    # The device loads the variants within the memory budget at start, the others when the decision
    # first chooses one, and releases what the pool evicts.
    devices: list[OffloadDevice] = []

    def shared(arch_id: str) -> Runner:
        if not devices:
            raise ModelError(f"variant {arch_id!r}: the offload device is not open yet")
        return devices[0].load_variant(arch_id).runner()

    controller = open_controller(bundle_path, options, loader=shared)
    # Without a latency budget the request's deadline bounds the peer's wait and the fallback after it;
    # a share of it stays back for what the request spent before its body was in and the fallback's jitter.
    budget = controller.budgets.latency_ms if controller.budgets.latency_ms is not None \
        else deadline_ms * DEADLINE_SHARE
    early = controller.settings.early_exit
    device = OffloadDevice(controller.bundle, load_plan(controller.bundle),
                           PeerClient(link.url, token=link.token, cafile=link.cafile),
                           DeviceOptions(budget_ms=budget, confidence=early.confidence if early.enabled else None,
                                         fixed_variant=options.fixed_variant,
                                         budget_given=controller.budgets.latency_ms is not None),
                           planner_config=planner, rng=np.random.default_rng(seed),
                           threads=max(1, options.threads or 1), engine=controller.engine,
                           only=within_memory(controller))
    devices.append(device)
    controller.attach_routes(device)
    controller.on_evicted = lambda evicted: [device.drop_variant(a) for a in evicted]
    device.on_peer_change = controller.request_tick  # a new route soon, not at the next period
    return OffloadingController(controller, device)


def within_memory(controller: Controller) -> list[str]:
    """The variants the device loads: those within the memory budget (serve.json's preload limit
    included); the least memory one when none is (the decision's own fallback)."""
    capacity = controller.capacity_bytes()
    variants = controller.optimizer.variants
    fits = [v.arch_id for v in variants if capacity is None or v.memory_bytes <= capacity]
    return fits or [min(variants, key=lambda v: v.memory_bytes).arch_id]


def serve_device_forever(bundle_path: Path | str, options: SessionOptions, api: ApiOptions, server: ServerOptions,
                         link: PeerLink, *, on_listening: Callable[[str], None] | None = None,
                         seed: int = 0) -> dict[str, Any]:
    """Serve with a peer until SIGTERM/SIGINT; returns the final status after the drain."""
    wrapped = open_device(bundle_path, options, link, deadline_ms=api.deadline_ms, seed=seed)
    return run_until_stopped(wrapped, api, server, on_listening=on_listening)
