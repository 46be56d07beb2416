"""Issue 22's targets read as a user would: the speed-up is fixed, the variant is chosen on the
selection split only, and the target is met only where both splits stay inside the margin."""

from __future__ import annotations

from typing import Any

from benchmarks.supernet.specialized import _target_claims, at_target, best


def _run(name: str, speedup: float, val_drop: float, test_drop: float, val_acc: float) -> dict[str, Any]:
    return {"name": name, "arch_id": f"s.e3.{name}", "speedup": speedup, "selected_drop_points": val_drop,
            "reported_drop_points": test_drop, "after": {"val_acc": val_acc, "test_acc": 0.0}}


def _summary(*runs: dict[str, Any]) -> dict[str, Any]:
    return {"selected_on": "val_acc", "reported_on": "test_acc", "specialized": list(runs),
            "original": {"val_acc": 0.9188, "test_acc": 0.9184}}


def test_the_target_is_read_on_the_most_accurate_variant_fast_enough() -> None:
    # the fastest variant within a point on validation loses more on test; a slower one, still past
    # the target and more accurate on validation, holds on both splits
    fast = _run("fast", 5.6, 0.82, 1.16, 0.9106)
    wide = _run("wide", 4.2, 0.66, 0.85, 0.9122)
    slow = _run("slow", 3.0, 0.10, 0.20, 0.9180)
    summary = _summary(fast, wide, slow)
    fastest, pick = best(summary, 1), at_target(summary, 4.0)
    assert fastest is not None and fastest["name"] == "fast"
    assert pick is not None and pick["name"] == "wide"  # slow is not fast enough, whatever its accuracy
    verdict = _target_claims("r18", summary)[0]["figure"]
    assert verdict.startswith("wide") and verdict.endswith(": met") and "(original 91.84 %)" in verdict


def test_the_target_is_missed_when_the_pick_fails_either_split_or_nothing_is_fast_enough() -> None:
    summary = _summary(_run("a", 4.5, 0.9, 1.07, 0.9128), _run("b", 4.4, 0.95, 0.8, 0.9120))
    verdicts = _target_claims("r18", summary)
    assert verdicts[0]["figure"].startswith("a") and verdicts[0]["figure"].endswith(": missed")  # chosen on val only
    assert verdicts[1]["figure"] == "no variant timed at 6.0x or more: missed"
    assert at_target(_summary(_run("c", 3.9, 0.1, 0.1, 0.91)), 4.0) is None
