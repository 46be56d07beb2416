"""Opt-in dynamic batching: requests that arrive close together run as one batch through the graphs.

Off by default (``serve --dynamic-batch 1``). With ``--dynamic-batch N`` the API hands each
admitted request's inputs to a :class:`DynamicBatcher` instead of the thread pool: a worker takes
the oldest waiting request, waits at most ``--dynamic-batch-delay-ms`` after its arrival for
more (up to N inputs in all), then runs them in one call per graph (``run_batch`` of
:mod:`hmt.runtime.chain`, with early exit per row) and answers each request with its rows.

Only variants whose graphs take a batch can: bundles are exported with a batch axis of 1, and
a graph whose batch axis is fixed refuses a larger one. The first time a variant is asked to
batch, a batch of two copies of a real input is run and compared with two single runs; a
variant that fails (or answers differently) runs its batches item by item, as without batching,
and ``/v1/status`` (key ``batching``) says which variants batch. serve --adapt and offloading
answer item by item too.

A request whose deadline passes while it waits is dropped without running (504), as in the
pool; every answer's latency counts its wait, so the loop's budget sees the batching delay.
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from hmt.compat import strict_zip
from hmt.errors import UsageError
from hmt.serve.controller import Controller
from hmt.serve.reporting.records import Prediction


@dataclass(frozen=True)
class BatchingOptions:
    max_batch: int = 1  # inputs per batch; 1: off
    max_delay_ms: float = 2.0  # longest wait for more inputs after the oldest arrived

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise UsageError(f"--dynamic-batch must be >= 1 (1: off), got {self.max_batch}")
        if not (math.isfinite(self.max_delay_ms) and 0 <= self.max_delay_ms <= 1000):
            raise UsageError(f"--dynamic-batch-delay-ms must be in [0, 1000], got {self.max_delay_ms}")

    @property
    def enabled(self) -> bool:
        return self.max_batch > 1


class DeadlinePassed(Exception):
    """A batched request's deadline passed before its batch ran."""


@dataclass
class _Job:
    items: list[np.ndarray]
    arrived_s: float
    deadline_s: float
    future: concurrent.futures.Future[list[Prediction]]


class DynamicBatcher:
    """Worker threads that run queued requests in batches (see the module docstring)."""

    def __init__(self, controller: Any, options: BatchingOptions, workers: int,
                 clock: Any = time.monotonic) -> None:
        self.controller = controller
        self.options = options
        self._clock = clock
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._capable: dict[str, bool] = {}
        self.batches = 0
        self.batched_inputs = 0
        self.sizes: deque[int] = deque(maxlen=1024)
        self._threads = [threading.Thread(target=self._loop, name=f"hmt-batch-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, items: list[np.ndarray], arrived_s: float, deadline_s: float
               ) -> concurrent.futures.Future[list[Prediction]]:
        future: concurrent.futures.Future[list[Prediction]] = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                raise RuntimeError("the batcher is shutting down")
            self._jobs.append(_Job(items, arrived_s, deadline_s, future))
            self._cond.notify()
        return future

    def _take(self) -> list[_Job] | None:
        """The next batch of jobs (None: stopping and nothing left)."""
        limit = self.options.max_batch
        with self._cond:
            while not self._jobs:
                if self._stopping:
                    return None
                self._cond.wait()
            oldest = self._jobs[0]
            due_s = oldest.arrived_s + self.options.max_delay_ms / 1e3
            while not self._stopping and sum(len(j.items) for j in self._jobs) < limit:
                wait_s = due_s - self._clock()
                if wait_s <= 0:
                    break
                self._cond.wait(wait_s)
            taken: list[_Job] = []
            count = 0
            while self._jobs and (not taken or count + len(self._jobs[0].items) <= limit):
                job = self._jobs.popleft()
                taken.append(job)
                count += len(job.items)
            if self._jobs:
                self._cond.notify()  # another worker may start on the rest now
            return taken

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            now = self._clock()
            live = []
            for job in jobs:
                if not job.future.set_running_or_notify_cancel():
                    continue  # the client gave up (its deadline passed on the event loop)
                if now > job.deadline_s:
                    job.future.set_exception(DeadlinePassed())
                    continue
                live.append(job)
            if live:
                self._run(live, now)

    def _run(self, jobs: list[_Job], start_s: float) -> None:
        items = [x for job in jobs for x in job.items]
        queued = [(start_s - job.arrived_s) * 1e3 for job in jobs for _ in job.items]
        try:
            predictions = self._predict(items, queued)
        except BaseException as exc:  # noqa: BLE001 - each waiting request gets the failure
            for job in jobs:
                job.future.set_exception(exc)
            return
        self.batches += 1
        self.batched_inputs += len(items)
        self.sizes.append(len(items))
        offset = 0
        for job in jobs:
            job.future.set_result(predictions[offset:offset + len(job.items)])
            offset += len(job.items)

    def _predict(self, items: list[np.ndarray], queued_ms: list[float]) -> list[Prediction]:
        controller = self.controller
        # Only the device's own loop batches: an offloading controller (or serve --adapt) answers item by item.
        runner = controller.serving_runner() if isinstance(controller, Controller) else None
        run_batch = getattr(runner, "run_batch", None)
        if runner is None or run_batch is None or len(items) == 1 or controller.adapt is not None \
                or not self.capable(runner, items[0]):
            return [controller.predict(x, queued_ms=q) for x, q in strict_zip(items, queued_ms)]
        early = controller.settings.early_exit
        with controller.shadow.serving():
            results = run_batch(np.concatenate(items), early.confidence if early.enabled else None)
        return [controller.record(runner, runner, x, r, q) for x, r, q in strict_zip(items, results, queued_ms)]

    def capable(self, runner: Any, x: np.ndarray) -> bool:
        """Whether ``runner``'s graphs take a batch and answer it as they answer its rows (checked once)."""
        key = f"{runner.arch_id}@{runner.engine}"
        known = self._capable.get(key)
        if known is not None:
            return known
        ok = False
        run_batch = getattr(runner, "run_batch", None)
        if callable(run_batch):
            other = x * np.asarray(0.5, dtype=x.dtype)
            try:
                batch = run_batch(np.concatenate([x, other]), None)
                singles = [runner.run(v, None) for v in (x, other)]
                ok = len(batch) == 2 and all(
                    b.class_index == s.class_index and abs(b.confidence - s.confidence) <= 1e-4
                    for b, s in strict_zip(batch, singles))
            except Exception:  # noqa: BLE001 - any refusal (ORT's InvalidArgument, TVM's, HmtError) means no
                ok = False
        self._capable[key] = ok
        return ok

    def status(self) -> dict[str, Any]:
        sizes = list(self.sizes)
        return {"enabled": True, "max_batch": self.options.max_batch, "max_delay_ms": self.options.max_delay_ms,
                "batches": self.batches, "inputs": self.batched_inputs,
                "mean_batch": None if not sizes else float(np.mean(sizes)),
                "variants_take_a_batch": dict(self._capable)}

    def shutdown(self) -> None:
        """Run every queued request, then stop the workers."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
