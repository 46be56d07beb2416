"""serve --peer under a memory and an energy budget, the peer SIGKILLed half way: the one decision
(variant, cut, codec and adapted copy scored together, hmt.serve.deciding.joint) against the offload
planner's own loop as serve --peer ran it before (every variant loaded, budgets other than latency
ignored), in the same run; and the decision time of the loop with every gene in it against the
local-only loop on the same bundle.

The bundle: the offload tests' two-variant conv bundle (``deep``: accurate, 5 MB, energy 2;
``shallow``: 1 MB, energy 1) split by ``hmt deploy --offload-out`` into device and peer halves.
Budgets (serve.json): latency 200 ms, memory 3 MB (below deep's footprint), energy 1.2 per
inference; ``mu`` 0.5 (as on a half-full battery), so the device's energy weighs in eq. 3 and
offloading pays while the peer lives. Each mode gets its own real peer process (``hmt serve
--role peer``, loopback) and sends ``--requests`` requests one after another from this process;
the peer is killed after half of them.

Per request: answered or failed, latency, the route that answered and that route's device energy
as the profile gives it (energy x the device's share of the compute; the decision additionally
scales by the load model and measured/predicted latency, which this yardstick leaves out so both
modes are read alike). Memory: the recorded footprints of the variants the device holds. Decision
time: the loop's own per-tick records (``decision_us``: eq. 3 + the switcher; ``estimate_us``: costing
every candidate), ticks every 20 ms.

    PYTHONPATH=$PWD python -m benchmarks.offload.joint_budgets --requests 600 --reps 3 --out r.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Driver

REPO = Path(__file__).resolve().parents[2]
MEMORY_MB = 3.0
ENERGY = 1.2
LATENCY_MS = 200.0
ENERGY_OF = {"deep": 2.0, "shallow": 1.0}
MEMORY_OF = {"deep": 5.0, "shallow": 1.0}
SERVE = {"budgets": {"latency_ms": LATENCY_MS, "memory_mb": MEMORY_MB, "energy": ENERGY},
         "optimizer": {"mu_no_battery": 0.5}, "monitor_period_s": 0.02}


def make_bundles(folder: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(REPO / "tests" / "offload"))
    from offload_bundles import make_conv_bundle

    from hmt.deploy.offload import write_offload_bundles

    source = make_conv_bundle(folder / "bundle", serve=SERVE, memory_mb=MEMORY_OF)
    out = write_offload_bundles(source, folder / "device", folder / "peer", seed=3)
    return out.device, out.peer


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _drive(predict: Any, n: int, kill: Any, rng: np.random.Generator) -> dict[str, Any]:
    """``n`` requests one after another; ``kill()`` after half. Per request: (ok, latency, route, energy)."""
    from offload_bundles import INPUT_SHAPE

    failed, latencies, energies, routes = 0, [], [], []
    for i in range(n):
        if i == n // 2:
            kill()
        x = rng.standard_normal(INPUT_SHAPE).astype(np.float32)
        t0 = time.perf_counter()
        try:
            arch_id, where, share = predict(x)
        except Exception:  # noqa: BLE001 - a failed request is what is counted here
            failed += 1
            continue
        latencies.append((time.perf_counter() - t0) * 1e3)
        energies.append(ENERGY_OF[arch_id] * share)
        routes.append(f"{arch_id}@{where}")
        time.sleep(0.002)
    return {"requests": n, "failed": failed, "latency_ms_p50": _pct(latencies, 50),
            "latency_ms_p95": _pct(latencies, 95),
            "latency_miss_share": sum(t > LATENCY_MS for t in latencies) / max(1, len(latencies)),
            "energy_over_budget_share": sum(e > ENERGY + 1e-9 for e in energies) / max(1, len(energies)),
            "energy_max": max(energies) if energies else None,
            "routes": {r: routes.count(r) for r in sorted(set(routes))}}


def _share(device: Any, arch_id: str, cut: int | None) -> float:
    """The device's share of a variant's compute on a route (warm times on this device)."""
    chain = device.chains[arch_id]
    return 1.0 if cut is None else min(1.0, chain.device_ms(chain.cut(cut)) / chain.device_ms(None))


def run_joint(device_bundle: Path, peer_bundle: Path, n: int, seed: int) -> dict[str, Any]:
    from benchmarks.offload.scenario import free_port, start_peer
    from hmt.offload.session import PeerLink, open_device
    from hmt.serve.running.session import SessionOptions

    port = free_port()
    peer = start_peer(peer_bundle, port)
    wrapped = open_device(device_bundle, SessionOptions(), PeerLink(f"http://127.0.0.1:{port}"), deadline_ms=2000.0,
                          seed=seed)
    try:
        wrapped.start()
        memory = [sum(MEMORY_OF[a] for a in wrapped.device.chains)]

        def predict(x: np.ndarray) -> tuple[str, str, float]:
            p = wrapped.predict(x)
            arch_id, where = p.variant.split("@", 1)
            where, _, cut = where.partition(":cut")
            memory.append(sum(MEMORY_OF[a] for a in wrapped.device.chains))
            local = where in ("local", "fallback")  # the fallback ran the tail here too
            return arch_id, where, 1.0 if local else _share(wrapped.device, arch_id, int(cut) if cut else None)

        out = _drive(predict, n, peer.kill, np.random.default_rng(seed))
        ticks = list(wrapped._controller.ticks)
        out |= {"memory_mb_max": max(memory), "loaded": sorted(wrapped.device.chains),
                "decision_us": [t.decision_us for t in ticks], "estimate_us": [t.estimate_us for t in ticks],
                "decision_us_all": list(wrapped._controller.stats.decision_us)}
    finally:
        wrapped.stop()
        peer.kill()
        peer.wait(10)
    return out


def run_planner(device_bundle: Path, peer_bundle: Path, n: int, seed: int) -> dict[str, Any]:
    """The baseline: OffloadDevice with its own planner (every variant loaded, mu 0.5 as the loop gave it)."""
    from benchmarks.offload.scenario import free_port, start_peer
    from hmt.bundle import load_bundle
    from hmt.offload.client import PeerClient
    from hmt.offload.device import DeviceOptions, OffloadDevice
    from hmt.offload.plan import load_plan

    port = free_port()
    peer = start_peer(peer_bundle, port)
    bundle = load_bundle(device_bundle)
    device = OffloadDevice(bundle, load_plan(bundle), PeerClient(f"http://127.0.0.1:{port}"),
                           DeviceOptions(budget_ms=LATENCY_MS, mu=0.5), rng=np.random.default_rng(seed))
    try:
        device.start()

        def predict(x: np.ndarray) -> tuple[str, str, float]:
            r = device.predict(x)
            local = r.where in ("local", "fallback")
            return r.variant, r.where, 1.0 if local else _share(device, r.variant, r.cut)

        out = _drive(predict, n, peer.kill, np.random.default_rng(seed))
        out |= {"memory_mb_max": sum(MEMORY_OF[a] for a in device.chains), "loaded": sorted(device.chains)}
    finally:
        device.stop()
        peer.kill()
        peer.wait(10)
    return out


def run_local_loop(device_bundle: Path, n: int, seed: int) -> dict[str, Any]:
    """Decision time of the local-only loop (no peer: variants only) on the same bundle and settings."""
    from hmt.serve.running.session import SessionOptions, open_controller

    controller = open_controller(device_bundle, SessionOptions())
    try:
        controller.start()
        out = _drive(lambda x: (controller.predict(x).variant, "local", 1.0), n, lambda: None,
                     np.random.default_rng(seed))
        out["decision_us"] = [t.decision_us for t in controller.ticks]
        out["estimate_us"] = [t.estimate_us for t in controller.ticks]
        out["decision_us_all"] = list(controller.stats.decision_us)
    finally:
        controller.stop()
    return out


def _med(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _timing(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [v for r in runs for v in r[f"{key}_all" if key == "decision_us" else key]]
    return {"p50": _pct(values, 50), "p99": _pct(values, 99), "ticks": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hmt-joint-") as tmp:
        device_bundle, peer_bundle = make_bundles(Path(tmp))
        modes: dict[str, list[dict[str, Any]]] = {"joint": [], "planner": [], "local_loop": []}
        for rep in range(args.reps):  # alternating, so each mode sees the same machine
            seed = args.seed + rep
            modes["joint"].append(run_joint(device_bundle, peer_bundle, args.requests, seed))
            modes["planner"].append(run_planner(device_bundle, peer_bundle, args.requests, seed))
            modes["local_loop"].append(run_local_loop(device_bundle, args.requests, seed))
    report: dict[str, Any] = {"budgets": {"latency_ms": LATENCY_MS, "memory_mb": MEMORY_MB, "energy": ENERGY},
                              "requests_per_run": args.requests, "reps": args.reps, "modes": {}}
    for name, runs in modes.items():
        summary: dict[str, Any] = {key: _med(runs, key) for key in (
            "failed", "latency_ms_p50", "latency_ms_p95", "latency_miss_share", "energy_over_budget_share",
            "energy_max", "memory_mb_max")}
        summary["failed_total"] = sum(r["failed"] for r in runs)
        summary["loaded"] = runs[0].get("loaded")
        summary["routes_first_run"] = runs[0]["routes"]
        if "decision_us" in runs[0]:
            summary["decision_us"] = _timing(runs, "decision_us")
            summary["estimate_us"] = _timing(runs, "estimate_us")
        report["modes"][name] = summary
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["modes"], indent=2))


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    joint, planner, local = (report["modes"][m] for m in ("joint", "planner", "local_loop"))
    out = [
        {"claim": "serve --peer with the one decision: failed requests with the peer SIGKILLed half way, "
                  f"over {report['reps']} runs of {report['requests_per_run']}",
         "figure": str(joint["failed_total"])},
        {"claim": f"memory held on the device (recorded footprints, budget {MEMORY_MB} MB): one decision vs the "
                  "planner's own loop", "figure": f"{joint['memory_mb_max']} vs {planner['memory_mb_max']} MB"},
        {"claim": f"share of requests answered on a route over the energy budget {ENERGY}: one decision vs the "
                  "planner's own loop", "figure": f"{joint['energy_over_budget_share']:.3f} vs "
                                                  f"{planner['energy_over_budget_share']:.3f}"},
    ]
    d, e, b = joint["decision_us"], joint["estimate_us"], local["decision_us"]
    if d["p50"] is not None and b["p50"] is not None:
        out.append({"claim": "decision time in the loop with every gene (variant, precision, cut, codec, adapted) "
                             "vs the local-only loop, p50 / p99 (this machine, shared)",
                    "figure": f"{d['p50']:.1f} / {d['p99']:.1f} us vs {b['p50']:.1f} / {b['p99']:.1f} us "
                              f"({d['ticks']} and {b['ticks']} ticks)"})
        out.append({"claim": "costing every candidate (the estimate stage, outside the decision time), p50 / p99",
                    "figure": f"{e['p50']:.1f} / {e['p99']:.1f} us"})
    return out


BENCH = Driver(
    baseline="the offload planner's own loop as serve --peer ran it before (OffloadDevice.predict: every variant "
             "loaded, only the latency budget), and the local-only control loop for decision time; same bundle, "
             "same request stream, peer killed at the same point, alternating in one run",
    quick=["--requests", "160", "--reps", "1", "--out", "{report}"],
    default=["--requests", "600", "--reps", "3", "--out", "{report}"],
    claims=_claims,
    timeout_s=900.0,
)


if __name__ == "__main__":
    main()
