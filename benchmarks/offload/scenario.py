"""Benchmark of offloading on one machine: a weak device, a peer, a throttled link, five phases.

Processes (all real, on loopback):

- the peer: ``hmt serve PEER_BUNDLE --role peer`` pinned to core 1 (``taskset``);
- the link: the asyncio throttling proxy (:mod:`hmt.offload.proxy`) on core 1, following the
  scenario's link columns;
- the device: an :class:`OffloadDevice` pinned to core 0 and, where cgroup v1's cpu
  controller is writable, held to ``--device-cpu-share`` of that core (a CFS quota: the
  weak device); it sends ``--rate-hz`` labelled CIFAR-10 test images, one at a time.

Phases of ``--phase-s`` each: 1 fast link (100 Mbit/s, 1 ms RTT); 2 slow link (2 Mbit/s,
40 ms RTT); 3 fast link, the peer SIGKILLed at its start; 4 the peer restarted; 5 the
device's core busy (a spinning process in the device's cgroup on its core). The same
scenario runs three times in the same run: ``adaptive`` (the planner chooses the cut),
``local`` (all local) and ``offload`` (always the input cut while the peer is usable).
All three serve the bundle's most accurate variant (``--variant`` to change it), so the
comparison is about where it runs. Per mode and phase: the option in force, p50/p95
latency of a request on the device (head + transfer + peer + answer, or fallback), deadline
misses against ``--budget-ms``, accuracy and failed requests; and, after the kill, how long
the first answer took.

    python -m benchmarks.offload.scenario --bundle runs/demo/bundle-x86-64 --out benchmarks/offload

Writes OUT/results.json, OUT/scenario.csv and per mode OUT/<mode>/requests.csv and
OUT/<mode>/timeline.csv (the option in force every 0.25 s, with the link estimate).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Driver

REPO = Path(__file__).resolve().parents[2]
PHASES = ("fast", "slow", "peer_killed", "peer_back", "device_busy")
MODES = ("adaptive", "local", "offload")
CGROUP = Path("/sys/fs/cgroup/cpu/hmt-offload-device")


def scenario_csv(phase_s: float) -> str:
    rows = ["time_s,link_bandwidth_mbit_s,link_rtt_ms,link_loss,peer,device_busy",
            "0,100,1,0,up,0", f"{phase_s:g},2,40,0,up,0", f"{2 * phase_s:g},100,1,0,killed,0",
            f"{3 * phase_s:g},100,1,0,up,0", f"{4 * phase_s:g},100,1,0,up,1"]
    return "\n".join(rows) + "\n"


def phase_of(t_s: float, phase_s: float) -> str:
    return PHASES[max(0, min(len(PHASES) - 1, int(t_s // phase_s)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the device process ----------------------------------------------------------------------


def run_device(args: argparse.Namespace) -> None:
    from hmt.bundle import load_bundle
    from hmt.offload.client import PeerClient
    from hmt.offload.device import DeviceOptions, OffloadDevice
    from hmt.offload.plan import load_plan
    from hmt.offload.planner import PlannerConfig

    bundle = load_bundle(args.device_bundle)
    data = np.load(args.data)
    order = np.random.default_rng(args.seed).permutation(len(data["y"]))  # the set is sorted by class
    x_all, y_all = data["x"][order], data["y"][order]
    fixed_cut = {"adaptive": None, "local": -1, "offload": 0}[args.mode]
    config = PlannerConfig(local_with_peer=args.mode != "offload")
    device = OffloadDevice(bundle, load_plan(bundle), PeerClient(args.peer_url),
                           DeviceOptions(budget_ms=args.budget_ms, fixed_cut=fixed_cut, fixed_variant=args.variant,
                                         status_every_s=args.status_every_s, idle_probe_s=args.idle_probe_s),
                           planner_config=config, rng=np.random.default_rng(args.seed))
    device.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = args.t0
    end = t0 + len(PHASES) * args.phase_s
    while time.time() < t0:
        time.sleep(0.005)
    rows: list[list[Any]] = []
    timeline: list[list[Any]] = []
    next_status = t0
    i = 0
    while (now := time.time()) < end:
        target = t0 + i / args.rate_hz
        if now < target:
            time.sleep(target - now)
        start = time.time()
        x = x_all[i % len(x_all)][None]
        try:
            r = device.predict(x)
            rows.append([round(start - t0, 4), phase_of(start - t0, args.phase_s), r.where,
                         "local" if r.cut is None else r.cut, r.codec, round(r.latency_ms, 3),
                         int(r.deadline_miss), int(r.class_index == int(y_all[i % len(y_all)])), 0,
                         r.peer_error or "", r.class_index, i % len(y_all)])
        except Exception as exc:  # noqa: BLE001 - a failed request is what this benchmark counts
            rows.append([round(start - t0, 4), phase_of(start - t0, args.phase_s), "failed", "", "",
                         round((time.time() - start) * 1e3, 3), 1, 0, 1, type(exc).__name__, -1, i % len(y_all)])
        if start >= next_status:
            s = device.status()
            choice = s["choice"] or {}
            timeline.append([round(start - t0, 3), phase_of(start - t0, args.phase_s),
                             choice.get("option"), round(choice.get("predicted_ms") or 0.0, 3),
                             round(s["link"]["rtt_ms"], 3), round(min(1e4, s["link"]["bandwidth_mbit_s"]), 3),
                             s["breaker"]["state"], round(s["device_ratio"], 3), round(s["peer_ratio"], 3),
                             round(s["exchange_ms"], 3), round(s["remote_factor"], 3)])
            next_status = start + 0.25
        i += 1
    device.stop()
    with open(out / "requests.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_s", "phase", "where", "cut", "codec", "latency_ms", "deadline_miss", "correct",
                         "failed", "peer_error", "class", "sample"])
        writer.writerows(rows)
    with open(out / "timeline.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_s", "phase", "option", "predicted_ms", "rtt_ms", "bandwidth_mbit_s", "breaker",
                         "device_ratio", "peer_ratio", "exchange_ms", "remote_factor"])
        writer.writerows(timeline)


def run_proxy_process(args: argparse.Namespace) -> None:
    from hmt.offload.proxy import LinkScenario, run_proxy

    scenario = LinkScenario.from_csv(args.scenario)
    asyncio.run(run_proxy(args.listen_port, args.upstream_port, scenario, args.t0,
                          len(PHASES) * args.phase_s + 5.0, args.seed))


# -- the orchestrator ------------------------------------------------------------------------


def _cgroup(share: float) -> Path | None:
    if share <= 0:
        return None
    try:
        CGROUP.mkdir(exist_ok=True)
        # The shortest period the kernel takes with its least quota (1 ms), so one inference is
        # slowed throughout, as on a slower CPU, rather than running at full speed, then stalling.
        quota_us = 1000
        period_us = round(quota_us / share)
        (CGROUP / "cpu.cfs_quota_us").write_text("-1")  # a period below the old quota is refused
        (CGROUP / "cpu.cfs_period_us").write_text(str(period_us))
        (CGROUP / "cpu.cfs_quota_us").write_text(str(quota_us))
        return CGROUP
    except OSError as exc:
        print(f"warning: no CPU quota for the device ({exc}); it gets its whole core", file=sys.stderr)
        return None


def _pin(core: int, argv: list[str], group: Path | None = None, **kwargs: Any) -> subprocess.Popen[str]:
    proc = subprocess.Popen(["taskset", "-c", str(core), *argv], text=True, **kwargs)
    if group is not None:
        (group / "cgroup.procs").write_text(str(proc.pid))
    return proc


def start_peer(bundle: Path, port: int) -> subprocess.Popen[str]:
    env = os.environ | {"PYTHONPATH": str(REPO)}
    proc = _pin(1, [sys.executable, "-m", "commands", "serve", str(bundle), "--role", "peer", "--port", str(port),
                    "--json"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "peer serving" in line:
            return proc
    raise RuntimeError(f"the peer did not start (exit {proc.wait()})")


def run_mode(args: argparse.Namespace, mode: str, device_bundle: Path, peer_bundle: Path, data: Path,
             scenario: Path, group: Path | None, folder: Path) -> dict[str, Any]:
    peer_port, proxy_port = free_port(), free_port()
    env = os.environ | {"PYTHONPATH": str(REPO)}
    me = [sys.executable, str(Path(__file__).resolve())]
    peer = start_peer(peer_bundle, peer_port)
    t0 = time.time() + args.lead_s
    common = ["--phase-s", str(args.phase_s), "--t0", repr(t0), "--seed", str(args.seed)]
    proxy = _pin(1, [*me, "proxy", "--listen-port", str(proxy_port), "--upstream-port", str(peer_port),
                     "--scenario", str(scenario), *common], env=env)
    time.sleep(0.5)
    device = _pin(0, [*me, "device", "--device-bundle", str(device_bundle), "--data", str(data), "--mode", mode,
                      "--peer-url", f"http://127.0.0.1:{proxy_port}", "--budget-ms", str(args.budget_ms),
                      "--rate-hz", str(args.rate_hz), "--out", str(folder),
                      "--status-every-s", str(args.status_every_s), "--idle-probe-s", str(args.idle_probe_s),
                      *(["--variant", args.variant] if args.variant else []), *common], group, env=env)
    events: dict[str, Any] = {}
    burner = None
    try:
        time.sleep(max(0.0, t0 + 2 * args.phase_s - time.time()))
        peer.send_signal(signal.SIGKILL)
        events["peer_killed_s"] = time.time() - t0
        peer.wait()
        time.sleep(max(0.0, t0 + 3 * args.phase_s - time.time()))
        events["peer_restart_s"] = time.time() - t0
        peer = start_peer(peer_bundle, peer_port)
        events["peer_ready_s"] = time.time() - t0
        time.sleep(max(0.0, t0 + 4 * args.phase_s - time.time()))
        burner = _pin(0, [sys.executable, "-c", "while True: pass"], group)
        events["busy_s"] = time.time() - t0
        if group is not None:
            time.sleep(max(0.0, min(2.0, t0 + 5 * args.phase_s - time.time() - 0.5)))
            events["cgroup_cpu_stat_busy"] = (group / "cpu.stat").read_text().split()
        device.wait(timeout=args.phase_s * 2 + args.lead_s + 60)
    finally:
        for proc in (burner, device, proxy, peer):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    return summarize(folder, events, args, args.reference)


def summarize(folder: Path, events: dict[str, float], args: argparse.Namespace,
              reference: np.ndarray | None = None) -> dict[str, Any]:
    with open(folder / "requests.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    phases: dict[str, Any] = {}
    for phase in PHASES:
        sel = [r for r in rows if r["phase"] == phase]
        lat = np.array([float(r["latency_ms"]) for r in sel]) if sel else np.array([np.nan])
        where: dict[str, int] = {}
        options: dict[str, int] = {}
        for r in sel:
            where[r["where"]] = where.get(r["where"], 0) + 1
            key = "local" if r["cut"] == "local" else f"cut{r['cut']}/{r['codec']}"
            options[key] = options.get(key, 0) + 1
        phases[phase] = {
            "requests": len(sel), "failed": sum(int(r["failed"]) for r in sel),
            "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
            "deadline_miss_share": sum(int(r["deadline_miss"]) for r in sel) / max(1, len(sel)),
            "accuracy": sum(int(r["correct"]) for r in sel) / max(1, len(sel)),
            # the same answer as the whole variant run locally in fp32 (codec and fallback effects)
            "agreement": None if reference is None else
            sum(int(r["class"]) == int(reference[int(r["sample"])]) for r in sel) / max(1, len(sel)),
            "where": where, "option": max(options, key=lambda k: options[k]) if options else None,
            "options": options,
        }
    killed = float(events.get("peer_killed_s", math.inf))
    after = [r for r in rows if float(r["t_s"]) >= killed]
    first = after[0] if after else None
    return {"phases": phases, "events": events,
            "first_after_kill": None if first is None else {
                "where": first["where"], "latency_ms": float(first["latency_ms"]),
                "answered_s_after_kill": float(first["t_s"]) + float(first["latency_ms"]) / 1e3 - killed,
                "within_deadline": float(first["latency_ms"]) <= args.budget_ms}}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase over the repetitions: medians of p50/p95 (and the p95 range), mean miss share and
    accuracy, summed failed requests, the option most often in force."""
    out: dict[str, Any] = {}
    for phase in PHASES:
        rows = [r["phases"][phase] for r in runs]
        options: dict[str, int] = {}
        for row in rows:
            for key, count in row["options"].items():
                options[key] = options.get(key, 0) + count
        out[phase] = {"p50_ms": float(np.median([r["p50_ms"] for r in rows])),
                      "p95_ms": float(np.median([r["p95_ms"] for r in rows])),
                      "p95_ms_range": [min(r["p95_ms"] for r in rows), max(r["p95_ms"] for r in rows)],
                      "deadline_miss_share": float(np.mean([r["deadline_miss_share"] for r in rows])),
                      "accuracy": float(np.mean([r["accuracy"] for r in rows])),
                      "agreement": None if rows[0].get("agreement") is None else
                      float(np.mean([r["agreement"] for r in rows])),
                      "failed": sum(r["failed"] for r in rows), "requests": sum(r["requests"] for r in rows),
                      "option": max(options, key=lambda k: options[k]) if options else None, "options": options}
    firsts = [r["first_after_kill"] for r in runs if r["first_after_kill"]]
    return {"phases": out, "first_after_kill_ms": [f["latency_ms"] for f in firsts],
            "first_after_kill_where": [f["where"] for f in firsts],
            "first_after_kill_within_deadline": bool(firsts) and all(f["within_deadline"] for f in firsts)}


def reference_classes(bundle_path: Path, arch_id: str, data: Path, seed: int) -> np.ndarray:
    """The class of every sample, in the device's order, from the whole variant run here in fp32."""
    from hmt.bundle import load_bundle
    from hmt.offload.parts import SplitChain
    from hmt.offload.plan import load_plan

    bundle = load_bundle(bundle_path)
    chain = SplitChain(bundle, bundle.spec.variant(arch_id), load_plan(bundle).for_variant(arch_id))
    loaded = np.load(data)
    x = loaded["x"][np.random.default_rng(seed).permutation(len(loaded["y"]))]
    return np.array([chain.run_local(x[i][None], None).class_index for i in range(len(x))])


def targets(results: dict[str, Any], budget_ms: float) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    for phase in PHASES:
        a, loc, off = (results[m]["phases"][phase] for m in MODES)
        better = min(loc["p95_ms"], off["p95_ms"])
        checks[phase] = {"p95_within_10pct_of_better": a["p95_ms"] <= 1.1 * better,
                         "misses_at_most_5pct": a["deadline_miss_share"] <= 0.05,
                         "not_worse_than_local": a["p95_ms"] <= 1.1 * loc["p95_ms"],
                         "failed": a["failed"]}
    checks["first_answer_after_kill_within_deadline"] = results["adaptive"]["first_after_kill_within_deadline"]
    return checks


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    """p95 per phase of the adaptive mode against all-local, same scenario and run."""
    results = report["results"]
    if "adaptive" not in results or "local" not in results:
        return []
    claims = []
    for phase, s in results["adaptive"]["phases"].items():
        local = results["local"]["phases"].get(phase)
        if local is None:
            continue
        claims.append({"claim": f"offload, phase {phase}: adaptive p95 against all-local "
                                f"(budget {report['budget_ms']:g} ms)",
                       "figure": f"{s['p95_ms']:.1f} ms against {local['p95_ms']:.1f} ms, "
                                 f"misses {s['deadline_miss_share'] * 100:.0f} %, {s['failed']} failed"})
    return claims


BENCH = Driver(
    baseline="local (all on the device) and offload (always the input cut) over the same scenario, in "
             "the same run",
    quick=["--synthetic", "--phase-s", "2", "--lead-s", "4", "--modes", "adaptive,local", "--samples", "200",
           "--rate-hz", "10", "--budget-ms", "100", "--out", "{tmp}/out", "--work", "{tmp}/work"],
    default=["--synthetic", "--phase-s", "6", "--lead-s", "10", "--rate-hz", "8", "--budget-ms", "100",
             "--reps", "2", "--samples", "300", "--out", "{tmp}/out", "--work", "{tmp}/work"],
    report="{tmp}/out/results.json",
    out_args=("--out", "{tmp}/out", "--work", "{tmp}/work"),
    summarise=lambda report: {k: v for k, v in report.items() if k not in ("runs", "machine", "command")},
    claims=_claims,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role")
    for name in ("device", "proxy"):
        p = sub.add_parser(name)
        p.add_argument("--phase-s", type=float, required=True)
        p.add_argument("--t0", type=float, required=True)
        p.add_argument("--seed", type=int, default=0)
        if name == "device":
            for opt in ("--device-bundle", "--data", "--mode", "--peer-url", "--out", "--variant"):
                p.add_argument(opt, default=None)
            p.add_argument("--budget-ms", type=float, required=True)
            p.add_argument("--status-every-s", type=float, default=1.0)
            p.add_argument("--idle-probe-s", type=float, default=2.0)
            p.add_argument("--rate-hz", type=float, required=True)
        else:
            p.add_argument("--listen-port", type=int, required=True)
            p.add_argument("--upstream-port", type=int, required=True)
            p.add_argument("--scenario", required=True)
    parser.add_argument("--bundle", type=Path, help="a deploy bundle (split here for offloading)")
    parser.add_argument("--offload-dir", type=Path, help="an existing `hmt deploy --offload-out` folder instead")
    parser.add_argument("--synthetic", action="store_true",
                        help="no bundle given: the synthetic one (benchmarks.offload.synthetic_bundle), made in --work")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-offload"))
    parser.add_argument("--work", type=Path, default=Path("runs/bench-offload-work"),
                        help="scratch: the split bundles and the exported test set")
    parser.add_argument("--variant", default=None, help="variant every mode serves (default: the most accurate)")
    parser.add_argument("--phase-s", type=float, default=8.0)
    parser.add_argument("--reps", type=int, default=1, help="repetitions (modes interleaved)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument("--status-every-s", type=float, default=1.0, help="device: peer status probe period")
    parser.add_argument("--idle-probe-s", type=float, default=2.0, help="device: bandwidth probe after this idle")
    parser.add_argument("--rate-hz", type=float, default=40.0)
    parser.add_argument("--budget-ms", type=float, default=30.0)
    parser.add_argument("--device-cpu-share", type=float, default=0.25,
                        help="CFS quota of the device's core (0: none): a weak device")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--lead-s", type=float, default=8.0, help="start-up time given to the device and proxy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.role == "device":
        run_device(args)
        return
    if args.role == "proxy":
        run_proxy_process(args)
        return
    from benchmarks.serve.scenario import export_cifar, machine
    from hmt.bundle import load_bundle
    from hmt.deploy.offload import write_offload_bundles

    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    if args.synthetic and args.bundle is None and args.offload_dir is None:
        from benchmarks.offload.synthetic_bundle import write_bundle

        args.bundle = write_bundle(work / "synthetic-bundle", args.seed)
    if args.offload_dir is None:
        if args.bundle is None:
            parser.error("--bundle or --offload-dir is needed")
        split = write_offload_bundles(args.bundle, work / "device", work / "peer", seed=args.seed)
        device_bundle, peer_bundle = split.device, split.peer
    else:
        device_bundle, peer_bundle = args.offload_dir / "device", args.offload_dir / "peer"
    spec = load_bundle(device_bundle).spec
    args.variant = args.variant or max(spec.variants, key=lambda v: v.accuracy).arch_id
    data = export_cifar(work / "cifar_test.npz", args.samples)
    args.reference = reference_classes(device_bundle, args.variant, data, args.seed)
    scenario = args.out / "scenario.csv"
    scenario.write_text(scenario_csv(args.phase_s))
    group = _cgroup(args.device_cpu_share)
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        for rep in range(args.reps):  # modes interleaved: a noisy minute on the shared host hits all of them
            for mode in args.modes.split(","):
                print(f"== {mode} (repetition {rep + 1}/{args.reps})", flush=True)
                folder = args.out / mode if rep == 0 else work / f"{mode}-rep{rep}"
                runs.setdefault(mode, []).append(
                    run_mode(args, mode, device_bundle, peer_bundle, data, scenario, group, folder))
                show(runs[mode][-1]["phases"])
    finally:
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()
    results = {mode: aggregate(r) for mode, r in runs.items()}
    print("== over the repetitions (median p50/p95, mean miss share and accuracy, summed failures)")
    for mode, agg in results.items():
        print(mode)
        show(agg["phases"])
    report = {"machine": machine(), "command": " ".join(sys.argv), "variant": args.variant,
              "budget_ms": args.budget_ms, "phase_s": args.phase_s, "rate_hz": args.rate_hz, "reps": args.reps,
              "device_cpu_share": args.device_cpu_share if group is not None else None,
              "targets": targets(results, args.budget_ms) if set(MODES) <= set(results) else None,
              "note": "2 shared cores: the device on core 0 (CFS quota), peer and proxy on core 1; other "
                      "tenants share both", "results": results, "runs": runs}
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["targets"]))


def show(phases: dict[str, Any]) -> None:
    for phase, s in phases.items():
        print(f"  {phase:12s} {s['option']!s:18s} p50 {s['p50_ms']:7.2f} p95 {s['p95_ms']:7.2f} ms  "
              f"miss {100 * s['deadline_miss_share']:5.1f}%  acc {100 * s['accuracy']:5.1f}%  "
              f"agree {100 * (s.get('agreement') or 0):5.1f}%  "
              f"failed {s['failed']}  n {s['requests']}  {s.get('where', '')}", flush=True)


if __name__ == "__main__":
    main()
