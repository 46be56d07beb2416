"""deploy builds a bundle whose budget no variant meets, and says so in its notes."""

from __future__ import annotations

from hmt.deploy.notes import budget_notes

POINTS = {"big": {"latency_ms": 2.0, "memory_mb": 3.5}, "small": {"latency_ms": 0.5, "memory_mb": 1.2}}


def test_a_budget_no_variant_meets_is_noted_naming_the_closest() -> None:
    assert budget_notes(POINTS, 1.0, 2.0) == []  # small meets both
    assert budget_notes(POINTS, None, None) == []
    (latency,) = budget_notes(POINTS, 0.1, None)
    assert latency.startswith("--latency-ms 0.1: no bundled variant meets it") and "small, 0.5 ms" in latency
    (memory,) = budget_notes(POINTS, None, 1.0)
    assert memory.startswith("--memory-mb 1: no bundled variant") and "small, 1.2 MB" in memory
