"""Admission and execution behind the API (:mod:`hmt.serve.http.api`): the HTTP-side limits and a
bounded queue in front of the inference pool, the decoding lane and, opt-in, the dynamic batcher.

A request is admitted to the queue first (429 when full); only then is its body decoded, off the
event loop: images, JSON, multipart forms and /v2 requests in a decoding lane of one thread, .npy
on the inference pool. Then it runs on the pool (or, with ``--dynamic-batch``, in the batcher's
batches) under its deadline (504; a request still waiting at its deadline is dropped unrun).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, List

import numpy as np

from hmt.bundle import TensorSpec
from hmt.errors import DeviceError, ModelError, UsageError
from hmt.serve.controller import Controller, Prediction
from hmt.serve.http.inputs import ApiError
from hmt.serve.running.batching import BatchingOptions, DeadlinePassed, DynamicBatcher

logger = logging.getLogger("hmt.serve.http.api")

Prepare = Callable[[], List[np.ndarray]]


@dataclass(frozen=True)
class ApiOptions:
    """HTTP-side limits. ``max_body_bytes=None``: derived from the input spec (room for JSON text)."""

    token: str | None = None
    max_body_bytes: int | None = None
    max_queue: int = 64
    workers: int = 2
    deadline_ms: float = 2000.0
    health_without_token: bool = False  # let /v1/health/* and /v2/health/* through without the token (probes)
    max_batch: int = 64  # inputs per request
    max_image_pixels: int = 4096 * 4096  # width x height of an encoded image, checked before decoding
    model_name: str | None = None  # the model's name on /v2 (None: the bundle directory's name)
    dynamic_batch: int = 1  # inputs run together by the dynamic batcher (hmt.serve.running.batching); 1: off
    dynamic_batch_delay_ms: float = 2.0

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise UsageError(f"max_queue must be >= 1, got {self.max_queue}")
        if self.workers < 1:
            raise UsageError(f"workers must be >= 1, got {self.workers}")
        if not (math.isfinite(self.deadline_ms) and self.deadline_ms > 0):
            raise UsageError(f"deadline_ms must be a finite number > 0, got {self.deadline_ms}")
        if self.max_body_bytes is not None and self.max_body_bytes < 64:
            raise UsageError(f"max_body_bytes must be >= 64, got {self.max_body_bytes}")
        if self.max_batch < 1:
            raise UsageError(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.max_image_pixels < 1:
            raise UsageError(f"max_image_pixels must be >= 1, got {self.max_image_pixels}")
        BatchingOptions(self.dynamic_batch, self.dynamic_batch_delay_ms)  # refuses bad values

    def body_limit(self, spec: TensorSpec) -> int:
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        numel = math.prod(spec.shape)  # one input
        # JSON spells a float in up to ~25 characters; .npy needs the raw bytes + a header. Room for
        # max_batch inputs up to 64 MiB (a JSON batch of 64 CIFAR images was refused at 1 MiB), and
        # always for one input.
        one = 32 * numel + 4096
        return max(1 << 20, one, min(32 * numel * self.max_batch + 4096, 64 << 20))


class _DeadlinePassed(Exception):
    pass


def _out_of_range(exc: ModelError, items: list[np.ndarray]) -> ApiError:
    # The input passed every check, so a chain that cannot answer it (non-finite logits
    # from finite inputs like 3e38) is the input's range, not a server fault.
    logger.info("model refused an input: %s", exc)
    peak = max(float(np.max(np.abs(x))) for x in items) if items else 0.0
    return ApiError(422, "input_out_of_range", f"the model gives no finite answer for this input (largest "
                                               f"|value| {peak:.3g}); send inputs in the model's range, "
                                               "e.g. normalised pixels")


def _deadline_error(deadline_ms: float) -> ApiError:
    return ApiError(504, "deadline_exceeded", f"no answer within the deadline of {deadline_ms:g} ms "
                                              "(counted from the request's first byte)")


class InferenceService:
    """A bounded queue in front of a thread pool running :meth:`Controller.predict`.

    One admitted request holds one queue slot and one worker for all of its inputs (a
    batch runs item by item: the bundle's graphs take a batch of one), unless the dynamic
    batcher is on: then its inputs join other requests' in batches.
    """

    def __init__(self, controller: Controller, options: ApiOptions) -> None:
        self.controller = controller
        self.options = options
        self._executor = concurrent.futures.ThreadPoolExecutor(options.workers, thread_name_prefix="hmt-infer")
        # Expensive bodies (images, JSON) decode in a lane of their own: a flood of them waits there,
        # not in front of the inference workers, so cheap requests (.npy) keep their latency.
        self._decoder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hmt-decode")
        batching = BatchingOptions(options.dynamic_batch, options.dynamic_batch_delay_ms)
        self.batcher = DynamicBatcher(controller, batching, options.workers) if batching.enabled else None
        self._lock = threading.Lock()
        self.admitted = 0
        self.rejected_full = 0
        self.deadline_expired = 0

    def _release(self, _future: concurrent.futures.Future[Any] | None) -> None:
        with self._lock:
            self.admitted -= 1

    def _work(self, prepare: Prepare, received_s: float, deadline_s: float) -> list[Prediction]:
        start_s = time.monotonic()
        if start_s > deadline_s:
            raise _DeadlinePassed()
        items = prepare()  # decoding runs here, on the pool, not on the event loop
        # The server's part before compute (queueing and decoding, from the body's last byte) is the
        # request's overhead in the loop's latency model; receipt is the client's pace, not ours.
        overhead_ms = (time.monotonic() - received_s) * 1e3
        try:
            return [self.controller.predict(x, queued_ms=overhead_ms) for x in items]
        except ModelError as exc:
            raise _out_of_range(exc, items) from exc

    async def submit(self, prepare: Prepare, first_byte_s: float, deadline_ms: float,
                     received_s: float | None = None, heavy: bool = False,
                     tightened_ms: Callable[[], float | None] | None = None) -> list[Prediction]:
        """Admit a request (429 when the queue is full), then decode (``prepare``) and run it on the pool.

        ``first_byte_s`` starts the deadline; ``received_s`` (the body's last byte; default now)
        starts what counts as the server's overhead. ``heavy``: decode in the decoding lane first
        (one thread), then infer; the request holds its queue slot throughout. ``tightened_ms``
        (heavy only): asked after decoding for a shorter deadline the body itself set (/v2's
        ``timeout`` parameter)."""
        received_s = time.monotonic() if received_s is None else received_s
        with self._lock:
            if self.admitted >= self.options.max_queue:
                self.rejected_full += 1
                raise ApiError(429, "queue_full", f"{self.admitted} requests are queued or running "
                                                  f"(limit {self.options.max_queue}); retry later",
                               headers={"Retry-After": "1"})
            self.admitted += 1
        deadline_s = first_byte_s + deadline_ms / 1e3
        items: list[np.ndarray] | None = None
        if heavy or self.batcher is not None:
            # The batcher takes decoded inputs: light bodies decode on the pool, which it leaves idle.
            items = await self._decode_first(prepare, deadline_s, deadline_ms,
                                             self._decoder if heavy else self._executor)
            try:
                tighter = tightened_ms() if tightened_ms is not None else None
            except BaseException:
                self._release(None)
                raise
            if tighter is not None and tighter < deadline_ms:
                deadline_ms, deadline_s = tighter, first_byte_s + tighter / 1e3
            decoded = items
            prepare = lambda: decoded  # noqa: E731 - the decoded items, for the pool
        try:
            if self.batcher is not None and items is not None:
                # Everything from the body's last byte counts as the batched request's wait.
                future = self.batcher.submit(items, received_s, deadline_s)
            else:
                future = self._executor.submit(self._work, prepare, received_s, deadline_s)
        except RuntimeError as exc:  # the pool is shutting down
            self._release(None)
            raise ApiError(503, "shutting_down", "the server is shutting down") from exc
        future.add_done_callback(self._release)
        try:
            # Cancelling the wrapper on timeout also cancels the job if it has not started.
            return await asyncio.wait_for(asyncio.wrap_future(future), max(0.0, deadline_s - time.monotonic()))
        except (asyncio.TimeoutError, _DeadlinePassed, DeadlinePassed) as exc:
            self.deadline_expired += 1
            raise _deadline_error(deadline_ms) from exc
        except ModelError as exc:  # from the batcher (the pool's _work turns it into a 422 itself)
            raise _out_of_range(exc, items or []) from exc
        except DeviceError as exc:
            logger.warning("inference unavailable: %s", exc)
            raise ApiError(503, "unavailable", "no variant can answer right now; retry",
                           headers={"Retry-After": "1"}) from exc

    async def _decode_first(self, prepare: Prepare, deadline_s: float, deadline_ms: float,
                            lane: concurrent.futures.ThreadPoolExecutor) -> list[np.ndarray]:
        """Run ``prepare`` in ``lane``; the decoded items. On any failure the queue slot is
        released once the decode has ended (or was cancelled)."""
        try:
            future = lane.submit(prepare)
        except RuntimeError as exc:  # shutting down
            self._release(None)
            raise ApiError(503, "shutting_down", "the server is shutting down") from exc
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), max(0.0, deadline_s - time.monotonic()))
        except BaseException as exc:
            future.add_done_callback(self._release)
            if isinstance(exc, asyncio.TimeoutError):
                self.deadline_expired += 1
                raise _deadline_error(deadline_ms) from exc
            raise

    def shutdown(self) -> None:
        """Finish every admitted request, then stop the pools."""
        self._decoder.shutdown(wait=True)
        self._executor.shutdown(wait=True)  # with the batcher on, it decodes .npy bodies for it
        if self.batcher is not None:
            self.batcher.shutdown()
