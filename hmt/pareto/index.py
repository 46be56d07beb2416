"""The runtime index over a front: range queries and "best accuracy within budgets".

Serve loads this on the device, so it imports nothing but the standard library and
numpy (no torch, no pandas). The file is plain JSON (``index.json``): the entries and
their units. The search structures are rebuilt at load, so a file cannot carry a stale
or tampered structure that disagrees with its entries.

Entries are kept in *rank* order: by accuracy (highest first), then latency, energy,
memory and arch id (lowest first). "The best entry within budgets" is therefore the
entry of lowest rank that meets them, and every structure below stores ranks.

Cost of a query over ``n`` entries:

- ``within(metric, lo, hi)``: two bisections on that metric's sorted values,
  O(log n + k) for k results;
- ``best_within`` with one budget: a bisection and a prefix-minimum table, O(log n);
- with two budgets: a persistent segment tree per pair of metrics (versions along the
  first metric's order, leaves along the second's), O(log n); built on first use,
  O(n log n) nodes;
- with three budgets: the pair tree's answer when it also meets the third budget
  (the usual case, since costs are correlated), O(log n); otherwise the largest of the
  three pair answers (each a lower bound) if it meets all three, else a vectorised scan
  of the entries in rank order from that bound, O(n) in the worst case.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hmt.artifacts.jsondoc import parse_json
from hmt.errors import InputError, UsageError

INDEX_SCHEMA = "hmt.pareto-index"
INDEX_SCHEMA_VERSION = 1
METRICS: tuple[str, ...] = ("latency_ms", "energy", "memory_mb")


@dataclass(frozen=True)
class IndexEntry:
    """One variant of the front as serve sees it."""

    arch_id: str
    accuracy: float
    latency_ms: float
    energy: float
    memory_mb: float
    exit_stage: int
    accuracy_per_exit: tuple[float, ...]
    engine: str = "default"

    def metric(self, name: str) -> float:
        return float(getattr(self, name))

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "arch_id": self.arch_id,
            "accuracy": self.accuracy,
            "latency_ms": self.latency_ms,
            "energy": self.energy,
            "memory_mb": self.memory_mb,
            "exit_stage": self.exit_stage,
            "accuracy_per_exit": list(self.accuracy_per_exit),
            "engine": self.engine,
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> IndexEntry:
        try:
            return cls(
                arch_id=str(data["arch_id"]),
                accuracy=float(data["accuracy"]),
                latency_ms=float(data["latency_ms"]),
                energy=float(data["energy"]),
                memory_mb=float(data["memory_mb"]),
                exit_stage=int(data["exit_stage"]),
                accuracy_per_exit=tuple(float(v) for v in data.get("accuracy_per_exit", ())),
                engine=str(data.get("engine", "default")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"malformed index entry ({exc!r})") from exc


def _rank_key(entry: IndexEntry) -> tuple[float, float, float, float, str]:
    return (-entry.accuracy, entry.latency_ms, entry.energy, entry.memory_mb, entry.arch_id)


class _PairTree:
    """Persistent segment tree: min rank over entries with a <= A and b <= B.

    Version k holds the first k entries in ascending-a order, each at its leaf in
    ascending-b order. Node 0 is the shared empty node. Python lists, not numpy arrays:
    a query walks ~log2(n) nodes and list indexing is several times faster.
    """

    def __init__(self, a_order: Sequence[int], b_position: Sequence[int], n: int) -> None:
        self.n = n
        inf = n
        left, right, best = [0], [0], [inf]
        roots = [0]
        root = 0
        for rank in a_order:
            pos = b_position[rank]
            # Path copy from the root down to leaf ``pos``.
            path: list[tuple[int, bool]] = []
            node, lo, hi = root, 0, n
            while hi - lo > 1:
                mid = (lo + hi) // 2
                go_right = pos >= mid
                path.append((node, go_right))
                node = right[node] if go_right else left[node]
                lo, hi = (mid, hi) if go_right else (lo, mid)
            # New leaf.
            left.append(0)
            right.append(0)
            best.append(min(best[node], rank))
            child = len(best) - 1
            for old, went_right in reversed(path):
                if went_right:
                    l_child, r_child = left[old], child
                else:
                    l_child, r_child = child, right[old]
                left.append(l_child)
                right.append(r_child)
                best.append(min(best[l_child], best[r_child]))
                child = len(best) - 1
            root = child
            roots.append(root)
        self.left, self.right, self.best, self.roots = left, right, best, roots

    def query(self, k: int, r: int) -> int:
        """Min rank among the first k entries (a order) whose b position is < r; n if none."""
        node, lo, hi = self.roots[k], 0, self.n
        left, right, best = self.left, self.right, self.best
        result = self.n
        while node and r > lo:
            if r >= hi:
                return min(result, best[node])
            mid = (lo + hi) // 2
            if r > mid:
                result = min(result, best[left[node]])
                node, lo = right[node], mid
            else:
                node, hi = left[node], mid
        return result


class FrontIndex:
    """Queries over a front's entries; see the module docstring for their cost."""

    def __init__(self, entries: Sequence[IndexEntry], *, units: Mapping[str, str] | None = None,
                 meta: Mapping[str, Any] | None = None) -> None:
        for entry in entries:
            values = (entry.accuracy, entry.latency_ms, entry.energy, entry.memory_mb)
            if not all(math.isfinite(v) for v in values):
                raise InputError(f"index entry {entry.arch_id}: metrics must be finite, got {values}")
        self.entries: tuple[IndexEntry, ...] = tuple(sorted(entries, key=_rank_key))
        self.units = dict(units or {"accuracy": "fraction", "latency_ms": "ms", "energy": "mJ", "memory_mb": "MB"})
        self.meta = dict(meta or {})
        n = len(self.entries)
        self._n = n
        self._values: dict[str, np.ndarray] = {
            m: np.array([e.metric(m) for e in self.entries], dtype=np.float64) for m in METRICS
        }
        # Per metric: ranks in ascending-metric order (stable, so ties keep rank order),
        # their sorted values as a list for bisect, each rank's position, prefix minima.
        self._order: dict[str, list[int]] = {}
        self._sorted: dict[str, list[float]] = {}
        self._position: dict[str, list[int]] = {}
        self._prefix_best: dict[str, list[int]] = {}
        for m in METRICS:
            order = np.argsort(self._values[m], kind="stable")
            self._order[m] = order.tolist()
            self._sorted[m] = self._values[m][order].tolist()
            position = np.empty(n, dtype=np.int64)
            position[order] = np.arange(n)
            self._position[m] = position.tolist()
            prefix = np.minimum.accumulate(order) if n else order
            self._prefix_best[m] = [n, *prefix.tolist()]
        self._pairs: dict[tuple[str, str], _PairTree] = {}

    def __len__(self) -> int:
        return self._n

    # -- queries -------------------------------------------------------------------------

    def within(self, metric: str, lo: float = -math.inf, hi: float = math.inf) -> list[IndexEntry]:
        """Entries with ``lo <= metric <= hi``, in ascending order of that metric."""
        self._check_metric(metric)
        values = self._sorted[metric]
        start, stop = bisect_left(values, lo), bisect_right(values, hi)
        order = self._order[metric]
        return [self.entries[order[i]] for i in range(start, stop)]

    def best_within_rank(self, *, latency_ms: float | None = None, energy: float | None = None,
                         memory_mb: float | None = None) -> int | None:
        """Rank (position in ``entries``) of the most accurate entry within every budget
        given (``None``: no budget on that metric); ``None`` when no entry meets them."""
        budgets = [(m, b) for m, b in (("latency_ms", latency_ms), ("energy", energy), ("memory_mb", memory_mb))
                   if b is not None]
        n = self._n
        if not budgets:
            return 0 if n else None
        if len(budgets) == 1:
            m, b = budgets[0]
            rank = self._prefix_best[m][bisect_right(self._sorted[m], b)]
            return rank if rank < n else None
        (a, a_budget), (b_name, b_budget) = budgets[0], budgets[1]
        tree = self._pair(a, b_name)
        rank = tree.query(bisect_right(self._sorted[a], a_budget), bisect_right(self._sorted[b_name], b_budget))
        if rank >= n:
            return None
        if len(budgets) == 2:
            return rank
        c, c_budget = budgets[2]
        if self.entries[rank].metric(c) <= c_budget:
            return rank
        # Each pair's answer is a lower bound on the rank of the answer; try the largest,
        # then scan from it.
        ks = {m: bisect_right(self._sorted[m], v) for m, v in budgets}
        for x, y in ((a, c), (b_name, c)):
            rank = max(rank, self._pair(x, y).query(ks[x], ks[y]))
        if rank >= n:
            return None
        entry = self.entries[rank]
        if entry.metric(a) <= a_budget and entry.metric(b_name) <= b_budget and entry.metric(c) <= c_budget:
            return rank
        ok = ((self._values[a][rank:] <= a_budget) & (self._values[b_name][rank:] <= b_budget)
              & (self._values[c][rank:] <= c_budget))
        hits = np.flatnonzero(ok)
        return rank + int(hits[0]) if hits.size else None

    def best_within(self, *, latency_ms: float | None = None, energy: float | None = None,
                    memory_mb: float | None = None) -> IndexEntry | None:
        """The most accurate entry within every budget given, or ``None``."""
        rank = self.best_within_rank(latency_ms=latency_ms, energy=energy, memory_mb=memory_mb)
        return None if rank is None else self.entries[rank]

    def _pair(self, a: str, b: str) -> _PairTree:
        tree = self._pairs.get((a, b))
        if tree is None:
            tree = _PairTree(self._order[a], self._position[b], self._n)
            self._pairs[(a, b)] = tree
        return tree

    def prepare(self) -> None:
        """Build every pair tree now (serve calls it at start so no query pays for it)."""
        for i, a in enumerate(METRICS):
            for b in METRICS[i + 1:]:
                self._pair(a, b)

    @staticmethod
    def _check_metric(metric: str) -> None:
        if metric not in METRICS:
            raise UsageError(f"unknown metric {metric!r}; the index has {', '.join(METRICS)}")

    # -- (de)serialise -------------------------------------------------------------------

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "schema": INDEX_SCHEMA,
            "schema_version": INDEX_SCHEMA_VERSION,
            "units": self.units,
            "meta": self.meta,
            "entries": [e.to_json_dict() for e in self.entries],
        }

    @classmethod
    def from_json_dict(cls, doc: Any, *, source: str = "index") -> FrontIndex:
        if not isinstance(doc, dict) or doc.get("schema") != INDEX_SCHEMA:
            raise InputError(f"{source}: not an hmt pareto index (schema {INDEX_SCHEMA!r} expected)")
        if doc.get("schema_version") != INDEX_SCHEMA_VERSION:
            raise InputError(f"{source}: index schema_version {doc.get('schema_version')!r}; "
                              f"this hmt reads {INDEX_SCHEMA_VERSION}")
        entries = doc.get("entries")
        if not isinstance(entries, list):
            raise InputError(f"{source}: 'entries' must be a list")
        return cls([IndexEntry.from_json_dict(e) for e in entries], units=doc.get("units"), meta=doc.get("meta"))


def load_index(path: Path | str) -> FrontIndex:
    """Read ``index.json`` (a file, or a pareto artifact directory holding one).

    Reads the file only: checksums are the artifact loader's job (``hmt.pareto.load_front``)
    or the bundle's; this function must stay importable without torch.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "index.json"
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise InputError(f"{path}: does not exist; expected a runtime index file") from exc
    doc = parse_json(raw, path, error=InputError)
    return FrontIndex.from_json_dict(doc, source=str(path))
