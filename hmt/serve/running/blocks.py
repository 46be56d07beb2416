"""serve --blocks: the pool pages shared block graphs, not whole copies of variants.

:class:`BlockPool` is a :class:`~hmt.serve.running.pool.VariantPool` whose variants are
composed from the bundle's block graphs (:mod:`hmt.runtime.blocks`). A block used by
several loaded variants is loaded once and counted once: the pool's size is the bytes of
the distinct blocks loaded plus the largest activation pair of a loaded variant, and
``preload``/``trim`` keep that within the memory budget. Evicting a variant releases the
blocks no other loaded variant uses (a request still running it keeps its references
until it returns).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hmt.bundle import Bundle
from hmt.runtime.blocks import BlockSpace, BlockStore, ComposedRunner, compose, load_block_space
from hmt.runtime.chain import Runner
from hmt.serve.running.pool import VariantPool


class BlockPool(VariantPool):
    """Variants composed from shared blocks, within the memory budget counted per block."""

    def __init__(self, bundle: Bundle, *, space: BlockSpace | None = None, threads: int | None = None,
                 providers: Sequence[str] = ("cpu",), **kwargs: Any) -> None:
        self.space = space if space is not None else load_block_space(bundle)
        self.store = BlockStore(bundle, self.space, threads=threads if threads else 1, providers=providers)
        super().__init__(bundle, threads=threads, providers=providers, loader=self._compose, **kwargs)

    def _compose(self, arch_id: str) -> Runner:
        variant = self.bundle.spec.variant(arch_id)
        return compose(self.store, self.space.parse(arch_id), latency_ms=variant.latency_ms,
                       accuracy=self.space.accuracy.get(arch_id, variant.accuracy))

    def _release(self, runner: Runner | None) -> None:
        if isinstance(runner, ComposedRunner) and not runner._released:
            runner._released = True
            self.store.release(runner.variant.units)

    def loaded_bytes(self) -> int:
        runners = list(self._loaded.values())
        activations = [r.memory_bytes - sum(self.space.units[u].size_bytes for u in set(r.variant.units))
                       for r in runners if isinstance(r, ComposedRunner)]
        others = sum(r.memory_bytes for r in runners if not isinstance(r, ComposedRunner))
        return self.store.loaded_bytes() + max(activations, default=0) + others

    def added_bytes(self, arch_id: str) -> int:
        """What loading ``arch_id`` adds: its blocks not loaded yet (and its activations, if larger)."""
        config = self.space.parse(arch_id)
        units, _, exits = self.space.units_of(config)
        loaded = set(self.store.loaded_units())
        return sum(self.space.units[u].size_bytes for u in {*units, *exits.values()} - loaded)

    def add(self, arch_id: str, runner: Runner) -> None:
        with self._load_lock:
            self._release(self._loaded.pop(arch_id, None))
            self._loaded[arch_id] = runner
            self.load_count += 1

    def remove(self, arch_id: str) -> None:
        with self._load_lock:
            self._release(self._loaded.pop(arch_id, None))

    def trim(self, capacity_bytes: int | None, keep: Iterable[str]) -> list[str]:
        if capacity_bytes is None:
            return []
        keep_set = set(keep)
        evicted: list[str] = []
        for arch_id in list(self._loaded):
            if self.loaded_bytes() <= capacity_bytes:
                break
            if arch_id in keep_set:
                continue
            with self._load_lock:
                self._release(self._loaded.pop(arch_id, None))
            evicted.append(arch_id)
        self.evictions += len(evicted)
        return evicted

    def status(self) -> dict[str, Any]:
        return {"units_shipped": len(self.space.units), "units_loaded": len(self.store.loaded_units()),
                "unit_loads": self.store.loads, "unit_unloads": self.store.unloads,
                "blocks_mb": self.store.loaded_bytes() / 1e6}


def make_pool(bundle: Bundle, *, blocks: bool, engine: str, loader: Any = None, **pool_kwargs: Any) -> VariantPool:
    """The pool serve runs: whole variants (:class:`VariantPool`, on ``engine`` through ``loader``),
    or with ``blocks`` (serve --blocks) variants composed from the bundle's shared block graphs
    (:class:`BlockPool`, ONNX Runtime only). ``pool_kwargs``: threads, warmup runs, providers,
    early exit, max threads."""
    if blocks:
        return BlockPool(bundle, **pool_kwargs)
    return VariantPool(bundle, engine=engine, loader=loader, **pool_kwargs)
