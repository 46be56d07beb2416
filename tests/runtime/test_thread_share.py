"""serve's share of the CPU: fuse's per-variant thread count is cut so that the inferences serve runs
at once fit the cores it may use (hmt.runtime.variant.within_share, hmt.runtime.cpus.thread_share)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hmt.bundle import load_bundle
from hmt.runtime.cpus import CpuCapacity, thread_share
from hmt.runtime.ort import OrtOptions
from hmt.runtime.variant import load_variant, within_share
from tests.serve.serve_bundles import VariantDef, make_bundle


@pytest.mark.parametrize(("capacity", "concurrency", "expected"), [
    (CpuCapacity(cpus=2), 2, 1),  # the 2-core host, two API workers
    (CpuCapacity(cpus=8), 2, 4),
    (CpuCapacity(cpus=8), 3, 2),  # whole cores each
    (CpuCapacity(cpus=4, quota_cores=1.5), 1, 1),  # a cgroup quota below the cores
    (CpuCapacity(cpus=1), 4, 1),  # never below one
    (CpuCapacity(cpus=4), 0, 4),  # nothing else running: the whole capacity
])
def test_thread_share_divides_the_capacity(capacity: CpuCapacity, concurrency: int, expected: int) -> None:
    assert thread_share(concurrency, capacity) == expected


def test_within_share_cuts_what_exceeds_the_share() -> None:
    default = OrtOptions(intra_op_threads=0, allow_spinning=True)  # ORT's default: one thread per core
    cut, note = within_share(default, 1)
    assert (cut.intra_op_threads, cut.allow_spinning) == (1, False)
    assert note is not None and "default -> 1" in note
    cut, note = within_share(OrtOptions(intra_op_threads=4), 2)
    assert (cut.intra_op_threads, cut.allow_spinning) == (2, False) and note is not None
    parallel = OrtOptions(intra_op_threads=2, execution_mode="parallel", inter_op_threads=0)
    cut, _ = within_share(parallel, 1)
    assert (cut.intra_op_threads, cut.inter_op_threads) == (1, 1)


def test_within_share_keeps_what_fits() -> None:
    one = OrtOptions(intra_op_threads=1, allow_spinning=True)
    assert within_share(one, 2) == (one, None)  # fuse's measured choice, spinning included
    default = OrtOptions(intra_op_threads=0)
    assert within_share(default, None) == (default, None)


def test_a_loaded_variant_runs_within_the_share(tmp_path: Path) -> None:
    """fuse chose ORT's default thread count (every core, spinning): loaded with a share of one
    thread, every graph of the variant runs on one thread, and the runner's notes say so; without
    a share it keeps fuse's choice."""
    runtime = {"per_graph": {"engine": "onnxruntime", "candidate": "ort[all,threads=default](chain)",
                             "ort": {"level": "all", "intra_op_threads": 0, "allow_spinning": True}}}
    bundle = load_bundle(make_bundle(tmp_path / "b", [VariantDef("v", 0.9, 1.0, 1.0, runtime=runtime)]))
    shared = load_variant(bundle, "v", max_threads=1)
    assert any("intra-op threads the runtime's default -> 1" in n for n in shared.notes)
    assert not any("->" in n for n in load_variant(bundle, "v").notes)
    assert not any("->" in n for n in load_variant(bundle, "v", threads=2, max_threads=1).notes)


def test_serve_cuts_to_its_concurrency(tmp_path: Path) -> None:
    """serve's session: SessionOptions.concurrency inferences at once share the CPU; --threads wins."""
    from hmt.serve.running.session import SessionOptions, open_controller

    runtime = {"per_graph": {"engine": "onnxruntime",
                             "ort": {"level": "all", "intra_op_threads": 0, "allow_spinning": True}}}
    path = make_bundle(tmp_path / "b", [VariantDef("v", 0.9, 1.0, 1.0, runtime=runtime)])
    crowded = open_controller(path, SessionOptions(concurrency=1 << 16), warmup_runs=0)
    crowded.start(background=False)
    assert any("-> 1 without spinning" in n for n in crowded.status()["runtime_notes"])
    pinned = open_controller(path, SessionOptions(concurrency=1 << 16, threads=2), warmup_runs=0)
    pinned.start(background=False)
    assert not any("->" in n for n in pinned.status()["runtime_notes"])
