"""One decision over every gene: variant (and its precision), offload cut, codec and the adapted copy.

A *candidate* is one way to answer a request: a bundled variant (an int8 or fp16 copy is a
variant of its own, so precision is part of this gene), run all on the device or cut for the
peer at one of its cuts with the tensor sent in one codec, and, for a variant that serve
``--adapt`` adapted, its BN-adapted copy (device only: the peer holds the shipped tails).
The offload device supplies the cut costs and the peer's conditions
(:class:`RouteProvider`); it no longer decides. Every candidate is costed the same way:

- latency: all local, the variant's estimate (measured first, load-scaled: what the
  local-only loop uses); cut ``c`` in codec ``k``::

      (T_head(c) + T_codec(k)) * r + T_exchange + f_remote * (rtt + bytes(c, k) * ms_per_byte
                                                             + T_tail(c) * r_peer + queue_peer)

  with ``r`` the larger of the device's measured slowdown and the variant's estimate over its
  warm local time (so the load index and the measured-first estimates scale the head too),
  and the link terms measured (:mod:`hmt.offload.link`);
- memory: what the device holds for the candidate: the whole variant (the tail stays loaded
  as the fallback that answers when the peer fails) plus the adapted graphs for the adapted
  copy;
- energy: the device's share of the variant's energy (head over local compute) plus the radio
  per KiB sent, scaled by the load model and the latency ratio like the local loop's.

Feasible: within the latency, memory and energy budgets (and the peer usable for a cut). Eq. 3
(``mu*Norm(A) - (1-mu)*Norm(E)``) ranks the feasible candidates; equal scores go to the
fastest. Nothing feasible: the fastest candidate within memory (a bigger local variant only on
evidence at least as new, :meth:`JointPath._newer`), else the least memory.

The two timed stages keep the local loop's split (:mod:`hmt.serve.deciding.decision`):
:meth:`JointPath.feasible` (the estimate stage) costs every candidate and reduces the result to
(feasible bits, fallback, latency order id); :meth:`JointPath.choose` (the decision stage) is
cached on that triple with mu and the active/home variants. The variant of the chosen candidate
goes to the switcher (hysteresis, loading); the route of whichever variant stays active is its
best candidate from the same pass (:meth:`JointPath.route_of`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from hmt.runtime.settings import Budgets
from hmt.serve.deciding.optimizer import REASON_BEST, REASON_MEASURED_FASTEST, REASON_SMALLEST, Choice, Optimizer

LOCAL = "local"
NO_CODEC = "-"
# An adopted BN-adapted copy scores a little above its variant (the guard adopted it because it did
# better on the drifted inputs), never above a variant of higher accuracy; within its own variant it is
# the route whenever it is feasible (JointPath._choose).
ADAPTED_BONUS = 1e-3
_CACHE_MAX_ENTRIES = 4096
_EPS = 1e-9


@dataclass(frozen=True)
class CutRoute:
    """One cut of a variant in one codec, as the device measured it (warm, unloaded)."""

    cut: int
    codec: str
    device_ms: float  # the head on the device (the segments before the cut)
    codec_ms: float  # encode + decode of the cut tensor in this codec on the device
    peer_ms: float  # the tail on the peer, as it reports it (until then: as the device runs it)
    size_bytes: int  # on the wire


@dataclass(frozen=True)
class VariantRoutes:
    """What the device knows of running one variant: its warm local time and its cuts."""

    local_ms: float
    cuts: tuple[CutRoute, ...] = ()


@dataclass(frozen=True)
class RouteConditions:
    """The peer and the device now. ``rtt_ms=None``: no peer usable (breaker open, or none)."""

    rtt_ms: float | None = None
    ms_per_byte: float = 0.0
    device_ratio: float = 1.0
    peer_ratio: float = 1.0
    peer_queue_ms: float = 0.0
    exchange_ms: float = 0.0
    remote_factor: float = 1.0
    radio_mj_per_kb: float = 0.0


@dataclass(frozen=True)
class Candidate:
    position: int  # the variant's place in the optimizer's table
    arch_id: str
    precision: str
    cut: int | None  # None: all on the device
    codec: str
    adapted: bool
    memory_bytes: int
    energy_mj: float  # on the device per inference, unloaded (profile energy x device share + radio)
    device_share: float  # of the compute, 1 for local
    route: CutRoute | None = None

    @property
    def label(self) -> str:
        where = LOCAL if self.cut is None else f"cut{self.cut}/{self.codec}"
        return f"{self.arch_id}@{where}{'+adapted' if self.adapted else ''}"


class RouteProvider:
    """What the joint decision asks of the offload device (duck-typed; this is the interface)."""

    def route_costs(self) -> tuple[int, dict[str, VariantRoutes]]:  # pragma: no cover - interface
        """(version, variant -> routes); a new version when the costs changed (the peer's tails)."""
        raise NotImplementedError

    def route_conditions(self) -> RouteConditions:  # pragma: no cover - interface
        raise NotImplementedError


def _norm(values: Sequence[float], log: bool) -> list[float]:
    v = [math.log(max(x, 1e-12)) if log else x for x in values]
    low, high = min(v), max(v)
    span = high - low
    return [0.0 if span <= 0 else (x - low) / span for x in v]


class JointPath:
    """Feasible candidates -> cached choice over every gene (see the module docstring)."""

    def __init__(self, optimizer: Optimizer, provider: Any | None, *, adapt_bytes: dict[str, int] | None = None,
                 precisions: dict[str, str] | None = None, fixed_variant: str | None = None,
                 score_margin: float = 0.0) -> None:
        self.optimizer = optimizer
        self.provider = provider
        self.precisions = dict(precisions or {})  # variant -> fp32 / fp16 / int8 (the bundle's record)
        self.adapt_bytes = dict(adapt_bytes or {})  # adaptable variant -> bytes its adapted copy adds
        self.fixed_variant = fixed_variant
        self.score_margin = score_margin
        self.enabled = True  # False: every choice recomputed
        self.hits = 0
        self._version: int | None = None
        self.candidates: list[Candidate] = []
        self._choices: dict[tuple[Any, ...], tuple[Choice, tuple[int, ...]]] = {}
        self._scores: dict[float, list[float]] = {}
        self._order_ids: dict[tuple[int, ...], int] = {}
        self._orders: list[tuple[int, ...]] = []
        # The last costing (estimate stage), per candidate: predicted ms, remote ms, energy, feasible.
        self.latency_ms: list[float] = []
        self.remote_ms: list[float] = []
        self.energy: list[float] = []
        self.feasible_bits = 0
        self._routes: tuple[int, ...] = ()
        self._build({})

    # -- the candidate table -----------------------------------------------------------------

    def _build(self, routes: dict[str, VariantRoutes]) -> None:
        opt = self.optimizer
        out: list[Candidate] = []
        for pos, v in enumerate(opt.variants):
            if self.fixed_variant is not None and v.arch_id != self.fixed_variant:
                continue
            precision = self.precisions.get(v.arch_id, "fp32")
            extra = self.adapt_bytes.get(v.arch_id)
            out.append(Candidate(pos, v.arch_id, precision, None, NO_CODEC, False, v.memory_bytes, v.energy_mj, 1.0))
            if extra is not None:
                out.append(Candidate(pos, v.arch_id, precision, None, NO_CODEC, True, v.memory_bytes + extra,
                                     v.energy_mj, 1.0))
            known = routes.get(v.arch_id)
            if known is None:
                continue
            for r in known.cuts:
                share = min(1.0, r.device_ms / known.local_ms) if known.local_ms > 0 else 0.0
                out.append(Candidate(pos, v.arch_id, precision, r.cut, r.codec, False, v.memory_bytes,
                                     v.energy_mj * share, share, r))
        self.candidates = out
        self._local_ms = [routes[c.arch_id].local_ms if c.arch_id in routes else 0.0 for c in out]
        self._energy_norm = _norm([c.energy_mj for c in out] or [0.0], opt.config.norm == "log")
        self._choices.clear()
        self._scores.clear()
        self._order_ids.clear()
        self._orders.clear()
        self._routes = tuple(-1 for _ in opt.variants)

    def scores(self, mu: float) -> list[float]:
        cached = self._scores.get(mu)
        if cached is None:
            opt = self.optimizer
            acc = opt._acc_list
            weight = opt.config.energy_weight
            if len(self._scores) >= _CACHE_MAX_ENTRIES:
                self._scores.clear()
            cached = self._scores[mu] = [
                mu * (acc[c.position] + (ADAPTED_BONUS if c.adapted else 0.0)) - (1.0 - mu) * weight * e
                for c, e in zip(self.candidates, self._energy_norm)]
        return cached

    # -- the estimate stage ------------------------------------------------------------------

    def feasible(self, latencies: Sequence[float], ratios: Sequence[float], load_next: float,
                 latency_limit_ms: float, budgets: Budgets, adopted: str | None = None,
                 newest_s: Sequence[float] | None = None) -> tuple[int, int, int]:
        """Cost every candidate under the estimates and the provider's conditions: (feasible bits,
        fallback candidate (``-1 - i``: least memory, nothing fits memory), latency order id).
        ``newest_s`` (each variant's newest sample): among local candidates, a bigger variant is the
        fallback over a smaller one only on evidence at least as new (as :meth:`Optimizer.fallback`);
        an offloaded route competes on its cost alone."""
        provider = self.provider
        cond = RouteConditions()
        if provider is not None:
            version, routes = provider.route_costs()
            if version != self._version:
                self._build(routes)
                self._version = version
            cond = provider.route_conditions()
        energy_scale = 1.0 + self.optimizer.alpha_energy * load_next
        memory_limit = budgets.memory_bytes
        energy_limit = budgets.energy
        rtt_ms = cond.rtt_ms
        lat: list[float] = []
        remote_list: list[float] = []
        energy: list[float] = []
        bits = 0
        fastest, fastest_ms = -1, math.inf
        least, least_bytes = 0, math.inf
        for i, c in enumerate(self.candidates):
            p = c.position
            est = latencies[p]
            r = c.route
            remote = 0.0
            if c.adapted and c.arch_id != adopted:
                t = math.inf  # no adapted copy of this variant now
                e = math.inf
            elif r is None:
                t = est
                e = c.energy_mj * energy_scale * ratios[p]
            elif rtt_ms is None:
                t = math.inf
                e = math.inf
            else:
                local_ms = self._local_ms[i]
                slow = max(cond.device_ratio, est / local_ms if local_ms > 0 else 1.0)
                remote = rtt_ms + r.size_bytes * cond.ms_per_byte + r.peer_ms * cond.peer_ratio + cond.peer_queue_ms
                t = (r.device_ms + r.codec_ms) * slow + cond.exchange_ms + remote * max(1.0, cond.remote_factor)
                e = c.energy_mj * energy_scale * ratios[p] + cond.radio_mj_per_kb * r.size_bytes / 1024.0
            lat.append(t)
            remote_list.append(remote)
            energy.append(e)
            if c.memory_bytes < least_bytes and t < math.inf:
                least, least_bytes = i, c.memory_bytes
            if memory_limit is not None and c.memory_bytes > memory_limit:
                continue
            if t < fastest_ms and (newest_s is None or fastest < 0 or self._newer(c, self.candidates[fastest],
                                                                                  newest_s)):
                fastest, fastest_ms = i, t
            if t <= latency_limit_ms and (energy_limit is None or e <= energy_limit):
                bits |= 1 << i
        order = tuple(sorted((i for i in range(len(lat)) if lat[i] < math.inf), key=lat.__getitem__))
        oid = self._order_ids.get(order)
        if oid is None:
            if len(self._orders) >= _CACHE_MAX_ENTRIES:
                self._order_ids.clear()
                self._orders.clear()
                self._choices.clear()
            oid = self._order_ids[order] = len(self._orders)
            self._orders.append(order)
        self.latency_ms, self.remote_ms, self.energy, self.feasible_bits = lat, remote_list, energy, bits
        return bits, (fastest if fastest >= 0 else -1 - least), oid

    @staticmethod
    def _newer(c: Candidate, best: Candidate, newest_s: Sequence[float]) -> bool:
        """Whether ``c``, costed lower than ``best``, may replace it as the fallback: always for a
        route or the same variant; for a bigger local variant only on evidence at least as new."""
        if c.route is not None or best.route is not None or c.position <= best.position:
            return True
        return newest_s[c.position] >= newest_s[best.position]

    # -- the decision stage ------------------------------------------------------------------

    def choose(self, mask: tuple[int, int, int], mu: float, active: str | None,
               home: str | None = None) -> Choice:
        """Eq. 3 over the feasible candidates (ties: the fastest); a :class:`Choice` of the variant
        for the switcher, scoring the active variant by its best candidate. Cached per (mask, mu,
        active, home)."""
        key = (mask, mu, active, home)
        hit = self._choices.get(key) if self.enabled else None
        if hit is not None:
            self.hits += 1
            self._routes = hit[1]
            return hit[0]
        choice, routes = self._choose(mask, mu, active, home)
        if len(self._choices) >= _CACHE_MAX_ENTRIES:
            self._choices.clear()
        self._choices[key] = (choice, routes)
        self._routes = routes
        return choice

    def _choose(self, mask: tuple[int, int, int], mu: float, active: str | None,
                home: str | None) -> tuple[Choice, tuple[int, ...]]:
        bits, fallback, oid = mask
        order = self._orders[oid]
        scores = self.scores(mu)
        cands = self.candidates
        n = len(self.optimizer.variants)
        best_of = [-1] * n  # per variant: its best feasible candidate (ties: the fastest)
        fastest_of = [-1] * n  # per variant: its fastest available candidate
        adapted_of = [-1] * n  # per variant: its adopted adapted copy, when feasible
        best = -1
        for i in order:  # fastest first: a later one replaces only on a strictly better score
            p = cands[i].position
            if fastest_of[p] < 0:
                fastest_of[p] = i
            if bits >> i & 1:
                if cands[i].adapted:
                    adapted_of[p] = i
                if best_of[p] < 0 or scores[i] > scores[best_of[p]] + _EPS:
                    best_of[p] = i
                if best < 0 or scores[i] > scores[best] + _EPS:
                    best = i
        if best >= 0:
            reason = REASON_BEST
        elif fallback >= 0:
            best, reason = fallback, REASON_MEASURED_FASTEST
        else:
            best, reason = -1 - fallback, REASON_SMALLEST
        ids = self.optimizer._ids
        if home is not None and home != active and reason == REASON_BEST:
            h = best_of[self.optimizer.position(home)]
            if h >= 0 and cands[best].arch_id != home and scores[best] < scores[h] + self.score_margin:
                best = h
        # Within a variant the adopted adapted copy runs whenever it is feasible: the guard adopted it for
        # doing better on the inputs of now, which no profiled accuracy or energy figure knows.
        routes = tuple(a if a >= 0 else b if b >= 0 else f for a, b, f in zip(adapted_of, best_of, fastest_of))
        if reason == REASON_BEST and adapted_of[cands[best].position] >= 0:
            best = adapted_of[cands[best].position]
        chosen = cands[best]
        routes = (*routes[:chosen.position], best, *routes[chosen.position + 1:])
        if active is None:
            return Choice(chosen.arch_id, chosen.position, reason, scores[best], None, None, None), routes
        a = self.optimizer.position(active)
        current = routes[a]
        return (Choice(chosen.arch_id, chosen.position, reason, scores[best], ids[a],
                       scores[current] if current >= 0 else -math.inf, bool(current >= 0 and bits >> current & 1)),
                routes)

    def route_index(self, arch_id: str) -> int:
        """The candidate (its index) the last choice runs ``arch_id`` as; -1: none, run it all locally."""
        pos = self.optimizer._position.get(arch_id)
        return -1 if pos is None or pos >= len(self._routes) else self._routes[pos]

    def route_of(self, arch_id: str) -> tuple[Candidate, float, float, float] | None:
        """The route the last choice runs ``arch_id`` as: (candidate, predicted ms, remote ms, energy);
        None: none, run it all locally."""
        i = self.route_index(arch_id)
        if i < 0:
            return None
        return self.candidates[i], self.latency_ms[i], self.remote_ms[i], self.energy[i]
