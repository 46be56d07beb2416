"""Memory under pool churn (issue 17 item 9): load/evict cycles leave RSS flat."""

from __future__ import annotations

import gc
from pathlib import Path

import psutil
import pytest
from serve_bundles import make_bundle

from hmt.bundle import load_bundle
from hmt.serve.running.pool import VariantPool


@pytest.mark.slow
def test_one_thousand_load_evict_cycles_keep_rss_flat(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path / "b"))
    pool = VariantPool(bundle, threads=1, warmup_runs=1)
    ids = [v.arch_id for v in bundle.spec.variants]
    process = psutil.Process()

    def cycle(n: int) -> None:
        for i in range(n):
            pool.load(ids[i % len(ids)])
            pool.trim(0, keep=())

    cycle(100)  # imports, arenas, caches
    gc.collect()
    before = process.memory_info().rss
    cycle(1000)
    gc.collect()
    growth = process.memory_info().rss - before
    assert pool.load_count == 1100 and pool.evictions == 1100
    # 45-77 KB per load would be 45-77 MB here; allow allocator noise of 2 KB per load.
    assert growth < 2_000_000, f"RSS grew {growth / 1e3:.0f} KB over 1,000 load/evict cycles"


def test_tvm_modules_are_loaded_once_per_verified_content(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """TVM never frees a loaded module: the runtime keeps one per (path, sha256) instead of leaking one per load."""
    import hmt.runtime.tvm as runtime_tvm

    loads: list[str] = []

    class FakeRuntime:
        @staticmethod
        def load_module(path: str) -> object:
            loads.append(path)
            return object()

    class FakeTvm:
        runtime = FakeRuntime

        @staticmethod
        def cpu(_: int) -> str:
            return "cpu"

    class FakeRelax:
        @staticmethod
        def VirtualMachine(module: object, dev: str) -> object:
            return module

    monkeypatch.setattr(runtime_tvm, "import_tvm", lambda: (FakeTvm, FakeRelax))
    monkeypatch.setattr(runtime_tvm, "_MODULES", {})
    lib = tmp_path / "g.so"
    lib.write_bytes(b"x")
    first, _ = runtime_tvm.load_tvm_module(lib, sha256="a" * 64)
    again, _ = runtime_tvm.load_tvm_module(lib, sha256="a" * 64)
    changed, _ = runtime_tvm.load_tvm_module(lib, sha256="b" * 64)
    assert first is again and changed is not first and len(loads) == 2
