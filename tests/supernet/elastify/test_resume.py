"""A killed elastification resumes at the next phase and ends where an uninterrupted run ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from hmt.supernet.elastify.train import elastify_supernet
from hmt.supernet.train import resolve_config

MODELS = Path(__file__).resolve().parent / "models.py"


class Killed(Exception):
    pass


def _config() -> object:
    return resolve_config(overrides={
        "batch_size": 32, "max_train_samples": 32, "backbone_epochs": 0, "partition_epochs": 1, "distill_epochs": 1,
        "finetune_epochs": 1, "eval_variants": 0, "finetune_random_subnets": 1, "calibration_samples": 32,
        "val_fraction": 0.05,
        "extra": {"elastify": {"input_shape": [1, 3, 32, 32], "file": str(MODELS), "factory": "user_net"}},
    })


def test_killed_run_resumes_at_the_next_phase(tmp_path: Path) -> None:
    config = _config()
    elastify_supernet(config, tmp_path / "whole")  # type: ignore[arg-type]

    def kill_in_distill(task: str, done: int, total: int | None, info: str | None = None) -> None:
        if task == "distill":
            raise Killed

    with pytest.raises(Killed):
        elastify_supernet(config, tmp_path / "resumed", progress=kill_in_distill)  # type: ignore[arg-type]
    assert (tmp_path / "resumed.ckpt" / "checkpoint.pt").is_file()
    seen: list[str] = []
    resumed = elastify_supernet(config, tmp_path / "resumed",  # type: ignore[arg-type]
                                progress=lambda task, *_: seen.append(task))
    assert "exits" not in seen and "distill" in seen and "finetune" in seen
    history = json.loads((tmp_path / "resumed" / "history.json").read_text())
    assert [h["phase"] for h in history] == ["exits", "distill", "finetune"]  # each phase once
    assert resumed.metrics["largest_vs_original_max_abs_after"] == 0.0
    a = load_file(str(tmp_path / "whole" / "weights.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "weights.safetensors"))
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    assert not (tmp_path / "resumed.ckpt").exists()


@pytest.mark.slow
def test_killed_run_resumes_within_its_phase_at_the_checkpointed_epoch(tmp_path: Path) -> None:
    """Killed after 2 of fine-tuning's 3 epochs (a checkpoint between epochs, optimizer state
    included): the rerun runs only the third and ends bit for bit where an uninterrupted run ends."""
    from dataclasses import replace

    from hmt.supernet.train.trainer import TrainingInterrupted

    config = replace(_config(), finetune_epochs=3)  # type: ignore[type-var]
    elastify_supernet(config, tmp_path / "whole")  # type: ignore[arg-type]
    with pytest.raises(TrainingInterrupted):
        # exits 1 epoch, distill 1 (each phase's own checkpoint), then 2 of fine-tuning's 3
        elastify_supernet(config, tmp_path / "resumed", stop_after_epochs=4)  # type: ignore[arg-type]
    notes: list[str] = []
    seen: list[str] = []
    elastify_supernet(config, tmp_path / "resumed", notify=notes.append,  # type: ignore[arg-type]
                      progress=lambda task, done, total, info=None: seen.append(f"{task} {info}"))
    assert any("finetune resumes at its epoch 3" in n for n in notes), notes
    assert {s for s in seen if s.startswith("finetune")} == {"finetune epoch 3/3"}
    history = json.loads((tmp_path / "resumed" / "history.json").read_text())
    assert [(h["phase"], h["epoch"]) for h in history if h["phase"] == "finetune"] == [
        ("finetune", 0), ("finetune", 1), ("finetune", 2)]
    a = load_file(str(tmp_path / "whole" / "weights.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "weights.safetensors"))
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
