"""``hmt serve``: the on-device adaptation loop and inference API over a deploy bundle."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from commands._options import DebugOpt, JsonOpt, QuietOpt, SeedOpt
from commands._output import Output
from commands.app import app, run_command

_EPILOG = """
**Examples**

Serve a bundle on loopback (POST /v1/predict, GET /v1/health/live|ready, /v1/status, /metrics,
/openapi.json); SIGTERM drains the requests in flight, then exits 0:

    hmt serve runs/bundle-host

On the network (every request then needs `Authorization: Bearer <token>`):

    HMT_SERVE_TOKEN=$(openssl rand -hex 24) hmt serve runs/bundle-host --host 0.0.0.0 --port 8000

A prediction: `curl -s --data-binary @x.npy -H 'content-type: application/x-npy' localhost:8000/v1/predict`
(the float tensor, uint8 pixels [H, W, C], or a batch [N, ...]), `--data-binary @cat.jpg -H 'content-type:
image/jpeg'` (JPEG/PNG, normalised with the bundle's preprocessing), or `-d '{"inputs": [[...]]}'
-H 'content-type: application/json'`. From Python: `hmt.client.HmtClient("http://127.0.0.1:8000").predict(x)`.

The Open Inference Protocol (KServe v2) answers beside /v1 for Triton and KServe clients: GET /v2,
/v2/health/ready, /v2/models/NAME (metadata), POST /v2/models/NAME/infer (JSON or binary tensors; images as
BYTES input `image`). NAME is the bundle directory's name (--model-name). Probabilities on request:
`/v1/predict?top_k=5&probabilities=true`, or the v2 parameter top_k. `curl -F file=@cat.jpg
localhost:8000/v1/predict` uploads a form. /metrics follows Prometheus conventions (scripts/device/grafana has a
dashboard).

Settings over the bundle's signed serve.json (which stays untouched), lowest first: --serve-config FILE,
`HMT_SERVE_<SECTION>__<KEY>=VALUE`, --set KEY=VALUE, then the flags below; /v1/status key settings shows each
value and its source:

    hmt serve runs/bundle-host --set budgets.latency_ms=40 --set switch.min_dwell_s=0 --log-format json

Slow or idle clients cannot hold the server: at most --max-connections are open (at the cap the
connection that has waited longest without a complete request is closed), and a request must
arrive, headers and body, within --receipt-timeout-s (else 408).

Adapt to a new environment on the device (a bundle from `hmt deploy --adaptable`): when the inputs
drift (a darker room, a dirtier lens), BN statistics are re-estimated on recent inputs and the adapted
variant serves while the guard accepts it (lower prediction entropy and a labelled canary set no worse:
--canary, or the one the bundle ships from `deploy --adaptable --canary-data`; without either serve
refuses, as entropy alone can be steered by clients, unless --adapt-unguarded); /v1/status (key adapt)
and /metrics (hmt_adapt_*) report it:

    hmt serve runs/bundle-host --adapt --canary canary.npz

Replay a scenario for 60 s with real background load, labelled data through the API, and a timeline:

    hmt serve runs/bundle-host --scenario scenario.csv --load burn --data cifar_test.npz \\
        --duration-s 60 --timeline-out runs/serve-timeline --json

**Scenario file** (CSV with a header; time_s required, the rest optional; each row holds until the next):

- time_s: when the row starts, seconds from the start (non-decreasing)
- cpu_load: background CPU load, share of all cores 0..1 (--load synthetic: reported to the loop
  instead of the live CPU reading; --load burn: processes really keep that share of the cores busy)
- memory_budget_mb: memory budget in MB (1e6 bytes)
- battery_pct: battery level 0..100 (sets mu of eq. 3)
- latency_budget_ms: latency budget per request in ms (server queue wait + compute)

**Offloading** (a weak device next to a stronger machine): on the peer, serve the peer half of
`hmt deploy --offload-out`; on the device, serve the device half with `--peer`:

    HMT_SERVE_TOKEN=... hmt serve runs/bundle-peer --role peer --host 0.0.0.0 --port 9000 \\
        --ssl-certfile cert.pem --ssl-keyfile key.pem
    HMT_PEER_TOKEN=... hmt serve runs/bundle-device --peer https://edge-box:9000 --peer-cafile ca.pem

An empty cell means not set (no load, the base budget from serve.json or --latency-ms/--memory-mb,
no battery). The scenario ends at its last row's time_s unless --duration-s is given. Writes
timeline.csv (one row per decision), requests.csv, timeline.png and summary.json to --timeline-out.
"""


class EngineChoice(str, Enum):
    auto = "auto"
    onnxruntime = "onnxruntime"
    tvm = "tvm"


class RoleChoice(str, Enum):
    device = "device"
    peer = "peer"


class LogFormat(str, Enum):
    text = "text"
    json = "json"


class LoadChoice(str, Enum):
    synthetic = "synthetic"
    burn = "burn"




def refuse_block_modes(*, blocks: bool, research: bool, peer: bool, adapt: bool, peer_role: bool) -> None:
    """--blocks / --research with --peer, --role peer or --adapt: a usage error (exit 2) naming the flags.
    The device half of an offload bundle is cut graphs, which block graphs do not compose; --adapt
    builds BN-adapted copies of the bundled variants' whole graphs, which a composed or found variant
    does not have."""
    from hmt.errors import UsageError

    given = [flag for flag, on in (("--blocks", blocks), ("--research", research)) if on]
    others = [flag for flag, on in (("--peer", peer), ("--role peer", peer_role), ("--adapt", adapt)) if on]
    if not given or not others:
        return
    why = []
    if peer or peer_role:
        why.append("offload serves cut graphs of the bundled variants, which block graphs do not compose")
    if adapt:
        why.append("--adapt needs each served variant's BN-adaptable whole graph, which composed variants lack")
    raise UsageError(f"{' and '.join(given)} cannot be combined with {' and '.join(others)}: {'; '.join(why)}; "
                     f"drop {' and '.join(given)} or {' and '.join(others)}")


@app.command("serve", epilog=_EPILOG)
def serve_command(
    bundle: Annotated[Path, typer.Argument(
        help="Deploy bundle: its directory or its .tar.gz (hmt deploy); verified before serving.")],
    host: Annotated[str, typer.Option(help="Address to listen on; anything but loopback needs a token.")] = (
        "127.0.0.1"),
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8000,
    token: Annotated[str | None, typer.Option(
        help="Bearer token required on every request (default: $HMT_SERVE_TOKEN; >= 16 characters).")] = None,
    engine: Annotated[EngineChoice | None, typer.Option(
        help="Runtime: auto (each variant's preferred engine if its runtime imports, else onnxruntime), "
             "onnxruntime or tvm. Default: serve.json's.")] = None,
    threads: Annotated[int | None, typer.Option(
        help="Runtime threads per graph (0: the runtime's default). Default: what fuse measured fastest for "
             "each variant (1 for bundles that do not record it), cut to serve's share of the CPU: the cores "
             "this process may use divided by --workers (by --clients in process), without spinning once cut, "
             "so requests running at once and the device's own work do not wait on each other's threads.")] = None,
    providers: Annotated[str | None, typer.Option(
        help="ONNX Runtime execution providers to try, in order, comma-separated: tensorrt, cuda, cpu. "
             "Default: the ones the bundle's target lists (Jetsons: tensorrt,cuda,cpu). One this ORT lacks "
             "falls back to the CPU, and /v1/status says so; a variant fuse measured fastest on the CPU stays "
             "there.")] = None,
    workers: Annotated[int, typer.Option(help="Inference worker threads.")] = 2,
    max_queue: Annotated[int, typer.Option(help="Requests queued or running before new ones get 429.")] = 64,
    deadline_ms: Annotated[float, typer.Option(
        help="Per-request deadline (504 after it); a client may ask for less with X-Deadline-Ms.")] = 2000.0,
    max_body_kb: Annotated[int | None, typer.Option(
        help="Largest request body in KiB (default: from the input shape, at least 1 MiB).")] = None,
    max_batch: Annotated[int, typer.Option(help="Most inputs in one request (a batch [N, ...]).")] = 64,
    max_connections: Annotated[int, typer.Option(
        help="Most open connections (kept below the file-descriptor limit, which serve raises to its hard "
             "limit). At the cap the connection waiting longest without a complete request is closed.")] = 512,
    receipt_timeout_s: Annotated[float, typer.Option(
        help="Seconds a client has to send a whole request, headers and body (408 after), counted from "
             "connecting or from the first byte of a keep-alive request.")] = 10.0,
    health_without_token: Annotated[bool, typer.Option(
        "--health-without-token",
        help="Let GET /v1/health/live and /v1/health/ready through without the token (for orchestrator "
             "probes); every other path still needs it.")] = False,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override one serve setting, KEY=VALUE with a dotted key (repeatable), e.g. --set "
                      "budgets.latency_ms=40 --set switch.min_dwell_s=0. Layered over the bundle's signed "
                      "serve.json, which stays untouched; /v1/status (key settings) shows every value and where it "
                      "came from.")] = None,
    serve_config: Annotated[Path | None, typer.Option(
        "--serve-config", help="JSON file shaped like serve.json (any subset) layered over the bundle's; "
                               "`HMT_SERVE_<SECTION>__<KEY>` environment variables go over it, --set over "
                               "those.")] = None,
    access_log: Annotated[bool, typer.Option(
        "--access-log", help="Log every request line and status (uvicorn's access log; on with --debug "
                             "too).")] = False,
    log_format: Annotated[LogFormat, typer.Option(
        help="Log lines as text or as one JSON object per line (for log shippers).")] = LogFormat.text,
    dynamic_batch: Annotated[int, typer.Option(
        help="Dynamic batching: run up to N inputs of requests that arrive together as one batch (variants whose "
             "graphs take a batch; others run item by item). 1: off, the default; measured in "
             "benchmarks/protocol (README).")] = 1,
    dynamic_batch_delay_ms: Annotated[float, typer.Option(
        help="Dynamic batching: longest wait for more inputs after the oldest one arrived.")] = 2.0,
    model_name: Annotated[str | None, typer.Option(
        help="The model's name on the Open Inference Protocol routes /v2/models/NAME (default: the bundle "
             "directory's name).")] = None,
    latency_ms: Annotated[float | None, typer.Option(
        "--latency-ms",
        help="Latency budget in ms (overrides serve.json; a scenario's column overrides this).")] = None,
    memory_mb: Annotated[float | None, typer.Option(
        "--memory-mb",
        help="Memory budget in MB (overrides serve.json; a scenario's column overrides this).")] = None,
    exit_confidence: Annotated[float | None, typer.Option(
        help="Early-exit softmax confidence threshold in (0, 1] (overrides serve.json).")] = None,
    no_early_exit: Annotated[bool, typer.Option("--no-early-exit", help="Always run to the variant's exit.")] = False,
    variant: Annotated[str | None, typer.Option(
        "--variant", help="Serve this variant only (no switching; a static baseline).")] = None,
    scenario: Annotated[Path | None, typer.Option(
        help="Replay this scenario CSV (see below) and send requests; prints a summary at the end.")] = None,
    duration_s: Annotated[float | None, typer.Option(
        help="Scenario length in s (default: the last row's time_s).")] = None,
    clients: Annotated[int, typer.Option(help="Scenario: concurrent clients (0: send nothing, only serve).")] = 4,
    rate_hz: Annotated[float, typer.Option(help="Scenario: requests per second, all clients together.")] = 100.0,
    load: Annotated[LoadChoice, typer.Option(
        help="Scenario cpu_load: synthetic (reported to the loop) or burn (real busy processes).")] = (
        LoadChoice.synthetic),
    data: Annotated[Path | None, typer.Option(
        help="Scenario inputs: .npz with x (inputs, or uint8 pixels [N, H, W, C]) and y (labels, for "
             "accuracy), sent in an order shuffled by --seed; default: seeded noise.")] = None,
    in_process: Annotated[bool, typer.Option(
        "--in-process", help="Scenario: call the model in process instead of through the HTTP API.")] = False,
    client_processes: Annotated[bool, typer.Option(
        "--client-processes", help="Scenario: run each client in its own process (the server's latency is then "
                                   "not inflated by the clients sharing its interpreter).")] = False,
    timeline_out: Annotated[Path | None, typer.Option(
        help="Scenario: write timeline.csv, requests.csv, timeline.png and summary.json here.")] = None,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Scenario: also replay it once per variant served alone, and print per phase the "
                          "adaptive run beside the best static choice in hindsight (the oracle: the most accurate "
                          "variant with at most 5% misses in that phase) and the static largest.")] = False,
    trusted_key: Annotated[Path | None, typer.Option(
        "--trusted-key", help="ed25519 public key (PEM): refuse a bundle not signed by it (hmt deploy --sign-key; "
                              "see hmt deploy --help).")] = None,
    allow_rollback: Annotated[bool, typer.Option(
        "--allow-rollback", help="With --trusted-key: accept a bundle signed as an older release (version, then "
                                 "creation time) than one this key already had served here (refused by "
                                 "default).")] = False,
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", help="Where serve records the newest signed release per key (default: $HMT_STATE_DIR, "
                            "else $XDG_STATE_HOME/hmt, else ~/.local/state/hmt).")] = None,
    adapt: Annotated[bool, typer.Option(
        "--adapt", help="Test-time adaptation: when the input statistics drift, re-estimate the serving variant's "
                        "BN statistics on recent inputs (off the request path) and serve the adapted variant while "
                        "its prediction entropy is lower and the --canary set does not get worse; back to the "
                        "shipped one when the drift passes. Needs a bundle from `hmt deploy --adaptable`.")] = False,
    canary: Annotated[Path | None, typer.Option(
        "--canary", help="--adapt: labelled canary set the adapted variant must not do worse on: an .npz with x "
                         "(inputs or uint8 pixels [N, H, W, C]) and y, or a directory of class folders of "
                         "JPEG/PNG images.")] = None,
    adapt_unguarded: Annotated[bool, typer.Option(
        "--adapt-unguarded", help="--adapt without a canary set: adopt on prediction entropy alone, which any "
                                  "client's inputs can steer (refused without this flag).")] = False,
    adapt_after: Annotated[int, typer.Option(
        "--adapt-after", help="--adapt: drifted inputs before the first adapted variant is built.")] = 256,
    adapt_window: Annotated[int, typer.Option(
        "--adapt-window", help="--adapt: inputs the drift score is computed over.")] = 256,
    adapt_max_share: Annotated[float, typer.Option(
        "--adapt-max-share", help="--adapt: most of one core's time the adaptation worker may use.")] = 0.5,
    canary_tolerance: Annotated[float, typer.Option(
        "--canary-tolerance", help="--adapt: canary accuracy (0..1) the adapted variant may lose.")] = 0.0,
    blocks: Annotated[bool, typer.Option(
        "--blocks", help="Compose the variants from the bundle's shared block graphs (`hmt deploy --blocks`): the "
                         "pool loads and evicts blocks, each once however many variants use it.")] = False,
    research: Annotated[bool, typer.Option(
        "--research", help="When no variant fits the budgets (measured), search the bundle's block sub-space on "
                           "the device (nearby variants of the current one, timed here, accuracy on the bundle's "
                           "calibration set) while the current variant keeps serving; what fits joins the pool. "
                           "Needs `hmt deploy --blocks --blocks-data`.")] = False,
    research_time_s: Annotated[float, typer.Option(
        "--research-time-s", help="--research: the most wall time one search may take.")] = 10.0,

    role: Annotated[RoleChoice, typer.Option(
        help="device: serve predictions (offloading to --peer when given); peer: run the tails of an offload "
             "bundle for devices (POST /v1/segment; `hmt deploy --offload-out` writes one).")] = RoleChoice.device,
    peer: Annotated[str | None, typer.Option(
        help="Offload to this peer (http(s)://HOST:PORT): variant and cut are chosen together from the measured "
             "link; a failing peer is retried with backoff while requests finish locally.")] = None,
    peer_token: Annotated[str | None, typer.Option(
        help="Bearer token the peer requires (default: $HMT_PEER_TOKEN).")] = None,
    peer_cafile: Annotated[Path | None, typer.Option(help="CA bundle (PEM) to verify an https peer.")] = None,
    ssl_certfile: Annotated[Path | None, typer.Option(help="--role peer: TLS certificate chain (PEM).")] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="--role peer: TLS private key (PEM).")] = None,
    seed: SeedOpt = 0,
    json_mode: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Serve a deploy bundle: a control loop (4 Hz and on demand) watches CPU, memory, GPU and battery,
    predicts every variant's latency under the load (corrected by measured/predicted), picks the best
    by CrowdHMTware eq. 3 within the budgets and switches with hysteresis; requests leave at the first
    confident exit. Loopback by default; a token for anything else."""

    def adapt_settings() -> Any:
        if not adapt:
            return None
        from hmt.serve.running.adapt import AdaptSettings

        return AdaptSettings(window=adapt_window, adapt_after=adapt_after, max_share=adapt_max_share,
                             canary_tolerance=canary_tolerance, unguarded=adapt_unguarded)

    def research_settings() -> Any:
        if not research:
            return None
        from hmt.serve.deciding.research import ResearchSettings

        return ResearchSettings(time_bound_s=research_time_s, seed=seed)

    def body(output: Output) -> None:
        from commands._checks import check_budget_flags
        from hmt.deploy.verify import check_archive_binding, opened_bundle

        check_budget_flags(latency_ms=latency_ms, memory_mb=memory_mb)
        if timeline_out is not None:
            from hmt.artifacts.outputs import check_owned_folder
            from hmt.errors import InputError
            from hmt.serve.reporting.timeline import TIMELINE_FILES, is_timeline_file

            check_owned_folder(timeline_out, names=TIMELINE_FILES, what="--timeline-out", inputs=[bundle],
                               recognise=is_timeline_file)
            try:  # now, not after the replay (and the --compare runs) it would write there
                timeline_out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError(f"--timeline-out {timeline_out}: cannot create it ({exc.strerror or exc})") from exc
        # An archive is extracted (with verify's bounds) into a private folder removed on exit.
        with opened_bundle(bundle) as root:
            if root != bundle:
                check_archive_binding(bundle, root)  # as verify: not a stale archive beside a rebuilt bundle
                output.note(f"extracted {bundle} to a temporary folder; it is removed when serve stops")
            serve(output, root)

    def serve(output: Output, bundle: Path) -> None:
        import os

        import numpy as np

        from hmt.artifacts.rollback import RollbackPolicy
        from hmt.errors import UsageError
        from hmt.runtime.ort import parse_providers
        from hmt.serve.http.api import ApiOptions
        from hmt.serve.http.server import ServerOptions, resolve_token
        from hmt.serve.running.overrides import env_layer, file_layer, set_layer
        from hmt.serve.running.scenario import DriveOptions, Scenario
        from hmt.serve.running.session import SessionOptions, run_scenario, serve_forever

        rollback = RollbackPolicy(state_dir=state_dir, allow=allow_rollback)
        if trusted_key is None and (allow_rollback or state_dir is not None):
            raise UsageError("--allow-rollback and --state-dir go with --trusted-key (only signed releases are "
                             "ordered)")

        refuse_block_modes(blocks=blocks, research=research, peer=peer is not None, adapt=adapt,
                           peer_role=role is RoleChoice.peer)
        from commands.serve_offload import refuse_other_roles_options

        refuse_other_roles_options(
            peer_role=role is RoleChoice.peer,
            device_only={"--peer": peer is not None, "--adapt": adapt, "--canary": canary is not None,
                         "--variant": variant is not None, "--latency-ms": latency_ms is not None,
                         "--memory-mb": memory_mb is not None, "--exit-confidence": exit_confidence is not None,
                         "--no-early-exit": no_early_exit, "--set": bool(set_),
                         "--serve-config": serve_config is not None, "--dynamic-batch": dynamic_batch > 1},
            peer_only={"--ssl-certfile": ssl_certfile is not None, "--ssl-keyfile": ssl_keyfile is not None})
        if role is RoleChoice.peer or peer is not None:
            from commands.serve_offload import run_device, run_peer

            if scenario is not None:
                raise UsageError("--scenario is not combined with --role peer / --peer; "
                                 "see python -m benchmarks.offload.scenario --help")
            if role is RoleChoice.peer:
                run_peer(output, bundle, host=host, port=port, token=token, workers=workers, max_queue=max_queue,
                         deadline_ms=deadline_ms, threads=threads, engine=None if engine is None else engine.value,
                         ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, debug=debug, trusted_key=trusted_key,
                         rollback=rollback, max_connections=max_connections, receipt_timeout_s=receipt_timeout_s)
                return
        if (canary is not None or adapt_unguarded) and not adapt:
            raise UsageError("--canary and --adapt-unguarded go with --adapt")
        if canary is not None and adapt_unguarded:
            raise UsageError("--adapt-unguarded drops the canary guard; it does not go with --canary")
        if research_time_s != 10.0 and not research:
            raise UsageError("--research-time-s goes with --research")
        if not research_time_s > 0:
            raise UsageError(f"--research-time-s must be > 0, got {research_time_s}")
        if scenario is None:
            for name, value in (("--duration-s", duration_s), ("--data", data), ("--timeline-out", timeline_out),
                                ("--compare", compare or None)):
                if value is not None:
                    raise UsageError(f"{name} needs --scenario")
        if compare and variant is not None:
            raise UsageError("--compare replays every variant itself; drop --variant")
        if compare and clients == 0:
            raise UsageError("--compare compares the runs on the requests they answer; --clients 0 sends none")
        resolved_token = resolve_token(host, token)
        session = SessionOptions(engine=None if engine is None else engine.value, threads=threads,
                                 latency_ms=latency_ms, memory_mb=memory_mb, exit_confidence=exit_confidence,
                                 no_early_exit=no_early_exit, fixed_variant=variant, trusted_key=trusted_key,
                                 rollback=rollback,
                                 providers=parse_providers(providers), adapt=adapt_settings(), canary=canary,
                                 blocks=blocks, research=research_settings(),
                                 layers=(*([file_layer(serve_config)] if serve_config is not None else []),
                                         env_layer(os.environ), set_layer(set_ or [])))
        api = ApiOptions(token=resolved_token, max_body_bytes=None if max_body_kb is None else max_body_kb * 1024,
                         max_queue=max_queue, workers=workers, deadline_ms=deadline_ms, max_batch=max_batch,
                         health_without_token=health_without_token, model_name=model_name,
                         dynamic_batch=dynamic_batch, dynamic_batch_delay_ms=dynamic_batch_delay_ms)
        server = ServerOptions(host=host, port=port, log_level="info" if debug else "warning",
                               access_log=access_log or debug, log_format=log_format.value,
                               max_connections=max_connections, receipt_timeout_s=receipt_timeout_s)
        if peer is not None:
            run_device(output, bundle, peer=peer, peer_token=peer_token, peer_cafile=peer_cafile,
                       session=session, api=api, server=server, seed=seed)
            return
        if scenario is None:
            from commands.serve_offload import note_listening

            status = serve_forever(bundle, session, api, server,
                                   on_listening=lambda url: note_listening(output, bundle, f"serving {bundle} on {url} "
                                                                           "(SIGTERM or Ctrl-C drains and stops)"))
            output.result({"stopped": True, "status": status},
                          f"stopped after {status['requests']} requests, {status['switches']} switches")
            return
        plan = Scenario.from_csv(scenario)
        duration = duration_s if duration_s is not None else plan.end_s
        if duration_s is None and plan.end_s <= 0:
            raise UsageError(f"{scenario}: its last row starts at 0 s, so the replay would last 0 s; "
                             "give --duration-s (a scenario lasts until its last row's time_s)")
        drive = DriveOptions(duration_s=duration, clients=clients, rate_hz=rate_hz, load_mode=load.value,
                             client_mode="processes" if client_processes else "threads")
        output.note(f"replaying {scenario} for {duration:g} s on {bundle} ({load.value} load, {clients} clients, "
                    f"{rate_hz:g} req/s, {'in process' if in_process else 'through the API'})")
        if compare:
            replay_compared(output, bundle, plan, session, drive, api, None if in_process else server)
            return
        result = run_scenario(bundle, plan, session, drive, api=api, server=None if in_process else server,
                              data=data, timeline_dir=timeline_out, rng=np.random.default_rng(seed))
        s = result.summary
        lat = s["latency_ms"] or {}
        miss = s["deadline_miss_share"]
        rows: list[list[Any]] = [
            ["requests (failed)", f"{s['requests']} ({s['failed']})"],
            ["latency p50 / p95 ms", f"{lat.get('p50', float('nan')):.3f} / {lat.get('p95', float('nan')):.3f}"],
            ["deadline-miss share", "-" if miss is None else f"{100 * miss:.2f}%"],
            ["accuracy", "-" if s["accuracy"] is None else f"{100 * s['accuracy']:.2f}%"],
            ["switches", s["switches"]],
            ["decision time p50 us (wall / CPU)", "-" if s["decision_us"] is None else
             f"{s['decision_us']['p50']:.1f} / {s['decision_cpu_us']['p50']:.1f}"],
            ["per exit", s["per_exit"]],
            ["worst back-within-budget s", s["back_within_budget_s_max"]],
        ]
        output.table("scenario summary", ["metric", "value"], rows)
        output.result({"summary": s, "files": result.files},
                      f"done: {s['ok']} answered, {s['failed']} failed" +
                      (f"; timeline in {timeline_out}" if timeline_out else ""))

    def replay_compared(output: Output, bundle: Path, plan: Any, session: Any, drive: Any, api: Any,
                        server: Any) -> None:
        from hmt.serve.running.compare import replay_compare

        comparison = replay_compare(
            bundle, plan, session, drive, api=api, server=server, data=data, seed=seed, timeline_dir=timeline_out,
            on_run=lambda name, r: output.note(f"  {name}: {_missed(r.summary['deadline_miss_share'])}, "
                                               f"{r.summary['switches']} switches"))

        _comparison_table(output, comparison)
        summary = comparison.summary()
        a, o, s = summary["adaptive"], summary["oracle"], summary["static_largest"]
        met = summary["phases_budgets_met"]
        output.result({"comparison": summary, "phases": comparison.phases,
                       "files": comparison.runs["adaptive"].files},
                      f"done: adaptive {_missed(a['miss_share'])}, oracle {_missed(o['miss_share'])}, "
                      f"static largest {_missed(s['miss_share'])}; "
                      f"{a['switches']} switches; adaptive tracks the oracle in {summary['phases_tracked']} of "
                      f"{summary['phases']} phases; budgets met in {met['adaptive']} of {summary['phases']} "
                      f"phases adaptive, {met['static_largest']} static largest")

    run_command(body, json_mode=json_mode, quiet=quiet, debug=debug)


def _missed(share: float | None) -> str:
    """A run's deadline-miss share as the summary lines say it; None: no request had a latency budget."""
    return "no deadlines" if share is None else f"{100 * share:.1f}% missed"


def _comparison_table(output: Output, comparison: Any) -> None:
    """The per-phase table of ``serve --compare``: misses / accuracy of the adaptive run, the oracle and
    the static largest; a run that did not meet the phase's budgets (misses, memory) is marked."""
    def cell(p: dict[str, Any], key: str) -> str:
        run = p[key]
        miss, acc = run["miss_share"], run["table_accuracy"]
        text = ("-" if miss is None else f"{100 * miss:.1f}%") + " / " + ("-" if acc is None else f"{100 * acc:.1f}%")
        return text if p["budgets_met"][key] else text + ", over budget"

    # Variant ids share their supernet's prefix: shown up to its last dot, they fit the table.
    first, last = min(comparison.accuracy), max(comparison.accuracy)
    shorter = min(len(first), len(last))
    common = next((k for k in range(shorter) if first[k] != last[k]), shorter)
    common = first.rfind(".", 0, common) + 1 if first != last else 0
    rows = []
    for p in comparison.phases:
        if not p["sent"]:
            continue
        phase = f"{p['start_s']:g}-{p['stop_s']:g} s"
        if p["memory_budget_mb"] is not None:
            phase += f", {p['memory_budget_mb']:g} MB"
        # A phase with the battery below full: the loop weighs energy (eq. 3's mu), and so does its oracle.
        star = " *" if p["oracle_by"] != "accuracy" else ""
        rows.append([phase, cell(p, "adaptive"), f"{p['oracle_variant'][common:]}{star}: {cell(p, 'oracle')}",
                     cell(p, "static_largest"), "yes" if p["tracks_oracle"] else "no"])
    output.table(f"adaptive vs oracle vs static largest ({comparison.largest}): misses / accuracy",
                 ["phase", "adaptive", "oracle", "static largest", "tracks oracle"], rows)
    output.note("over budget: more than 5% of deadlines missed, or of answers from a variant over the "
                "phase's memory budget (the static largest ignores it)")
    empty = sum(not p["sent"] for p in comparison.phases)
    if empty:
        output.note(f"{empty} phase(s) without a request left out (shorter than the gap between two requests)")
    if any(p["oracle_by"] != "accuracy" for p in comparison.phases):
        output.note("* battery below full: the oracle is the best by the loop's objective (eq. 3) at the "
                    "phase's mu, among the variants that met the phase")
