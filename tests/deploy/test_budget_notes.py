"""deploy builds a bundle whose budget no variant meets, and says so in its notes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hmt.deploy.notes import budget_notes

POINTS = {"big": {"latency_ms": 2.0, "memory_mb": 3.5}, "small": {"latency_ms": 0.5, "memory_mb": 1.2}}


def test_a_budget_no_variant_meets_is_noted_naming_the_closest() -> None:
    assert budget_notes(POINTS, 1.0, 2.0) == []  # small meets both
    assert budget_notes(POINTS, None, None) == []
    (latency,) = budget_notes(POINTS, 0.1, None)
    assert latency.startswith("--latency-ms 0.1: no bundled variant meets it") and "small, 0.5 ms" in latency
    (memory,) = budget_notes(POINTS, None, 1.0)
    assert memory.startswith("--memory-mb 1: no bundled variant") and "small, 1.2 MB" in memory


def test_a_missing_supernet_is_named_after_the_option_that_needs_it(tmp_path: Path) -> None:
    """deploy --blocks without the front's supernet was refused as '--adaptable: ...' (a flag not given)."""
    from types import SimpleNamespace

    from hmt.artifacts.manifest import ParentRecord
    from hmt.deploy.adaptable import supernet_of
    from hmt.errors import UsageError

    gone = ParentRecord(kind="supernet", path="../gone", manifest_sha256="0" * 64)
    front = SimpleNamespace(artifact=SimpleNamespace(root=tmp_path / "front",
                                                     manifest=SimpleNamespace(parents=(gone,))))
    with pytest.raises(UsageError, match=r"^--blocks: the supernet the front was searched on \(\.\./gone"):
        supernet_of(front, None, what="--blocks")
    front.artifact.manifest.parents = ()
    with pytest.raises(UsageError, match="^--blocks needs the supernet"):
        supernet_of(front, None, what="--blocks")
