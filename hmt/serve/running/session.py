"""``hmt serve`` end to end: open a bundle, then serve until SIGTERM or replay a scenario.

:func:`serve_forever` starts the control loop on a thread while uvicorn comes up (so
``/v1/health/ready`` answers 503 until the first variant is loaded and warm), then serves
on the calling thread until SIGTERM/SIGINT and drains. :func:`run_scenario` drives the
loop from a scenario file while it serves, sends the requests itself (through the API,
or in process), and returns the summary, the records and the timeline files.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hmt.artifacts.rollback import RollbackPolicy
from hmt.bundle import Bundle, load_checked_bundle
from hmt.errors import NPZ_ERRORS, HmtError, InputError, UsageError
from hmt.runtime.cpus import thread_share
from hmt.runtime.settings import ENGINE_CHOICES, ServeSettings
from hmt.serve.controller import Controller, TickRecord
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.http.server import ApiServer, ServerOptions
from hmt.serve.reporting.timeline import plot_timeline, summarize, write_csv
from hmt.serve.running.burn import LoadGenerator
from hmt.serve.running.drive import drive
from hmt.serve.running.overrides import Layer, flatten, layered_settings
from hmt.serve.running.runner import numpy_dtype
from hmt.serve.running.scenario import (
    DriveOptions,
    Inputs,
    RequestRecord,
    RowApplier,
    Scenario,
    ScenarioRow,
    ScenarioSampler,
    ScenarioState,
    Send,
    http_sender,
)
from hmt.serve.running.squeeze import MemorySqueeze


@dataclass(frozen=True)
class SessionOptions:
    """Command-line overrides of the bundle's serve.json (``None``: keep serve.json's value)."""

    engine: str | None = None
    threads: int | None = None  # None: fuse's per-variant choice (1 when the bundle records none)
    latency_ms: float | None = None
    memory_mb: float | None = None
    exit_confidence: float | None = None
    no_early_exit: bool = False
    fixed_variant: str | None = None
    # serve.json keys replaced before parsing (nested objects merged one level deep), e.g.
    # {"switch": {"min_dwell_s": 0}}: benchmarks and tests tune the loop without a new bundle.
    serve_overrides: dict[str, Any] = field(default_factory=dict)
    # serve --serve-config / HMT_SERVE_* / --set, lowest first (hmt.serve.running.overrides), over serve.json.
    layers: tuple[Layer, ...] = ()
    # PEM ed25519 public key: refuse a bundle without a matching signature (serve --trusted-key).
    trusted_key: Path | None = None
    # With trusted_key: refuse a release older than the key's newest served (hmt.artifacts.rollback).
    rollback: RollbackPolicy = field(default_factory=RollbackPolicy)
    # Inferences run at once (the API's workers; the replay's clients in process): fuse's per-variant
    # threads are cut to this share of the CPU (hmt.runtime.variant.within_share). None: one.
    concurrency: int | None = None
    # False: fuse's threads as measured, uncut (the ablation of benchmarks/serve/threads_ab.py).
    share_threads: bool = True
    # ORT execution providers in order (serve --providers); None: the bundle target's list.
    providers: tuple[str, ...] | None = None
    # serve --adapt (hmt.serve.running.adapt.AdaptSettings) and its labelled canary set (default: the bundle's).
    adapt: Any = None
    canary: Path | None = None
    # serve --blocks (compose variants from the bundle's block graphs) and --research
    # (hmt.serve.deciding.research.ResearchSettings: re-search the block sub-space when nothing fits).
    blocks: bool = False
    research: Any = None

    def __post_init__(self) -> None:
        if self.engine is not None and self.engine not in ENGINE_CHOICES:
            raise UsageError(f"--engine must be one of {list(ENGINE_CHOICES)}, got {self.engine!r}")
        if self.threads is not None and self.threads < 0:
            raise UsageError(f"--threads must be >= 0, got {self.threads}")


def settings_for(bundle: Bundle, options: SessionOptions) -> tuple[ServeSettings, dict[str, dict[str, Any]]]:
    """The effective settings: serve.json under the session's layers and flags (hmt.serve.running.overrides),
    and per key its value and where it came from."""
    layers = list(options.layers)
    if options.serve_overrides:
        layers.append(Layer("overrides", flatten(options.serve_overrides, "overrides")))
    for flag, key, value in (("--latency-ms", "budgets.latency_ms", options.latency_ms),
                             ("--memory-mb", "budgets.memory_mb", options.memory_mb),
                             ("--exit-confidence", "early_exit.confidence", options.exit_confidence),
                             ("--no-early-exit", "early_exit.enabled", False if options.no_early_exit else None),
                             ("--engine", "engine", options.engine)):
        if value is not None:
            layers.append(Layer(flag, {key: value}))
    return layered_settings(bundle.serve_config, layers, where=str(bundle.root / "serve.json"))


def open_controller(bundle_path: Path | str, options: SessionOptions, **kwargs: Any) -> Controller:
    """Load and verify the bundle (ArtifactError when it fails) and build its controller."""
    # The same structural checks as deploy --verify (no extra files, no symlinks, ELF machine, signature).
    bundle = load_checked_bundle(bundle_path, trusted_key=options.trusted_key, rollback=options.rollback)
    settings, report = settings_for(bundle, options)
    # An energy budget is in mJ: refused on a bundle whose energies are relative, never applied as MAC-equivalents.
    bundle.check_energy_budget(settings.budgets.energy,
                               what=f"budgets.energy ({report.get('budgets.energy', {}).get('source', 'serve.json')})")
    if options.adapt is not None:
        from hmt.serve.running.adapt import canary_for

        kwargs["adapt"] = (options.adapt, canary_for(bundle, options.canary, options.adapt))
    if options.blocks or options.research is not None:
        from hmt.runtime.blocks import has_blocks

        if not has_blocks(bundle):
            raise UsageError(f"{bundle.root}: ships no block graphs; --blocks and --research need a bundle from "
                             "`hmt deploy --blocks`")
    cut = options.threads is None and options.share_threads
    max_threads = thread_share(options.concurrency or 1) if cut else None
    controller = Controller(bundle, settings, engine=settings.engine, threads=options.threads, max_threads=max_threads,
                            fixed_variant=options.fixed_variant, providers=options.providers,
                            blocks=options.blocks, **kwargs)
    controller.settings_report = report
    if options.research is not None:
        from hmt.serve.deciding.research_join import attach

        attach(controller, options.research)
    return controller


def serve_forever(bundle_path: Path | str, options: SessionOptions, api: ApiOptions, server: ServerOptions,
                  on_listening: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Serve until SIGTERM/SIGINT; returns the final status after the drain."""
    if options.concurrency is None:
        options = dataclasses.replace(options, concurrency=api.workers)
    return run_until_stopped(open_controller(bundle_path, options), api, server, on_listening=on_listening)


def run_until_stopped(service: Any, api: ApiOptions, server: ServerOptions, *,
                      on_listening: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Serve ``service`` (a controller, or anything with its ``start``/``stop``/``status``)
    over HTTP until SIGTERM/SIGINT. It starts in the background so the API answers (not
    ready) at once; a failed start stops the server and is raised after it."""
    app = create_app(service, api, on_shutdown=service.stop)
    api_server = ApiServer(app, server)
    failure: list[BaseException] = []

    def start() -> None:
        try:
            service.start()
        except BaseException as exc:  # noqa: BLE001 - reported after the server stops
            failure.append(exc)
            api_server.server.should_exit = True

    starter = threading.Thread(target=start, name="hmt-serve-start", daemon=True)
    starter.start()
    if on_listening is not None:
        on_listening(api_server.url)
    api_server.run()
    starter.join(30.0)
    if failure:
        raise failure[0]
    return dict(service.status(last=0))


# -- scenario replay --------------------------------------------------------------------------


def _from_pixels(bundle: Bundle, x: np.ndarray) -> np.ndarray:
    """uint8 pixels ``[N, H, W, C]`` of an image bundle normalised as its preprocessing says (as
    ``/v1/predict`` and ``--canary`` take them); anything else as it is."""
    from hmt.serve.http.inputs import InputSpec, normalise

    spec = InputSpec.of_bundle(bundle.spec)
    if x.dtype != np.uint8 or x.ndim != 4 or spec.preprocess is None or x.shape[1:] != spec.image_hwc:
        return x
    return normalise(x, spec)


def load_inputs(bundle: Bundle, data: Path | None, rng: np.random.Generator, count: int = 64) -> Inputs:
    """``data`` (.npz with x and optional y; x the model's inputs or uint8 pixels [N, H, W, C]) shaped
    to the bundle's input, in an order shuffled by ``rng`` (the clients cycle through it: a test set
    saved class by class would otherwise send one class for a whole phase, which shifts the input
    statistics serve --adapt watches and the accuracy a phase reports), or ``count`` seeded noise inputs."""
    spec = bundle.spec.input
    dtype = numpy_dtype(spec.dtype)
    shape = tuple(spec.shape)
    if data is None:
        return Inputs(rng.standard_normal((count, *shape)).astype(dtype))
    try:
        with np.load(data, allow_pickle=False) as archive:
            x = np.asarray(archive["x"])
            y = np.asarray(archive["y"]) if "y" in archive.files else None
    except NPZ_ERRORS as exc:
        raise InputError(f"{data}: expected an .npz with arrays x (inputs) and y (labels) ({exc})") from exc
    x = _from_pixels(bundle, x)
    if x.ndim and x.shape[1:] == shape[1:] and shape[0] == 1:
        x = x.reshape((x.shape[0], *shape))
    if x.shape[1:] != shape:
        raise InputError(f"{data}: x has shape {list(x.shape)}; "
                         f"expected [N, *{list(shape)}] or [N, *{list(shape[1:])}]")
    if y is not None and (y.ndim != 1 or len(y) != len(x)):
        raise InputError(f"{data}: y must be a vector of {len(x)} labels, got shape {list(y.shape)}")
    if len(x) == 0:
        raise InputError(f"{data}: x holds no samples")
    classes = bundle.spec.classes
    if y is not None and (not np.issubdtype(y.dtype, np.number) or np.any(y != np.round(y))
                          or np.any(y < 0) or np.any(y >= classes)):
        raise InputError(f"{data}: y must hold class indices 0..{classes - 1} (dtype {y.dtype}); "
                         "accuracy would count every other label as wrong")
    x = x.astype(dtype)
    if np.issubdtype(dtype, np.floating) and not np.all(np.isfinite(x)):
        raise InputError(f"{data}: x contains NaN or infinity")
    order = rng.permutation(len(x))
    return Inputs(x[order], None if y is None else y.astype(np.int64)[order])


@dataclass
class ScenarioResult:
    summary: dict[str, Any]
    records: list[RequestRecord]
    ticks: list[TickRecord]
    files: dict[str, str] = field(default_factory=dict)
    url: str | None = None


def _in_process_sender(controller: Controller) -> Callable[[], Send]:
    def factory() -> Send:
        def send(x: np.ndarray) -> tuple[int, dict[str, Any]]:
            try:
                p = controller.predict(x)
            except HmtError as exc:
                return 503, {"error": str(exc)}
            return 200, {"class": p.class_index, "confidence": p.confidence, "exit": p.exit, "variant": p.variant,
                         "latency_ms": p.latency_ms, "compute_ms": p.compute_ms}
        return send

    return factory


def _row_applier(rows: list[ScenarioRow], state: ScenarioState, controller: Controller) -> RowApplier:
    """What a row changes in serve's process: the state the sampler lays over, and the budgets (a
    row's, else the controller's budgets at the start)."""
    base = controller.budgets

    def apply_row(row: ScenarioRow) -> None:
        state.cpu_load = row.cpu_load
        state.battery_pct = row.battery_pct
        state.memory_squeeze_mb = row.memory_squeeze_mb
        latency = row.latency_budget_ms if row.latency_budget_ms is not None else base.latency_ms
        memory = row.memory_budget_mb if row.memory_budget_mb is not None else base.memory_mb
        controller.set_budgets(latency, memory)
        controller.request_tick()

    return RowApplier(rows, apply_row)


def _follow(rows: list[ScenarioRow], start_s: float, burner: LoadGenerator | None,
            squeeze: MemorySqueeze | None) -> None:
    """The load processes follow the rows from ``start_s`` on by themselves
    (:class:`hmt.serve.running.burn.SharedPlan`)."""
    times = [r.time_s for r in rows]
    if burner is not None:
        burner.follow(start_s, times, [r.cpu_load for r in rows])
    if squeeze is not None:
        squeeze.follow(start_s, times, [r.memory_squeeze_mb for r in rows])


def run_scenario(
    bundle_path: Path | str,
    scenario: Scenario,
    options: SessionOptions,
    drive_options: DriveOptions,
    *,
    api: ApiOptions | None,
    server: ServerOptions | None,
    data: Path | None = None,
    timeline_dir: Path | None = None,
    rng: np.random.Generator | None = None,
    label: str = "scenario",
    trace: Callable[[Controller, TickRecord], None] | None = None,
) -> ScenarioResult:
    """Replay ``scenario``; ``server=None`` sends in process, else through the API on ``server``.

    ``trace`` (benchmarks): called on the control thread after each tick with the controller and
    the tick's record, to read what the loop saw (its estimates per variant) at that moment."""
    rng = rng if rng is not None else np.random.default_rng(0)
    state = ScenarioState()
    ticks = _TickLog()

    def on_tick(record: TickRecord) -> None:
        ticks.add(record)
        if trace is not None:
            trace(controller, record)

    sampler = ScenarioSampler(state, synthetic_cpu=drive_options.load_mode == "synthetic")
    if options.concurrency is None:  # as many as can send at once: the API's workers, or the clients
        workers = (api if api is not None else ApiOptions()).workers if server is not None else drive_options.clients
        options = dataclasses.replace(options, concurrency=max(1, workers))
    controller = open_controller(bundle_path, options, sampler=sampler, on_tick=on_tick)
    inputs = load_inputs(controller.bundle, data, rng)
    base = controller.budgets
    rows = list(scenario.rows)
    burner, squeeze = _load_generators(rows, drive_options)
    api_server: ApiServer | None = None
    try:
        for generator in (burner, squeeze):
            if generator is not None:
                generator.start()
        sampler.prime()  # the load generator's start-up is not outside load the scenario asked for
        controller.start()
        api_server, factory = _start_sender(controller, api, server, drive_options)

        applier = _row_applier(rows, state, controller)
        sampler.on_sample = applier.due  # the control thread applies a row on time, should the driver be late

        def on_start(start_s: float) -> None:
            _follow(rows, start_s, burner, squeeze)
            applier.start(start_s)

        switches_before = controller.switcher.switch_count
        token = api.token if api is not None else None
        start_s, records = drive(scenario, drive_options, applier.through, factory if drive_options.clients else None,
                                 inputs, base_latency_ms=base.latency_ms,
                                 url=None if api_server is None else (api_server.url, token), on_start=on_start)
        switches = controller.switcher.switch_count - switches_before
    finally:
        sampler.on_sample = None
        if api_server is not None:
            api_server.stop_background()
        controller.stop()
        for generator in (burner, squeeze):
            if generator is not None:
                generator.stop()
    shifted = ticks.shifted(start_s - controller.t0_s)
    steps = [t for t in scenario.step_times if t < drive_options.duration_s]
    summary = summarize(records, shifted, steps, drive_options.duration_s, switches)
    summary.update(_run_facts(controller, options, drive_options, label, via_api=server is not None))
    # rows the control thread applied before the driver thread came to them (a late driver: a starved CPU)
    summary["rows_applied_on_sample"] = applier.applied_on_sample
    summary["driver_late_max_s"] = round(applier.driver_late_max_s, 4)
    if burner is not None:
        summary["burn"] = burner.describe()
    result = ScenarioResult(summary, records, shifted, url=None if api_server is None else api_server.url)
    if timeline_dir is not None:
        result.files = _write_timeline(Path(timeline_dir), result, label)
    return result


class _TickLog:
    """The loop's tick records, appended on the control thread."""

    def __init__(self) -> None:
        self._ticks: list[TickRecord] = []
        self._lock = threading.Lock()

    def add(self, record: TickRecord) -> None:
        with self._lock:
            self._ticks.append(record)

    def shifted(self, offset_s: float) -> list[TickRecord]:
        """The records so far, with times moved ``offset_s`` earlier (to the driver's start)."""
        with self._lock:
            return [dataclasses.replace(t, time_s=t.time_s - offset_s) for t in self._ticks]


def _start_sender(controller: Controller, api: ApiOptions | None, server: ServerOptions | None,
                  drive_options: DriveOptions) -> tuple[ApiServer | None, Callable[[], Send]]:
    """The API server on ``server`` (started) and a sender to it, or no server and in-process sends."""
    if server is not None:
        api_server = ApiServer(create_app(controller, api if api is not None else ApiOptions()), server)
        api_server.start_background()
        return api_server, http_sender(api_server.url, api.token if api is not None else None)
    if drive_options.client_mode == "processes":
        raise UsageError("client processes send through the API; drop --in-process or --client-processes")
    return None, _in_process_sender(controller)


def _load_generators(rows: list[ScenarioRow], drive_options: DriveOptions
                     ) -> tuple[LoadGenerator | None, MemorySqueeze | None]:
    """The CPU burners and the memory squeeze the rows ask for (``--load burn`` only)."""
    if drive_options.load_mode != "burn":
        return None, None
    squeeze = MemorySqueeze(plan_rows=len(rows)) if any(r.memory_squeeze_mb for r in rows) else None
    return LoadGenerator(plan_rows=len(rows)), squeeze


def _run_facts(controller: Controller, options: SessionOptions, drive_options: DriveOptions, label: str,
               *, via_api: bool) -> dict[str, Any]:
    """How the replay ran, for its summary."""
    return {"label": label, "duration_s": drive_options.duration_s, "clients": drive_options.clients,
            "rate_hz": drive_options.rate_hz, "load_mode": drive_options.load_mode,
            "via": "api" if via_api else "in_process",
            "client_mode": drive_options.client_mode, "fixed_variant": options.fixed_variant,
            "early_exit": dataclasses.asdict(controller.settings.early_exit),
            "engine": controller.status(last=0)["engine"],
            # decisions that raised a bug (the loop outlived them; hmt.serve.running.loop)
            "control_loop_errors": controller.loop.unexpected_errors,
            "control_loop_last_error": controller.loop.last_unexpected_error}


def _write_timeline(timeline_dir: Path, result: ScenarioResult, label: str) -> dict[str, str]:
    """The replay's ticks and requests (CSV), its plot (when matplotlib is there) and summary, in ``timeline_dir``."""
    files = {"ticks_csv": write_csv(timeline_dir / "timeline.csv", result.ticks),
             "requests_csv": write_csv(timeline_dir / "requests.csv", result.records)}
    png = plot_timeline(timeline_dir / "timeline.png", result.records, result.ticks, title=f"hmt serve: {label}")
    if png is not None:
        files["png"] = png
    summary_path = timeline_dir / "summary.json"
    summary_path.write_text(json.dumps(result.summary, indent=2, sort_keys=True) + "\n")
    files["summary"] = summary_path
    return {k: str(v) for k, v in files.items()}
