"""``hmt serve --adapt``: test-time BN re-estimation beside the serving loop, off the request path.

Requests hand each input to :meth:`AdaptService.offer` after they are answered: an
append to a bounded queue that drops its oldest input when full (never a wait; drops are
counted). Dropping the oldest keeps what the worker sees recent when it falls behind:
measured with a client sending as fast as the server answers (~500 requests/s on this
2-core machine), a queue that refused new inputs instead made the worker see the
corrupted phase of a stream only as it ended, and adopt an adapted variant after the
stream was clean again. A worker thread (lowered OS priority, at most ``max_share`` of
one core's wall time) takes them in batches and runs :mod:`hmt.adapt.online` on them:

- one drift monitor watches the input statistics of the stream (against the reference
  deploy stored from the supernet's calibration set);
- while they drift, the BN statistics of the variant serving are re-estimated on the
  drifted inputs from the bundle's BN-adaptable graphs (``deploy --adaptable``), torch-free;
- the adapted graphs become a new variant, ``<arch_id>+bn``, registered in the pool, but
  they serve only when the guard accepts them: mean prediction entropy on recent inputs
  must fall and a labelled canary set must not get worse. The canary set is required
  (``--canary``, or the one the bundle ships, ``deploy --adaptable --canary-data``):
  entropy alone is computed on the clients' inputs, so any client could steer it;
  ``--adapt-unguarded`` (:attr:`AdaptSettings.unguarded`) is the explicit opt-out;
- when the drift passes, the adapted variant is dropped (the pool unloads it) and the
  shipped one serves again.

Requests read which runner serves through :meth:`AdaptService.runner_for` (one reference,
swapped atomically by the worker). Adaptation follows the variant the control loop chose:
when it switches to another variant, that variant's statistics are estimated afresh.
Every event, the guard's numbers and the worker's costs are in ``status()`` (``/v1/status``
key ``adapt``) and in ``/metrics`` (``hmt_adapt_*``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hmt.bundle import Bundle, BundleVariant
from hmt.errors import NPZ_ERRORS, HmtError, InputError, UsageError
from hmt.runtime.chain import ChainRunner, Runner

ADAPTED_SUFFIX = "+bn"


@dataclass(frozen=True)
class AdaptSettings:
    """``serve --adapt`` knobs; the defaults are the drift figures of benchmarks/adapt/results/drift_scores.json."""

    window: int = 256  # inputs the drift score is computed over
    enter: float = 0.5  # drift starts above this score
    leave: float = 0.35  # and ends when the most recent quarter falls below this one
    adapt_after: int = 256  # drifted inputs before the first adapted variant is built
    refresh_every: int = 1024  # drifted inputs between rebuilds while the drift lasts
    min_batch: int = 32  # inputs per re-estimation batch
    queue_inputs: int = 128  # inputs waiting for the worker; beyond it the oldest are dropped (and counted)
    max_share: float = 0.5  # of one core's wall time the worker may use
    nice: int = 10  # added to the worker thread's OS niceness (Linux): requests go first
    canary_tolerance: float = 0.0  # canary accuracy (0..1) the adapted variant may lose
    min_entropy_gain: float = 0.0  # nats the mean entropy must fall by
    require_entropy_drop: bool = True  # False: a canary set alone decides
    threads: int = 1  # ONNX Runtime threads of the re-estimation graphs
    # Without a labelled canary set the guard is entropy alone, which the clients' own inputs
    # steer (100 noise requests got a model adopted that answered clean images at 23.5%):
    # serve --adapt then refuses to start unless this is set (--adapt-unguarded).
    unguarded: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.max_share <= 1:
            raise UsageError(f"--adapt-max-share must be in (0, 1], got {self.max_share}")
        if self.queue_inputs < self.min_batch:
            raise UsageError(f"adapt queue ({self.queue_inputs}) must hold at least one batch ({self.min_batch})")
        if self.min_batch < 2 or self.adapt_after < self.min_batch:
            raise UsageError(f"need 2 <= adapt min_batch <= adapt_after, got {self.min_batch}, {self.adapt_after}")


def load_canary(path: Path, bundle: Bundle) -> tuple[np.ndarray, np.ndarray]:
    """A labelled canary set as (model inputs [N, *input[1:]], labels [N]).

    ``.npz`` with ``x`` and ``y``: ``x`` float model inputs ([N, *input] or [N, *input[1:]])
    or uint8 pixels [N, H, W, C] (normalised as the bundle's preprocessing says). A
    directory: one sub-folder per class (its name in the bundle's class names, or the class
    index), JPEG/PNG images inside.
    """
    from hmt.serve.http.inputs import InputSpec, decode_image, normalise

    spec = InputSpec.of_bundle(bundle.spec)
    shape = tuple(bundle.spec.input.shape)
    item = shape[1:] if shape[0] == 1 else shape
    if path.is_dir():
        names = list(bundle.spec.class_names or ())
        xs, ys = [], []
        for folder in sorted(p for p in path.iterdir() if p.is_dir()):
            label = names.index(folder.name) if folder.name in names else \
                int(folder.name) if folder.name.isdigit() else None
            if label is None or not 0 <= label < bundle.spec.classes:
                raise InputError(f"{folder}: not a class of this bundle (names {names[:10]} or 0.."
                                 f"{bundle.spec.classes - 1})")
            for image in sorted(folder.iterdir()):
                fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG"}.get(image.suffix.lower())
                if fmt is None:
                    continue
                try:
                    xs.append(decode_image(image.read_bytes(), fmt, spec))
                except Exception as exc:
                    raise InputError(f"{image}: not a readable {fmt} image ({exc})") from exc
                ys.append(label)
        if not xs:
            raise InputError(f"{path}: no JPEG/PNG images in class sub-folders")
        return normalise(np.stack(xs), spec).reshape(len(xs), *item), np.asarray(ys, np.int64)
    try:
        with np.load(path, allow_pickle=False) as archive:
            x, y = np.asarray(archive["x"]), np.asarray(archive["y"])
    except NPZ_ERRORS as exc:
        raise InputError(f"{path}: expected a directory of class folders or an .npz with x and y ({exc})") from exc
    if y.ndim != 1 or len(y) != len(x) or not len(y):
        raise InputError(f"{path}: y must be a non-empty vector of {len(x)} labels, got shape {list(y.shape)}")
    if np.any(y < 0) or np.any(y >= bundle.spec.classes):
        raise InputError(f"{path}: labels outside 0..{bundle.spec.classes - 1}")
    if x.dtype == np.uint8 and spec.preprocess is not None and x.shape[1:] == spec.image_hwc:
        x = normalise(x, spec)
    x = np.asarray(x, np.float32).reshape(len(x), -1)
    if x.shape[1] != int(np.prod(item)):
        raise InputError(f"{path}: x holds {x.shape[1]} values per sample; the bundle's input is {list(item)}")
    if not np.all(np.isfinite(x)):
        raise InputError(f"{path}: x contains NaN or infinity")
    return x.reshape(len(x), *item), y.astype(np.int64)


SHIPPED_CANARY = "adapt/canary.npz"  # deploy --adaptable --canary-data writes it (hmt.deploy.adaptable)


def canary_for(bundle: Bundle, given: Path | None, settings: AdaptSettings) -> tuple[np.ndarray, np.ndarray] | None:
    """The canary set the adaptation guard checks: ``given`` (--canary), else the bundle's shipped one,
    else none, which only ``settings.unguarded`` (--adapt-unguarded) accepts (UsageError otherwise)."""
    if given is not None:
        return load_canary(Path(given), bundle)
    if any(record.path == SHIPPED_CANARY for record in bundle.artifact.manifest.files):
        return load_canary(bundle.path(SHIPPED_CANARY), bundle)
    if settings.unguarded:
        return None
    raise UsageError("--adapt needs a labelled canary set that clients cannot steer: pass --canary (an .npz with x "
                     "and y, or class folders of images), or serve a bundle that ships one (hmt deploy --adaptable "
                     "--canary-data NPZ); --adapt-unguarded adapts on prediction entropy alone, which any client's "
                     "inputs can steer")


@dataclass(frozen=True)
class Adopted:
    base: str
    runner: Runner


class AdaptService:
    """The adaptation worker of one controller (see the module docstring)."""

    def __init__(self, bundle: Bundle, pool: Any, active_arch_id: Callable[[], str | None],
                 settings: AdaptSettings = AdaptSettings(), canary: tuple[np.ndarray, np.ndarray] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from hmt.adapt.drift import DriftMonitor
        from hmt.adapt.online import drift_reference_of

        self.bundle = bundle
        self.pool = pool
        self.settings = settings
        self.canary = canary
        self._active_arch_id = active_arch_id
        self._clock = clock
        self.adaptable = [v.arch_id for v in bundle.spec.variants if isinstance(v.extra.get("adaptable"), dict)]
        if not self.adaptable:
            raise UsageError(f"{bundle.root}: no variant carries BN-adaptable graphs; build the bundle with "
                             "`hmt deploy ... --adaptable`")
        if canary is not None and bundle.spec.input.shape[0] != 1:
            raise UsageError("a canary set needs a bundle whose input has a batch axis of 1")
        first = self._source(self.adaptable[0])
        reference = drift_reference_of(first.spec, first.where)
        self.monitor = DriftMonitor(reference, window=settings.window, enter=settings.enter, leave=settings.leave)
        self._queue: deque[np.ndarray] = deque(maxlen=settings.queue_inputs)  # append/popleft: thread-safe
        self._ready = threading.Event()
        self._adapter: Any = None
        self._adapter_base: str | None = None
        self._adopted: Adopted | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.events: deque[dict[str, Any]] = deque(maxlen=32)
        self.counts = {"offered": 0, "dropped": 0, "observed": 0, "drift_starts": 0, "adopted": 0, "refused": 0,
                       "refused_memory": 0, "resets": 0, "evicted": 0, "errors": 0}
        self.busy_s = 0.0
        self.build_ms: float | None = None
        self.last_decision: dict[str, Any] | None = None
        self.started_s = clock()
        # Whether the adapted copy of a variant may be held beside it (serve's joint decision sets it from
        # the memory budget: hmt.serve.deciding.joint); refused copies are counted, not built.
        self.fits: Callable[[str], bool] = lambda base: True

    # -- the request side (hot path: no lock, no waiting) -----------------------------------

    def offer(self, x: np.ndarray) -> None:
        """One answered input for the worker; when the queue is full its oldest input goes (counted)."""
        self.counts["offered"] += 1
        if len(self._queue) == self.settings.queue_inputs:
            self.counts["dropped"] += 1
        self._queue.append(x)
        self._ready.set()

    def runner_for(self, base: Runner) -> Runner:
        """The adapted runner when one was adopted for ``base`` and the pool still holds it."""
        adopted = self._adopted
        if adopted is None or adopted.base != base.arch_id:
            return base
        return adopted.runner

    @property
    def adopted_base(self) -> str | None:
        """The variant whose adapted copy is adopted now."""
        adopted = self._adopted
        return None if adopted is None else adopted.base

    def adapted_bytes(self) -> dict[str, int]:
        """Per adaptable variant: the bytes its adapted copy adds (its graphs, as deploy recorded them)."""
        return {a: int(self.bundle.spec.variant(a).extra["adaptable"].get("size_bytes", 0)) for a in self.adaptable}

    @property
    def adopted_arch_id(self) -> str | None:
        adopted = self._adopted
        return None if adopted is None else adopted.runner.arch_id

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="hmt-serve-adapt", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    # -- the worker ----------------------------------------------------------------------------

    def _source(self, arch_id: str) -> Any:
        from hmt.adapt.bn_runtime import bn_source_in

        return bn_source_in(self.bundle.artifact, str(self.bundle.spec.variant(arch_id).extra["adaptable"]["dir"]))

    def _event(self, kind: str, detail: str, **extra: Any) -> None:
        self.events.append({"time_s": self._clock() - self.started_s, "kind": kind, "detail": detail,
                            "seen": self.monitor.seen, **extra})

    def _loop(self) -> None:
        if self.settings.nice and hasattr(os, "setpriority"):
            with contextlib.suppress(OSError):  # Linux: a thread's id is a process id to setpriority
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               os.getpriority(os.PRIO_PROCESS, 0) + self.settings.nice)
        chunk = min(16, self.settings.min_batch)
        while not self._stop.is_set():
            if not self._ready.wait(0.1):
                continue
            items: list[np.ndarray] = []
            while len(items) < chunk:
                try:
                    items.append(self._queue.popleft())
                except IndexError:
                    self._ready.clear()
                    if self._queue:  # an offer raced the clear: keep the flag up
                        self._ready.set()
                    break
            if not items:
                continue
            start = time.perf_counter()
            try:
                self.step(np.concatenate([np.asarray(i, np.float32).reshape(1, *i.shape[1:]) for i in items]))
            except HmtError as exc:
                self.counts["errors"] += 1
                self._event("error", str(exc))
            except Exception as exc:  # noqa: BLE001 - the worker must outlive one bad batch
                self.counts["errors"] += 1
                self._event("error", f"{type(exc).__name__}: {exc}")
            spent = time.perf_counter() - start
            self.busy_s += spent
            # Stay within max_share of one core: rest in proportion to the work just done.
            rest = spent * (1.0 / self.settings.max_share - 1.0)
            if rest > 0:
                self._stop.wait(rest)

    def _adapter_for(self, base: str) -> Any:
        from hmt.adapt.guard import GuardPolicy
        from hmt.adapt.online import OnlineBnAdapter

        if self._adapter is not None and self._adapter_base == base:
            return self._adapter
        s = self.settings
        self._drop_adopted("the serving variant changed")
        self._adapter = OnlineBnAdapter(
            self._source(base), monitor=self.monitor, adapt_after=s.adapt_after, refresh_every=s.refresh_every,
            min_batch=s.min_batch, threads=s.threads, canary=self.canary,
            guard=GuardPolicy(min_entropy_gain=s.min_entropy_gain, canary_tolerance=s.canary_tolerance,
                              require_entropy_drop=s.require_entropy_drop))
        self._adapter_base = base
        return self._adapter

    def step(self, x: np.ndarray) -> None:
        """One batch of answered inputs (the worker calls this; tests may too)."""
        base = self._active_arch_id()
        adopted = self._adopted
        if adopted is not None and adopted.runner.arch_id not in self.pool:
            self._drop_adopted("the pool unloaded it (memory budget)", evicted=True)
        elif adopted is not None and not self.fits(adopted.base):
            self._drop_adopted("it does not fit the memory budget beside its variant", evicted=True)
        change = self.monitor.update(x)
        self.counts["observed"] += len(x)
        if change is not None and change.kind == "drift-start":
            self.counts["drift_starts"] += 1
            self._event("drift-start", f"input statistics drifted (score {change.score:.2f})")
        if base is None or base not in self.adaptable:
            if change is not None and change.kind == "drift-end":
                self._reset(f"drift passed (score {change.score:.2f})")
            return
        adapter = self._adapter_for(base)
        for event in adapter.apply(x, change):
            if event.kind == "reset":
                self._reset(event.detail)
            elif event.kind in ("adapted", "refused"):
                self.last_decision = {"base": base, **event.decision.to_json_dict()} if event.decision else None
                if event.kind == "adapted":
                    self._adopt(base, adapter.active, event.detail)
                else:
                    self.counts["refused"] += 1
                    self._drop_adopted(f"refused: {event.detail}")
                    self._event("refused", event.detail, base=base)

    def _adopt(self, base: str, chain: Any, detail: str) -> None:
        if not self.fits(base):
            self.counts["refused_memory"] += 1
            self._event("refused", "the adapted copy does not fit the memory budget beside its variant", base=base)
            return
        start = time.perf_counter()
        variant: BundleVariant = self.bundle.spec.variant(base)
        adapted_id = base + ADAPTED_SUFFIX
        spec = dataclasses.replace(variant, arch_id=adapted_id, engines=("onnxruntime",),
                                   preferred_engine="onnxruntime")
        segments = [chain.graph_fn(f"segment_{k}") for k in range(len(variant.segments))]
        exits = [chain.graph_fn(f"exit_{k}") for k in range(len(variant.exits))]
        runner = ChainRunner(spec, segments, exits, "onnxruntime",
                             notes=[f"BN statistics re-estimated on {self._adapter.reestimator.batches} batches of "
                                    f"recent inputs ({detail})"])
        runner.warm_up(np.zeros(self.bundle.spec.input.shape, np.float32), 2)
        self.pool.add(adapted_id, runner)
        self._adopted = Adopted(base, runner)
        self.build_ms = (time.perf_counter() - start) * 1e3
        self.counts["adopted"] += 1
        self._event("adopted", detail, base=base, variant=adapted_id)

    def _drop_adopted(self, why: str, *, evicted: bool = False) -> None:
        adopted, self._adopted = self._adopted, None
        if adopted is None:
            return
        self.pool.remove(adopted.runner.arch_id)
        self.counts["evicted"] += evicted
        self._event("dropped", why, variant=adopted.runner.arch_id)

    def _reset(self, detail: str) -> None:
        self.counts["resets"] += 1
        self._drop_adopted("reset")
        if self._adapter is not None:
            self._adapter.reset()
        self._event("reset", detail)

    # -- reporting ---------------------------------------------------------------------------

    def _memory_bytes(self) -> int:
        base = self._adapter_base
        graphs = 0 if base is None else int(self.bundle.spec.variant(base).extra["adaptable"].get("size_bytes", 0))
        item = int(np.prod(self.bundle.spec.input.shape)) * 4
        return graphs + item * (self.settings.queue_inputs + 9 * self.settings.min_batch)

    def status(self) -> dict[str, Any]:
        uptime = max(self._clock() - self.started_s, 1e-9)
        adapter = self._adapter
        return {
            "enabled": True,
            "adaptable_variants": list(self.adaptable),
            "adapting": self._adapter_base,
            "serving_adapted": self.adopted_arch_id,
            "drifting": self.monitor.drifting,
            "drift_score": self.monitor.score,
            "inputs_seen": self.monitor.seen,
            "batches_estimated": 0 if adapter is None else adapter.reestimator.batches,
            "queue": {"depth": len(self._queue), "capacity": self.settings.queue_inputs},
            # What adaptation holds beyond the served variant: the graphs it opens (stats + inference
            # graphs of the variant adapting) and its input buffers (queue + the guard's recent batches).
            "memory_bytes": self._memory_bytes(),
            "counts": dict(self.counts),
            "worker": {"busy_s": self.busy_s, "share": self.busy_s / uptime, "max_share": self.settings.max_share,
                       "last_build_ms": self.build_ms},
            "canary": None if self.canary is None else {"images": len(self.canary[1])},
            "last_decision": self.last_decision,
            "events": list(self.events),
        }
