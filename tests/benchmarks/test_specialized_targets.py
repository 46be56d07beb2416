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


def test_a_specialization_without_its_front_evaluation_is_read_from_its_own_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A lease that ended before the front evaluation (NAME.csv) was collected: hmt specialize's own
    table (NAME-variants.csv) gives the largest and the specialized rows, without test halves."""
    import csv
    import json

    from benchmarks.supernet.specialized import model_summary

    (tmp_path / "r18-elastic-manifest.json").write_text(json.dumps({"metrics": {"elastify_s": 55.0,
                                                                               "largest_test_acc": 0.9192}}))
    (tmp_path / "r18-elastic-history.json").write_text(json.dumps([{"phase": "distill", "epoch_s": 5.0}]))
    (tmp_path / "r18-w50-specialize.json").write_text(json.dumps({
        "epochs": 120, "lr": 0.2, "exactness": {"after_training": 0.0},
        "variants": [{"chosen_by": "--variants", "val_acc_before": 0.38, "test_acc_before": 0.37}]}))
    (tmp_path / "r18-w50-history.json").write_text(json.dumps([{"epoch_s": 2.0}, {"epoch_s": 2.5}]))
    with (tmp_path / "r18-w50-variants.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["arch_id", "role", "val_acc", "test_acc", "macs"])
        writer.writeheader()
        writer.writerow({"arch_id": "s.e3.BB", "role": "largest", "val_acc": 0.9206, "test_acc": 0.9192, "macs": 556})
        writer.writerow({"arch_id": "s.e3.55", "role": "specialized", "val_acc": 0.9108, "test_acc": 0.9083,
                         "macs": 139})
    summary = model_summary(tmp_path, "r18", test_half=False)
    assert summary is not None
    (spec,) = summary["specialized"]
    assert spec["after"] == {"val_acc": 0.9108, "test_acc": 0.9083, "test_a_acc": None, "test_b_acc": None}
    assert (spec["selected_drop_points"], spec["reported_drop_points"]) == (0.98, 1.09)
    assert summary["original"]["arch_id"] == "s.e3.BB" and spec["train_s"] == 4.5
