"""On-device re-search (AdaptiveNet's on-device stage): when nothing fits, look for a variant that does.

serve ``--research`` on a bundle with block graphs (``deploy --blocks --blocks-data``). The
loop offers each decision to :meth:`Research.offer`; when the decision found no feasible
variant for ``patience`` ticks in a row and the active variant's estimate is measured (the
measurements, not a prediction, say it is too slow), a search starts on its own thread
while the current variant keeps serving:

- *nearby mutations* of the current variant within the shipped sub-space: one or two
  positions take another shipped choice, or the exit moves one stage earlier; while
  nothing fits, the search walks from the fastest candidate measured so far, then from the
  most accurate one that fits;
- *latency measured on the device*: each candidate is composed from the blocks
  (:func:`hmt.runtime.blocks.compose`) and timed on single inputs (``latency_runs``), and it fits
  when its median times the *serving ratio* is within the compute budget and its blocks within the
  memory budget; while nothing fits, each change goes to a cheaper choice. The serving ratio is
  what the loop's measured estimate of the start variant (the p95 of its served requests, which
  feasibility is judged on) says over the start's median timed the search's way, just before, on
  the runner that served those requests (the pool's whole graph, or its composed copy); at least
  ``1 / margin``. A candidate is served composed, and composing costs what it costs in the timed
  runs too (on the demo bundle, measured ad hoc on a 2-core VM, a composed variant timed alone is
  1.2-1.3x its whole graph, and served 1.2x), so the ratio must come from the start as served: the
  start composed afresh would carry the composition into the denominator and cancel it, and found
  variants then missed the budget they were found for. Back-to-back medians alone understate what
  serving measures (requests arrive apart, the loop and the other threads run between them, and
  feasibility reads a tail): a candidate taken on its median with a fixed margin was judged too
  slow as soon as its own requests measured it (on a busy 2-core machine, serving p95 ran 2-5x the
  timed median);
- *accuracy*: a bundled variant's from ``blocks.json`` (measured by deploy on the shipped
  calibration set), any other's measured now on that same labelled set;
- *confirmed*: before the found variant is handed over, it and the start variant are timed in
  turn (:meth:`Research.confirm`); it is adopted only if its median over the start's, times the
  loop's measured estimate of the start, is within the budget: candidates' medians are timed
  seconds apart, and one noisy median adopted a slower, less accurate variant;
- *bounded in time*: the deadline is checked before every timed run and every batch; once a
  candidate fits, the search looks ``improve_s`` longer for a more accurate one, then ends;
- *yielding to requests*: the search runs on the serving CPU, so each timed run and each
  accuracy batch waits (up to ``yield_wait_ms``) until no request is in flight, and a timed run
  beside which a request started is run again (up to ``latency_runs`` more times): its time
  measured the contention, not the candidate. Without this, the search's back-to-back runs slowed
  the requests served meanwhile (``benchmarks/serve/results/research.json`` measures both, the
  ``eager`` mode being the search without yielding). Under a load that never leaves the device
  idle, the wait bounds how long the search is held back, and the time bound still ends it.

The most accurate candidate that fits (and loses at most ``max_accuracy_drop`` of accuracy against
the start variant on the calibration set) joins the pool and the optimizer's table
(:func:`hmt.serve.deciding.research_join.adopt`), and :meth:`Research.status` says why the search
ran, when, what it evaluated and what it found.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import numpy as np

from hmt.errors import HmtError, UsageError
from hmt.runtime.blocks import NOT_EXECUTED, BlockSpace, BlockStore, ComposedRunner, Config, compose
from hmt.runtime.chain import Runner


@dataclass(frozen=True)
class ResearchSettings:
    time_bound_s: float = 10.0  # one search's wall time at most
    improve_s: float = 2.0  # once a variant fits, how much longer the search looks for a more accurate one
    patience: int = 2  # infeasible decisions in a row (active variant measured) before a search starts
    min_gap_s: float = 30.0  # after a search ends, before the next may start
    latency_runs: int = 15  # timed single-input runs per candidate
    mutations: int = 4  # candidates per step
    max_positions: int = 2  # positions one mutation changes
    # A candidate fits when its median x the serving ratio <= the compute budget; the ratio is at
    # least 1 / margin (the room left when the start variant has no measured estimate).
    margin: float = 0.8
    # A fitting candidate is taken only if its accuracy is at most this far below the start
    # variant's on the same calibration set (when blocks.json has the start's).
    max_accuracy_drop: float = 0.10
    # Each timed run and accuracy batch waits at most this long for no request in flight (0: the search
    # does not yield: no wait, and no timed run is run again).
    yield_wait_ms: float = 50.0
    accuracy_batch: int = 8  # calibration images per accuracy batch (the search yields between batches)
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.time_bound_s > 0 and self.improve_s >= 0 and self.patience >= 1 and self.min_gap_s >= 0
                and self.latency_runs >= 1 and self.mutations >= 1 and self.max_positions >= 1
                and 0 < self.margin <= 1 and self.max_accuracy_drop >= 0
                and math.isfinite(self.yield_wait_ms) and self.yield_wait_ms >= 0 and self.accuracy_batch >= 1):
            raise UsageError("research settings: time_bound_s > 0, improve_s >= 0, patience >= 1, min_gap_s >= 0, "
                             "latency_runs >= 1, mutations >= 1, max_positions >= 1, 0 < margin <= 1, "
                             "max_accuracy_drop >= 0, yield_wait_ms >= 0, accuracy_batch >= 1")


@dataclass(frozen=True)
class Measured:
    arch_id: str
    latency_ms: float  # median of the timed runs
    tail_ms: float  # their p90
    samples_ms: tuple[float, ...]
    memory_bytes: int
    fits: bool
    accuracy: float | None = None
    accuracy_source: str | None = None


@dataclass(frozen=True)
class Outcome:
    """One search: why it ran, when, its bounds, what it evaluated, what it found (``found``: None)."""

    reason: str
    start_arch_id: str
    started_s: float
    ended_s: float
    time_bound_s: float
    latency_limit_ms: float
    memory_limit_bytes: int | None
    evaluated: int
    found: Measured | None
    found_after_s: float | None
    start_accuracy: float | None
    fastest_arch_id: str | None = None  # the fastest candidate measured (how close a failed search got)
    fastest_ms: float | None = None
    # The loop's measured estimate of the start variant, its median timed by the search, and the
    # ratio candidates' medians were scaled by (see the module docstring).
    active_estimate_ms: float | None = None
    start_timed_ms: float | None = None
    serving_ratio: float | None = None
    # The confirmation (see :meth:`Research.confirm`): the found variant's median over the start's, timed
    # in turn; a variant it did not confirm is not adopted, and named here.
    confirmed_speed_ratio: float | None = None
    unconfirmed_arch_id: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.found is not None:
            data["found"]["samples_ms"] = None  # kept out of status (the tail and median say it)
        return data


_COSTS = {"skip": 0, "w25": 1, "w50": 2, "w75": 3}


def _cost(choice: str) -> int:
    return _COSTS.get(choice, 4)


class Research:
    """The trigger, the bounded search and its status (see the module docstring)."""

    def __init__(self, space: BlockSpace, store: BlockStore, calibration: tuple[np.ndarray, np.ndarray],
                 settings: ResearchSettings | None = None, *, clock: Callable[[], float] = time.monotonic,
                 on_found: Callable[[Measured, ComposedRunner], None] | None = None,
                 confidence: float | None = None, requests: Callable[[], tuple[int, int]] | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 served: Callable[[str], Runner | None] | None = None) -> None:
        self.space = space
        # The runner serving a variant now (the pool's), or None: what the serving ratio times.
        self._served = served
        # (requests in flight, requests started so far) of the serving loop: the search yields to
        # them (None: nothing to yield to, e.g. a search run on its own).
        self._requests = requests
        self._sleep = sleep
        self.yielded_s = 0.0  # time the searches waited for requests
        self.rerun = 0  # timed runs run again because a request started beside them
        # Candidates are timed as serve runs them: early exit at this confidence (None: off).
        self.confidence = confidence
        self.store = store
        self.x, self.y = calibration
        self.settings = settings if settings is not None else ResearchSettings()
        self._clock = clock
        self.on_found = on_found
        self._rng = np.random.default_rng(self.settings.seed)
        self._streak = 0
        self._last_end_s = -math.inf
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.searches = 0
        self.found_count = 0  # searches that handed a variant over (a counter: outcomes keep the last 8)
        self.outcomes: list[Outcome] = []
        self.running_since_s: float | None = None
        self.error: str | None = None

    # -- the trigger -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def offer(self, feasible: bool, measured: bool, active_arch_id: str | None, latency_limit_ms: float,
              memory_limit_bytes: int | None, reason: str, active_estimate_ms: float | None = None) -> bool:
        """One decision of the loop; starts a search (on its own thread) when nothing has fitted for
        ``patience`` decisions in a row and the active variant is measured (``active_estimate_ms``:
        its estimate, what the serving ratio is taken from). Whether it started one."""
        if feasible or not measured or active_arch_id is None or not math.isfinite(latency_limit_ms):
            self._streak = 0
            return False
        self._streak += 1
        now = self._clock()
        if self._streak < self.settings.patience or self.running or now - self._last_end_s < self.settings.min_gap_s:
            return False
        self._streak = 0
        self.running_since_s = now
        self._thread = threading.Thread(target=self._run, name="hmt-research", daemon=True,
                                        args=(active_arch_id, latency_limit_ms, memory_limit_bytes, reason,
                                              active_estimate_ms))
        self._thread.start()
        return True

    def _run(self, active: str, limit_ms: float, memory_limit: int | None, reason: str,
             active_estimate_ms: float | None) -> None:
        try:
            outcome, runner = self.search(active, limit_ms, memory_limit, reason, active_estimate_ms)
            if runner is not None and outcome.found is not None and self.on_found is not None:
                self.on_found(outcome.found, runner)
        except HmtError as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed search must not take serve down; status says why
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._last_end_s = self._clock()
            self.running_since_s = None

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    # -- the search ------------------------------------------------------------------------

    def start_config(self, arch_id: str) -> Config:
        """``arch_id`` as a config of the sub-space; a variant outside it starts from the sub-space's
        cheapest-looking variant (fewest block bytes among the shipped accuracies' variants)."""
        try:
            return self.space.parse(arch_id)
        except UsageError:
            known = [self.space.parse(a) for a in self.space.accuracy]
            if not known:
                raise
            return min(known, key=self.weight_bytes)

    def weight_bytes(self, config: Config) -> int:
        units, _, exits = self.space.units_of(config)
        return sum(self.space.units[u].size_bytes for u in {*units, *exits.values()})

    def mutate(self, config: Config, cheaper: bool = False) -> Config | None:
        """A nearby config: the exit one stage earlier (sometimes), or 1..max_positions positions changed;
        ``cheaper``: each to a cheaper choice where there is one (skip < w25 < w50 < w75 < the rest)."""
        rng, space = self._rng, self.space
        earlier = [e for e in space.exits if e < config.exit_stage]
        choices = [c if c != NOT_EXECUTED else p.choices[0] for p, c in zip(space.positions, config.choices)]
        if earlier and rng.random() < 0.25:
            return space.make(choices, max(earlier))
        movable = [i for i, p in enumerate(space.positions)
                   if p.stage <= config.exit_stage and len(p.choices) > 1]
        if not movable:
            return None
        count = int(rng.integers(1, min(self.settings.max_positions, len(movable)) + 1))
        for i in rng.choice(len(movable), size=count, replace=False):
            p = movable[int(i)]
            others = [c for c in space.positions[p].choices if c != choices[p]]
            if cheaper:
                others = [c for c in others if _cost(c) < _cost(choices[p])] or others
            choices[p] = others[int(rng.integers(len(others)))]
        try:
            mutated = space.make(choices, config.exit_stage)
        except UsageError:
            return None
        return mutated if mutated != config and space.composable(mutated) else None

    def _yield(self, deadline: float) -> int:
        """Wait until no request is in flight, at most ``yield_wait_ms`` (and not past ``deadline``);
        the count of requests started so far (a run beside which it changes overlapped one)."""
        if self._requests is None:
            return 0
        inflight, started = self._requests()
        if inflight == 0 or self.settings.yield_wait_ms <= 0:
            return started
        t0 = self._clock()
        until = min(deadline, t0 + self.settings.yield_wait_ms / 1e3)
        while inflight > 0 and self._clock() < until and not self._stop.is_set():
            self._sleep(0.0005)
            inflight, started = self._requests()
        self.yielded_s += self._clock() - t0
        return started

    def _timed(self, runner: Runner, deadline: float) -> list[float] | None:
        runner.run(self.x[:1], self.confidence)  # first call: ORT's lazy allocations
        times: list[float] = []
        reruns = 0
        while len(times) < self.settings.latency_runs:
            if self._clock() >= deadline or self._stop.is_set():
                return None
            x = self.x[len(times) % len(self.x)][None]  # real inputs: with early exit, where they leave counts
            started = self._yield(deadline)
            t0 = time.perf_counter()
            runner.run(x, self.confidence)
            elapsed_ms = (time.perf_counter() - t0) * 1e3
            overlapped = (self._requests is not None and self.settings.yield_wait_ms > 0
                          and self._requests()[1] != started)
            if overlapped and reruns < self.settings.latency_runs:
                reruns += 1  # a request started beside it: the time measured the contention; run it again
                self.rerun += 1
                continue
            times.append(elapsed_ms)
        return times

    def _accuracy(self, runner: ComposedRunner, deadline: float) -> float | None:
        correct = 0
        batch = self.settings.accuracy_batch
        for start in range(0, len(self.x), batch):
            if self._clock() >= deadline or self._stop.is_set():
                return None
            self._yield(deadline)
            results = runner.run_batch(self.x[start:start + batch], None)
            correct += sum(int(r.class_index == int(t)) for r, t in zip(results, self.y[start:start + batch]))
        return correct / len(self.x)

    @contextmanager
    def _start_runner(self, start: Config) -> Iterator[Runner | None]:
        """The runner serving ``start`` (the pool's), else a composed copy closed afterwards; None when
        neither exists."""
        served = self._served(start.arch_id) if self._served is not None else None
        if served is not None or not self.space.composable(start):
            yield served
            return
        runner = compose(self.store, start)
        try:
            yield runner
        finally:
            runner.close()

    def serving_ratio(self, start: Config, active_estimate_ms: float | None, deadline: float
                      ) -> tuple[float, float | None]:
        """(ratio, the start's timed median): the loop's measured estimate of the start variant over
        its median timed as candidates are, on the runner that served it (composed from the blocks
        when none is known), at least ``1 / margin``; ``1 / margin`` alone when there is no estimate
        or no runner of the start."""
        floor = 1.0 / self.settings.margin
        if active_estimate_ms is None or not math.isfinite(active_estimate_ms):
            return floor, None
        with self._start_runner(start) as runner:
            times = None if runner is None else self._timed(runner, deadline)
        if not times:
            return floor, None
        median = float(np.median(times))
        return max(floor, active_estimate_ms / median), median

    def confirm(self, start: Config, candidate: Runner, limit_ms: float, active_estimate_ms: float,
                deadline: float) -> tuple[bool, float | None]:
        """Whether ``candidate`` fits when timed in turn with the start variant (start, candidate,
        candidate, start: a drift of the machine's speed cancels): its median over the start's, times
        the loop's measured estimate of the start, within ``limit_ms``. The search's own judgement
        compared medians timed seconds apart, and on a busy 2-core machine a variant with a costlier
        block than the start's was once timed faster, adopted, and served 4.6 points less accurate at
        no gain in speed. (True, None) when the start cannot be timed; (False, None) past ``deadline``."""
        with self._start_runner(start) as runner:
            if runner is None:
                return True, None
            timed = [self._timed(r, deadline) for r in (runner, candidate, candidate, runner)]
        s1, c1, c2, s2 = timed
        if s1 is None or c1 is None or c2 is None or s2 is None:
            return False, None
        ratio = float(np.median(c1 + c2)) / max(float(np.median(s1 + s2)), 1e-9)
        return ratio * active_estimate_ms <= limit_ms, ratio

    def evaluate(self, config: Config, limit_ms: float, memory_limit: int | None, deadline: float,
                 ratio: float | None = None) -> tuple[Measured | None, ComposedRunner | None]:
        """Compose and time ``config``; if it fits (median x ``ratio``, default ``1 / margin``, within
        ``limit_ms``), its accuracy too. (None, None) past the deadline."""
        ratio = 1.0 / self.settings.margin if ratio is None else ratio
        runner = compose(self.store, config)
        keep = False
        try:
            times = self._timed(runner, deadline)
            if times is None:
                return None, None
            median, tail = float(np.median(times)), float(np.percentile(times, 90))
            memory = self.space.footprint_bytes(config)
            fits = median * ratio <= limit_ms and (memory_limit is None or memory <= memory_limit)
            accuracy, source = None, None
            if fits:
                accuracy = self.space.accuracy.get(config.arch_id)
                source = "blocks.json (deploy, calibration set)"
                if accuracy is None:
                    accuracy, source = self._accuracy(runner, deadline), "calibration set, on the device"
                    if accuracy is None:
                        return None, None
            keep = fits
            return Measured(config.arch_id, median, tail, tuple(times), memory, fits, accuracy, source), runner
        finally:
            if not keep:
                runner.close()

    def search(self, active: str, limit_ms: float, memory_limit: int | None, reason: str = "",
               active_estimate_ms: float | None = None) -> tuple[Outcome, ComposedRunner | None]:
        """One bounded search from ``active`` (synchronous; :meth:`offer` runs it on a thread)."""
        s = self.settings
        started = self._clock()
        deadline = started + s.time_bound_s
        self.searches += 1
        start = self.start_config(active)
        ratio, start_ms = self.serving_ratio(start, active_estimate_ms if start.arch_id == active else None,
                                             deadline)
        seen = {start.arch_id}
        best: Measured | None = None
        best_runner: ComposedRunner | None = None
        best_config: Config | None = None
        found_at: float | None = None
        fastest: tuple[float, Config] = (math.inf, start)
        start_accuracy = self.space.accuracy.get(start.arch_id)
        floor = None if start_accuracy is None else start_accuracy - s.max_accuracy_drop
        evaluated = 0
        failures = 0
        while self._clock() < deadline and not self._stop.is_set() and failures < 50:
            anchor = best_config if best_config is not None else fastest[1]
            batch = [m for m in (self.mutate(anchor, cheaper=best is None) for _ in range(4 * s.mutations))
                     if m is not None]
            fresh = list({c.arch_id: c for c in batch if c.arch_id not in seen}.values())
            if not fresh:
                failures += 1
                continue
            if best is None:  # nothing fits yet: the lightest first
                fresh.sort(key=self.weight_bytes)
            for config in fresh[:s.mutations]:
                if self._clock() >= deadline:
                    break
                seen.add(config.arch_id)
                measured, runner = self.evaluate(config, limit_ms, memory_limit, deadline, ratio)
                if measured is None:
                    break
                evaluated += 1
                if measured.latency_ms < fastest[0]:
                    fastest = (measured.latency_ms, config)
                if not measured.fits or runner is None:
                    continue
                if measured.arch_id in self.space.accuracy:
                    # A bundled variant: the loop has it and judges it on its own requests; a path
                    # through it, not a find (adopt would add nothing, and status named it found).
                    runner.close()
                    continue
                assert measured.accuracy is not None
                if floor is not None and measured.accuracy < floor:
                    runner.close()
                    continue
                if best is None or (measured.accuracy, -measured.latency_ms) > (best.accuracy or 0.0,
                                                                                -best.latency_ms):
                    if best_runner is not None:
                        best_runner.close()
                    if best is None:  # the first fit: a little longer for a better one, then hand it over
                        deadline = min(deadline, self._clock() + s.improve_s)
                    best, best_runner, best_config, found_at = measured, runner, config, self._clock()
                else:
                    runner.close()
        confirmed_ratio, unconfirmed = None, None
        if best_runner is not None and best is not None and start_ms is not None and active_estimate_ms is not None:
            ok, confirmed_ratio = self.confirm(start, best_runner, limit_ms, active_estimate_ms,
                                               started + s.time_bound_s)
            if not ok:
                best_runner.close()
                unconfirmed, best, best_runner, found_at = best.arch_id, None, None, None
        ended = self._clock()
        outcome = Outcome(reason=reason, start_arch_id=active, started_s=started, ended_s=ended,
                          time_bound_s=s.time_bound_s, latency_limit_ms=limit_ms, memory_limit_bytes=memory_limit,
                          evaluated=evaluated, found=best,
                          found_after_s=None if found_at is None else found_at - started,
                          start_accuracy=self.space.accuracy.get(active),
                          fastest_arch_id=None if evaluated == 0 else fastest[1].arch_id,
                          fastest_ms=None if evaluated == 0 else fastest[0],
                          active_estimate_ms=active_estimate_ms, start_timed_ms=start_ms, serving_ratio=ratio,
                          confirmed_speed_ratio=confirmed_ratio, unconfirmed_arch_id=unconfirmed)
        self.outcomes = [*self.outcomes[-7:], outcome]
        self.found_count += best is not None
        return outcome, best_runner

    def status(self, now_s: Callable[[float], float] = lambda t: t) -> dict[str, Any]:
        """What ``/v1/status`` shows (key ``research``); ``now_s`` maps this clock to the controller's time."""
        last = self.outcomes[-1] if self.outcomes else None
        data = last.to_json_dict() if last is not None else None
        if data is not None:
            data["started_s"], data["ended_s"] = now_s(last.started_s), now_s(last.ended_s)  # type: ignore[union-attr]
        return {"searches": self.searches, "found_count": self.found_count, "running": self.running,
                "error": self.error,
                "settings": asdict(self.settings), "last": data,
                "yielded_s": round(self.yielded_s, 3), "timed_runs_rerun": self.rerun,
                "found": [o.found.arch_id for o in self.outcomes if o.found is not None]}
