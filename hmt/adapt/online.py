"""The hook for ``hmt serve --adapt``: BN re-estimation on live inputs, guarded, reset on drift's end.

No torch, no onnx: numpy and ONNX Runtime, like serve. Serve hands every request's input
batch to ``OnlineBnAdapter.observe``; the adapter watches input statistics
(``DriftMonitor``), and while they drift it re-estimates the BN statistics of the variant
on the drifted inputs. Once ``adapt_after`` drifted inputs have been seen it builds the
adapted variant and asks the guard (entropy on the recent inputs must fall; a labelled
canary set, if given, must not get worse); if accepted, ``active`` becomes the adapted
chain, and serve runs requests through it. When the drift passes, the statistics are
forgotten and ``active`` goes back to None (serve the bundled variant). While drifting it
keeps re-estimating, and swaps in a fresher adapted chain every ``refresh_every`` inputs.

Serve (``hmt.serve.running.adapt``) keeps one drift monitor for the input stream and one adapter
for the variant serving: it passes the monitor in (``monitor=``), updates it itself, and
hands each batch with the monitor's event to :meth:`OnlineBnAdapter.apply`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hmt.adapt.bn_runtime import AdaptedChain, BnReestimator, BnSource
from hmt.adapt.drift import DriftEvent, DriftMonitor, DriftReference
from hmt.adapt.guard import GuardDecision, GuardPolicy, decide
from hmt.errors import ArtifactError, UsageError


@dataclass(frozen=True)
class AdaptEvent:
    kind: str  # "drift-start" | "adapted" | "refused" | "reset"
    seen: int
    detail: str
    decision: GuardDecision | None = None


class OnlineBnAdapter:
    def __init__(self, bn_path: Path | str | BnSource, *, reference: DriftReference | None = None,
                 window: int = 256, enter: float = 0.5, leave: float = 0.35, adapt_after: int = 256,
                 refresh_every: int = 1024, min_batch: int = 32, guard: GuardPolicy = GuardPolicy(),
                 canary: tuple[np.ndarray, np.ndarray] | None = None, threads: int = 1,
                 monitor: DriftMonitor | None = None) -> None:
        self.reestimator = BnReestimator(bn_path, threads=threads)
        if min_batch < 2 or adapt_after < min_batch:
            raise UsageError(f"need 2 <= min_batch <= adapt_after, got {min_batch}, {adapt_after}")
        if monitor is None:
            if reference is None:
                reference = drift_reference_of(self.reestimator.spec, str(bn_path))
            monitor = DriftMonitor(reference, window=window, enter=enter, leave=leave)
        self.monitor = monitor
        self.adapt_after = adapt_after
        self.refresh_every = refresh_every
        self.min_batch = min_batch
        self.guard = guard
        self.canary = canary
        self.active: AdaptedChain | None = None
        self._pending: list[np.ndarray] = []
        self._recent: list[np.ndarray] = []
        self._drifted_seen = 0
        self._next_build = adapt_after

    def _flush(self) -> None:
        batch = np.concatenate(self._pending)
        self._pending = []
        self.reestimator.observe(batch)
        self._recent = [*self._recent, batch][-8:]  # the guard's recent inputs (a few batches)

    def _build(self) -> AdaptEvent:
        candidate = self.reestimator.adapted()
        shipped = self.reestimator.shipped()
        recent = np.concatenate(self._recent)
        canary = {}
        if self.canary is not None:
            cx, cy = self.canary
            canary = {"canary_logits_before": shipped.run(cx)[-1], "canary_logits_after": candidate.run(cx)[-1],
                      "canary_labels": cy}
        decision = decide(recent_logits_before=shipped.run(recent)[-1], recent_logits_after=candidate.run(recent)[-1],
                          policy=self.guard, **canary)
        if decision.accepted:
            self.active = candidate
            return AdaptEvent("adapted", self.monitor.seen, decision.reason, decision)
        return AdaptEvent("refused", self.monitor.seen, decision.reason, decision)

    def reset(self) -> None:
        """Back to the shipped statistics: forget every drifted input."""
        self.reestimator.reset()
        self.active = None
        self._pending, self._recent = [], []
        self._drifted_seen = 0
        self._next_build = self.adapt_after

    def observe(self, x: np.ndarray) -> list[AdaptEvent]:
        """One batch of model inputs (as the model takes them); returns what changed."""
        return self.apply(x, self.monitor.update(x))

    def apply(self, x: np.ndarray, change: DriftEvent | None) -> list[AdaptEvent]:
        """``x`` after the monitor has seen it (``change``: what its update returned)."""
        events: list[AdaptEvent] = []
        if change is not None and change.kind == "drift-end":
            self.reset()
            return [AdaptEvent("reset", change.seen, f"drift passed (score {change.score:.2f})")]
        if change is not None:
            events.append(AdaptEvent("drift-start", change.seen,
                                     f"input statistics drifted (score {change.score:.2f})"))
        if not self.monitor.drifting:
            return events
        self._pending.append(np.asarray(x, dtype=np.float32))
        self._drifted_seen += x.shape[0]
        if sum(len(p) for p in self._pending) >= self.min_batch:
            self._flush()
        if self._drifted_seen >= self._next_build and self.reestimator.batches:
            events.append(self._build())
            self._next_build = self._drifted_seen + self.refresh_every
        return events


def drift_reference_of(spec: dict[str, object], where: str) -> DriftReference:
    """The drift reference ``bn.json`` carries (input statistics of the source data)."""
    data = spec.get("drift_reference")
    if not isinstance(data, dict):
        raise ArtifactError(f"{where}: has no drift reference; pass one (DriftReference.from_inputs on source "
                            "inputs)")
    try:
        return DriftReference.from_json_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{where}: malformed drift_reference ({exc})") from exc
