"""Loaded variants kept within a memory budget; the others are loaded when needed.

The pool counts each variant at its bundled ``memory_mb`` (parameters + activation
peak, the number pareto and the optimizer use), so "fits the budget" means the same
thing to both. Loading is serialised (one load at a time; loads are rare and each one
already uses the CPU); lookups of loaded variants take no lock on the request path.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Callable

import numpy as np

from hmt.bundle import Bundle
from hmt.errors import ArtifactError, HmtError, ModelError
from hmt.runtime.chain import Runner
from hmt.runtime.variant import example_input, load_variant

Loader = Callable[[str], Runner]
# A variant that failed to load is not tried again for this long (each try costs a load).
LOAD_RETRY_S = 30.0


class VariantPool:
    """Loaded :class:`Runner` objects by arch id, least recently used first."""

    def __init__(self, bundle: Bundle, *, engine: str = "auto", threads: int | None = None, warmup_runs: int = 3,
                 loader: Loader | None = None, early_exit: bool = True, providers: Sequence[str] = ("cpu",),
                 max_threads: int | None = None) -> None:
        self.bundle = bundle
        self.engine = engine
        # ORT execution providers in order (hmt.runtime.ort names); a variant fuse measured
        # fastest on the CPU keeps the CPU provider (hmt.runtime.variant.providers_as_measured).
        self.providers = tuple(providers)
        self.threads = threads  # None: fuse's choice per variant (see hmt.runtime.variant)
        self.max_threads = max_threads  # with threads None: fuse's choice cut to this share (within_share)
        self.early_exit = early_exit
        self.warmup_runs = warmup_runs
        self._loader: Loader = loader if loader is not None else self._load_from_bundle
        self._loaded: OrderedDict[str, Runner] = OrderedDict()
        self._load_lock = threading.Lock()
        self._warm_input = example_input(bundle, np.random.default_rng(0))
        self.load_count = 0
        self.load_failures = 0
        self.integrity_failures = 0  # loads refused because a file no longer matches the manifest
        self.evictions = 0
        self.last_load_ms: float | None = None

    def _load_from_bundle(self, arch_id: str) -> Runner:
        return load_variant(self.bundle, arch_id, self.engine, self.threads, early_exit=self.early_exit,
                            providers=self.providers, max_threads=self.max_threads)

    def __contains__(self, arch_id: object) -> bool:
        return arch_id in self._loaded

    def loaded_ids(self) -> list[str]:
        return list(self._loaded)

    def loaded_bytes(self) -> int:
        return sum(r.memory_bytes for r in list(self._loaded.values()))

    def added_bytes(self, arch_id: str) -> int:
        """What loading ``arch_id`` adds: its recorded memory footprint."""
        return int(self.bundle.spec.variant(arch_id).memory_mb * 1e6)

    def fits(self, arch_id: str, capacity_bytes: int | None) -> bool:
        """Whether ``arch_id`` is loaded or loading it keeps the pool within ``capacity_bytes`` (None: no limit)."""
        return (capacity_bytes is None or arch_id in self._loaded
                or self.loaded_bytes() + self.added_bytes(arch_id) <= capacity_bytes)

    def get(self, arch_id: str) -> Runner | None:
        runner = self._loaded.get(arch_id)
        if runner is not None:
            # Evicted by another thread meanwhile: the caller still holds it.
            with contextlib.suppress(KeyError):
                self._loaded.move_to_end(arch_id)
        return runner

    def load(self, arch_id: str) -> Runner:
        """The loaded, warmed runner of ``arch_id``, loading it now if needed (ModelError on failure)."""
        runner = self.get(arch_id)
        if runner is not None:
            return runner
        with self._load_lock:
            runner = self._loaded.get(arch_id)
            if runner is not None:
                return runner
            start = time.perf_counter()
            try:
                runner = self._loader(arch_id)
                runner.warm_up(self._warm_input, self.warmup_runs)
            except HmtError as exc:
                self.load_failures += 1
                self.integrity_failures += isinstance(exc, ArtifactError)
                raise ModelError(f"variant {arch_id!r} failed to load: {exc}") from exc
            except Exception as exc:
                self.load_failures += 1
                raise ModelError(f"variant {arch_id!r} failed to load: {type(exc).__name__}: {exc}") from exc
            self.last_load_ms = (time.perf_counter() - start) * 1e3
            self.load_count += 1
            self._loaded[arch_id] = runner
            return runner

    def add(self, arch_id: str, runner: Runner) -> None:
        """Register a runner built elsewhere (serve --adapt's adapted variant) as loaded; it
        counts against the memory budget and ``trim`` may unload it like any other."""
        with self._load_lock:
            # A replaced runner is not closed: a request may still hold it; it goes with the last reference.
            self._loaded.pop(arch_id, None)
            self._loaded[arch_id] = runner
            self.load_count += 1

    def remove(self, arch_id: str) -> None:
        """Unload ``arch_id`` now (a request holding it finishes with it)."""
        with self._load_lock:
            self._loaded.pop(arch_id, None)

    def preload_order(self, first: str) -> list[str]:
        """``first``, the fastest variant (the fallback when budgets tighten), then the rest by accuracy."""
        variants = self.bundle.spec.variants
        order = [first, min(variants, key=lambda v: v.latency_ms).arch_id]
        order.extend(v.arch_id for v in sorted(variants, key=lambda v: -v.accuracy))
        return list(dict.fromkeys(order))

    def preload(self, order: Iterable[str], capacity_bytes: int | None) -> list[str]:
        """Load variants in ``order`` while the total stays within ``capacity_bytes``; failures are skipped."""
        done: list[str] = []
        for arch_id in order:
            if not self.fits(arch_id, capacity_bytes):
                continue
            try:
                self.load(arch_id)
            except ModelError:
                continue
            done.append(arch_id)
        return done

    def trim(self, capacity_bytes: int | None, keep: Iterable[str]) -> list[str]:
        """Unload least recently used variants not in ``keep`` until the total fits ``capacity_bytes``.

        A request already holding an evicted runner finishes with it: the sessions are
        freed when the last reference goes.
        """
        if capacity_bytes is None:
            return []
        keep_set = set(keep)
        evicted: list[str] = []
        for arch_id in list(self._loaded):
            if self.loaded_bytes() <= capacity_bytes:
                break
            if arch_id in keep_set:
                continue
            self._loaded.pop(arch_id, None)
            evicted.append(arch_id)
        self.evictions += len(evicted)
        return evicted


class LoadBackoff:
    """Loads through ``pool``; a variant that failed to load is not tried again for ``retry_s``
    (each try costs a load), and a call in that time fails at once, saying so."""

    def __init__(self, pool: VariantPool, clock: Callable[[], float], retry_s: float = LOAD_RETRY_S) -> None:
        self.pool = pool
        self._clock = clock
        self.retry_s = retry_s
        self.failed: dict[str, float] = {}  # arch id -> when its last real try failed, on ``clock``
        self.reasons: dict[str, str] = {}  # arch id -> why it failed (the file and the runtime's message)
        self.dropped: set[str] = set()  # variants a memory cut unloaded (the controller files them), see refill
        self._refill_lock = threading.Lock()
        self._refill_thread: threading.Thread | None = None
        self._refilled: list[Runner] = []  # loaded back by the refill thread, not yet collected

    def load(self, arch_id: str) -> Runner:
        failed_at = self.failed.get(arch_id)
        if failed_at is not None and self._clock() - failed_at < self.retry_s:
            # The reason, not only the retry: /v1/status' last_error shows this one from the next tick on.
            raise ModelError(f"{self.reasons[arch_id]} ({self._clock() - failed_at:.1f} s ago; "
                             f"retrying after {self.retry_s:g} s)")
        try:
            runner = self.pool.load(arch_id)
        except ModelError as exc:
            self.failed[arch_id] = self._clock()
            self.reasons[arch_id] = str(exc)
            raise
        self.failed.pop(arch_id, None)
        self.reasons.pop(arch_id, None)
        return runner

    def refill(self, order: Iterable[str], capacity_bytes: int | None) -> Runner | None:
        """Load back the first of ``order`` in :attr:`dropped` that fits ``capacity_bytes`` again, and
        return it (None: none fits, or its load failed: it waits out the backoff). One per call: a load
        holds the caller (:meth:`refill_async` runs it off the control thread). Without this, after a
        memory squeeze the pool kept the one variant: the others could not be measured (shadow runs
        take loaded ones) and a climb waited on a load."""
        pool = self.pool
        for arch_id in [a for a in order if a in self.dropped]:
            if arch_id in pool:
                self.dropped.discard(arch_id)
                continue
            if not pool.fits(arch_id, capacity_bytes):
                continue
            try:
                runner = self.load(arch_id)
            except ModelError:
                continue
            self.dropped.discard(arch_id)
            return runner
        return None

    @property
    def refilling(self) -> bool:
        """A refill load runs, or one finished and was not collected yet (:meth:`refill_async`)."""
        thread = self._refill_thread
        return bool(self._refilled) or (thread is not None and thread.is_alive())

    def refill_async(self, order: Iterable[str], capacity_bytes: int | None) -> list[Runner]:
        """:meth:`refill` on a thread of its own, one load at a time: returns the runners loaded back
        since the last call (the caller files their engines) and starts the next load when none runs.

        A load and its warm-up runs held the control thread: on untuned TVM the largest variant's
        took about 0.5 s after a memory squeeze lifted, so no decision ran in that time and the loop
        stayed that much longer on its least-memory variant. A decision that picks a variant the
        thread is loading waits for it on the pool's load lock; one that picks another loads it."""
        with self._refill_lock:
            done, self._refilled = self._refilled, []
            running = self._refill_thread is not None and self._refill_thread.is_alive()
            if running or not self._fits_back(order := list(order), capacity_bytes):
                return done
            thread = threading.Thread(target=self._refill_one, args=(order, capacity_bytes),
                                      name="hmt-refill", daemon=True)
            self._refill_thread = thread
        thread.start()
        return done

    def _fits_back(self, order: list[str], capacity_bytes: int | None) -> bool:
        """Whether a variant a memory cut unloaded fits ``capacity_bytes`` again (no thread for none)."""
        return any(a in self.dropped and self.pool.fits(a, capacity_bytes) for a in order)

    def _refill_one(self, order: list[str], capacity_bytes: int | None) -> None:
        runner = self.refill(order, capacity_bytes)
        if runner is not None:
            with self._refill_lock:
                self._refilled.append(runner)

    def wait_refill(self, timeout_s: float = 10.0) -> None:
        """Wait for a refill load in progress (stop, and tests on a fake clock)."""
        thread = self._refill_thread
        if thread is not None:
            thread.join(timeout_s)
