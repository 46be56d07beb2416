"""Accuracy of candidate variants on held-out data, with prefix reuse (AdaptiveNet 5.2).

A variant's accuracy is that of its materialised module with its own batch-norm
statistics re-estimated on the supernet's stored calibration set (``hmt.supernet.
calibrate``; the variant table's numbers). Both the statistics and the features at any
point of a variant depend only on its *prefix* (the blocks before that point), so both
are shared along a prefix tree:

1. calibration: each calibration batch goes through the group's prefix tree in train
   mode (batch statistics), accumulating every node's running statistics exactly as
   ``recalibrate_bn`` does on the whole variant (same batches, same order);
2. evaluation: each held-out batch goes through the tree in eval mode, every module
   running with its node's statistics; each exit's correct count is kept per
   (batch, prefix).

Depth first, so only the features on the current path are alive. Across groups (the
search's generations) a byte-bounded cache keeps the most important features (shared
by many variants, deep) keyed by (phase, batch, prefix), and the statistics and exit
counts of every prefix seen are kept (a few KB each): a child sharing its first blocks
with an evaluated parent starts from there. Batches are visited in alternating order
from one group to the next, so what a group cached last is what the next one asks for
first.

``evaluate_plain`` materialises, calibrates and evaluates each variant alone: the
reference the prefix evaluator equals exactly (tested). Counted work ("block
evaluations"): one module forward (stem, stage entry, block, exit head) on one batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hmt.errors import InputError
from hmt.supernet.space import ArchConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

Step = tuple[str, int, str]  # ("stem" | "entry" | "block", index, choice)
Key = tuple[Step, ...]


@dataclass(frozen=True)
class ArchAccuracy:
    arch_id: str
    exit_stage: int
    accuracy_per_exit: tuple[float, ...]  # exits 0..exit_stage

    @property
    def accuracy(self) -> float:
        return self.accuracy_per_exit[-1]


@dataclass
class EvalStats:
    """Work done versus evaluating every variant alone, and cache behaviour."""

    archs: int = 0
    groups: int = 0
    block_evals: int = 0  # evaluation forwards run
    block_evals_plain: int = 0  # ... each variant alone would run
    calib_block_evals: int = 0  # calibration forwards run
    calib_block_evals_plain: int = 0
    cache_hits: int = 0
    cache_evictions: int = 0
    cache_peak_bytes: int = 0
    wall_s: float = 0.0

    @property
    def saved_fraction(self) -> float:
        plain = self.block_evals_plain + self.calib_block_evals_plain
        return 1.0 - (self.block_evals + self.calib_block_evals) / plain if plain else 0.0

    def to_json_dict(self) -> dict[str, float | int]:
        return {"archs": self.archs, "groups": self.groups, "block_evals": self.block_evals,
                "block_evals_plain": self.block_evals_plain, "calib_block_evals": self.calib_block_evals,
                "calib_block_evals_plain": self.calib_block_evals_plain, "saved_fraction": self.saved_fraction,
                "cache_hits": self.cache_hits, "cache_evictions": self.cache_evictions,
                "cache_peak_bytes": self.cache_peak_bytes, "wall_s": self.wall_s}


class FeatureCache:
    """Features kept across groups, bounded by their bytes.

    Each entry has an importance (AdaptiveNet 5.2's "prefix latency x prefixing rate":
    here the prefix's depth x the number of the group's variants that pass through it).
    To make room the least important entry goes first, the least recently used among
    equals; a feature is not admitted if only more important ones could make room for
    it. A plain LRU measured no hits here: the depth-first walk inserts the shared root
    first, so by the end of a group it is always the first evicted.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = max(0, int(capacity_bytes))
        self.used_bytes = 0
        self.peak_bytes = 0
        self.evictions = 0
        self._tick = 0
        self._items: dict[Any, list[Any]] = {}  # key -> [tensor, size, importance, last used]

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Any, importance: float | None = None) -> Any | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._tick += 1
        item[3] = self._tick
        if importance is not None:
            item[2] = max(item[2], importance)
        return item[0]

    def put(self, key: Any, tensor: Any, importance: float = 0.0) -> None:
        size = int(tensor.element_size() * tensor.nelement())
        if size > self.capacity_bytes or key in self._items:
            return
        free = self.capacity_bytes - self.used_bytes
        victims: list[Any] = []
        if free < size:
            order = sorted(self._items.items(), key=lambda kv: (kv[1][2], kv[1][3]))
            for old_key, (_, old_size, old_importance, _) in order:
                if old_importance > importance:
                    return  # only more important features could make room
                victims.append(old_key)
                free += old_size
                if free >= size:
                    break
        for old_key in victims:
            self.used_bytes -= self._items.pop(old_key)[1]
            self.evictions += 1
        self._tick += 1
        self._items[key] = [tensor, size, importance, self._tick]
        self.used_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)


def arch_steps(net: Any, arch: ArchConfig) -> tuple[list[Step], dict[int, int], dict[int, Step]]:
    """The units ``arch`` runs, in order, {stage: number of steps done when it ends}, and
    every stage's exit unit (``Supernet.variant_units``: stream widths are in the keys)."""
    units, stage_end, exits = net.variant_units(arch)
    return list(units), dict(stage_end), dict(exits)


@dataclass
class _Node:
    key: Key
    step: Step | None
    children: dict[Step, _Node] = field(default_factory=dict)
    exits: list[int] = field(default_factory=list)  # stages whose exit reads this node's feature
    exit_units: dict[int, Step] = field(default_factory=dict)  # stage -> its exit unit
    fanout: int = 0  # variants of the group that pass through this node


def _build_tree(net: Any, archs: Sequence[ArchConfig]) -> _Node:
    root = _Node((), None)
    for arch in archs:
        steps, stage_end, exit_units = arch_steps(net, arch)
        node = root
        for depth, step in enumerate(steps, start=1):
            child = node.children.get(step)
            if child is None:
                child = _Node((*node.key, step), step)
                node.children[step] = child
            node = child
            node.fanout += 1
            for s, end in stage_end.items():
                if end == depth and s not in node.exits:
                    node.exits.append(s)
                    node.exit_units[s] = exit_units[s]
    return root


def _constant(x: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: x


Stats = list[tuple[Any, Any, Any]]  # per BN: running mean, running var, batches tracked


class _Modules:
    """Plain copies of every (step / exit) module, and swapping of their BN statistics."""

    def __init__(self, net: Any, calibrate: bool) -> None:
        self.net = net
        self.calibrate = calibrate
        self._modules: dict[Any, tuple[nn.Module, list[Any]]] = {}

    def get(self, unit: Any) -> tuple[nn.Module, list[Any]]:
        from hmt.supernet.calibrate import calibrated_norms

        hit = self._modules.get(unit)
        if hit is None:
            # materialize() slices on the CPU; evaluation runs where the supernet lives.
            module = self.net.unit_module(unit).to(next(self.net.parameters()).device)
            # The original network's BN layers keep their trained statistics (as recalibrate_bn).
            norms = calibrated_norms(module)
            if self.calibrate:
                for m in norms:
                    m.momentum = None  # cumulative average, as recalibrate_bn
            hit = (module.eval(), norms)
            self._modules[unit] = hit
        return hit

    @staticmethod
    def load(norms: list[Any], stats: Stats | None) -> None:
        for i, m in enumerate(norms):
            if stats is None:
                m.reset_running_stats()
            else:
                mean, var, count = stats[i]
                m.running_mean.copy_(mean)
                m.running_var.copy_(var)
                m.num_batches_tracked.copy_(count)

    @staticmethod
    def save(norms: list[Any]) -> Stats:
        return [(m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone()) for m in norms]


class PrefixEvaluator:
    """Evaluate groups of variants on fixed batches, reusing shared prefixes.

    ``batches``: (inputs, labels) tensors on the net's device, normalised.
    ``calibration``: input batches to re-estimate each variant's BN statistics on (the
    supernet's stored set, in the batches it was used in); ``None`` keeps the shared ones.
    ``cache_bytes``: bound of the cross-group feature cache (0 disables it).
    """

    def __init__(self, net: Any, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
                 calibration: Sequence[torch.Tensor] | None = None, cache_bytes: int = 256 << 20) -> None:
        if not batches:
            raise InputError("no held-out data to evaluate on (0 batches)")
        self.net = net
        self.batches = list(batches)
        self.n_samples = int(sum(int(y.shape[0]) for _, y in self.batches))
        if self.n_samples == 0:
            raise InputError("no held-out data to evaluate on (0 samples)")
        self.calibration = list(calibration) if calibration is not None else None
        if self.calibration is not None and not self.calibration:
            raise InputError("the calibration set is empty")
        self.modules = _Modules(net, self.calibration is not None)
        self.cache = FeatureCache(cache_bytes)
        self.stats = EvalStats()
        self._bn: dict[tuple[Key, Any], Stats] = {}  # (prefix, unit) -> calibrated statistics
        self._correct: dict[tuple[int, Key, int], int] = {}
        self._pending: dict[tuple[Key, Any], Stats] = {}  # statistics being accumulated
        self._results: dict[str, ArchAccuracy] = {}
        self._reverse = False

    def evaluate(self, archs: Sequence[ArchConfig], *,
                 on_batch: Callable[[int, int], None] | None = None) -> list[ArchAccuracy]:
        """Accuracy per exit of each arch (results memoised by arch id)."""
        import torch

        start = time.perf_counter()
        todo = list({a.arch_id: a for a in archs if a.arch_id not in self._results}.values())
        if todo:
            root = _build_tree(self.net, todo)
            for arch in todo:
                steps, _, _ = arch_steps(self.net, arch)
                per_batch = len(steps) + arch.exit_stage + 1
                self.stats.block_evals_plain += per_batch * len(self.batches)
                if self.calibration is not None:
                    self.stats.calib_block_evals_plain += per_batch * len(self.calibration)
            reverse, self._reverse = self._reverse, not self._reverse
            with torch.inference_mode():
                if self.calibration is not None:
                    self._calibrate(root, reverse)
                order = range(len(self.batches) - 1, -1, -1) if reverse else range(len(self.batches))
                for done, b in enumerate(order, start=1):
                    x, y = self.batches[b]
                    need = self._needs(root, self._count_missing(b))
                    self._visit(root, _constant(x), need, phase="eval", batch=b, labels=y)
                    if on_batch is not None:
                        on_batch(done, len(self.batches))
            for arch in todo:
                self._results[arch.arch_id] = self._collect(arch)
            self.stats.archs += len(todo)
            self.stats.groups += 1
        self.stats.cache_evictions = self.cache.evictions
        self.stats.cache_peak_bytes = self.cache.peak_bytes
        self.stats.wall_s += time.perf_counter() - start
        return [self._results[a.arch_id] for a in archs]

    def _count_missing(self, b: int) -> Callable[[_Node, int | None], bool]:
        return lambda node, s: (b, node.key, s) not in self._correct

    # -- the two passes ------------------------------------------------------------------

    def _calibrate(self, root: _Node, reverse: bool) -> None:
        """Accumulate the statistics of every (prefix, unit) not known yet. Batches run in
        the order given (the running average must see them as recalibrate_bn does);
        ``reverse`` only flips which child subtree goes first."""
        assert self.calibration is not None
        self._pending = {}

        def missing(node: _Node, s: int | None) -> bool:
            unit = node.exit_units[s] if s is not None else node.step
            return (node.key, unit) not in self._bn

        need = self._needs(root, missing, steps_too=True)
        if not need[id(root)]:
            return
        for k, xb in enumerate(self.calibration):
            self._visit(root, _constant(xb), need, phase="calib", batch=k, labels=None)
        self._bn.update(self._pending)
        self._pending = {}

    def _needs(self, root: _Node, missing: Callable[[_Node, int | None], bool], *,
               steps_too: bool = False) -> dict[int, bool]:
        """Which nodes lie on the way to something not known yet (an exit count, or with
        ``steps_too`` a node's own statistics)."""
        need: dict[int, bool] = {}

        def walk(node: _Node) -> bool:
            mine = any(missing(node, s) for s in node.exits)
            if steps_too and node.step is not None:
                mine = mine or missing(node, None)
            for child in node.children.values():
                mine = walk(child) or mine
            need[id(node)] = mine
            return mine

        walk(root)
        return need

    def _run(self, key: Key, unit: Any, h: torch.Tensor, phase: str) -> torch.Tensor:
        from hmt.supernet.calibrate import train_for_calibration

        module, norms = self.modules.get(unit)
        if self.calibration is None:
            return module(h)
        if phase == "eval":
            _Modules.load(norms, self._bn[(key, unit)])
            return module(h)
        pending_key = (key, unit)
        known = pending_key in self._bn
        if not known:
            _Modules.load(norms, self._pending.get(pending_key))
        train_for_calibration(module)
        try:
            out = module(h)
        finally:
            module.eval()
        if not known:
            self._pending[pending_key] = _Modules.save(norms)
        return out

    def _visit(self, node: _Node, parent: Callable[[], torch.Tensor], need: dict[int, bool], *, phase: str,
               batch: int, labels: torch.Tensor | None) -> None:
        holder: list[torch.Tensor] = []
        calib = phase == "calib"

        def feature() -> torch.Tensor:
            if holder:
                return holder[0]
            if node.step is None:
                h = parent()
            else:
                cache_key = (phase, batch, node.key)
                importance = float(node.fanout * len(node.key))
                cached = self.cache.get(cache_key, importance)
                if cached is not None and not (calib and (node.key, node.step) not in self._bn):
                    self.stats.cache_hits += 1
                    h = cached
                else:
                    h = self._run(node.key, node.step, parent(), phase)
                    if calib:
                        self.stats.calib_block_evals += 1
                    else:
                        self.stats.block_evals += 1
                    self.cache.put(cache_key, h, importance)
            holder.append(h)
            return h

        if calib and node.step is not None and (node.key, node.step) not in self._bn:
            feature()  # this node's own statistics are being estimated
        for s in node.exits:
            unit = node.exit_units[s]
            if calib:
                if (node.key, unit) not in self._bn:
                    self._run(node.key, unit, feature(), phase)
                    self.stats.calib_block_evals += 1
            elif labels is not None and (batch, node.key, s) not in self._correct:
                logits = self._run(node.key, unit, feature(), phase)
                self.stats.block_evals += 1
                self._correct[(batch, node.key, s)] = int((logits.argmax(dim=1) == labels).sum().item())
        for child in node.children.values():
            if need[id(child)]:
                self._visit(child, feature, need, phase=phase, batch=batch, labels=labels)

    def _collect(self, arch: ArchConfig) -> ArchAccuracy:
        steps, stage_end, _ = arch_steps(self.net, arch)
        per_exit = []
        for s in range(arch.exit_stage + 1):
            key = tuple(steps[: stage_end[s]])
            correct = sum(self._correct[(b, key, s)] for b in range(len(self.batches)))
            per_exit.append(correct / self.n_samples)
        return ArchAccuracy(arch.arch_id, arch.exit_stage, tuple(per_exit))


def evaluate_plain(net: Any, archs: Sequence[ArchConfig], batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
                   calibration: Sequence[torch.Tensor] | None = None) -> tuple[list[ArchAccuracy], EvalStats]:
    """Each variant alone: materialised, BN re-estimated on ``calibration`` (if given),
    every exit evaluated on every batch. The reference; what the variant table does."""
    import torch

    from hmt.supernet.calibrate import recalibrate_bn

    start = time.perf_counter()
    stats = EvalStats()
    n = int(sum(int(y.shape[0]) for _, y in batches))
    if n == 0:
        raise InputError("no held-out data to evaluate on (0 samples)")
    results = []
    with torch.inference_mode():
        for arch in archs:
            steps, _, _ = arch_steps(net, arch)
            per_batch = len(steps) + arch.exit_stage + 1
            variant = net.materialize(arch)
            if calibration is not None:
                recalibrate_bn(variant, calibration)
                stats.calib_block_evals += per_batch * len(calibration)
            variant.eval()
            correct = [0] * (arch.exit_stage + 1)
            for x, y in batches:
                for s, logits in enumerate(variant.forward_all(x)):
                    correct[s] += int((logits.argmax(dim=1) == y).sum().item())
                stats.block_evals += per_batch
            results.append(ArchAccuracy(arch.arch_id, arch.exit_stage, tuple(c / n for c in correct)))
    stats.block_evals_plain = stats.block_evals
    stats.calib_block_evals_plain = stats.calib_block_evals
    stats.archs = len(archs)
    stats.groups = 1
    stats.wall_s = time.perf_counter() - start
    return results, stats
