"""``hmt specialize``: only the chosen variants' paths learn, the original stays bit-exact, the
variant is chosen on the validation split (never the test split), the artifact verifies and
converts, bad ids fail with a clear line and exit code 2, and a killed run resumes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from hmt.errors import InputError, UsageError
from hmt.supernet import load_supernet
from hmt.supernet.elastify.selection import SpecializeRequest, cheapest_within, select_variants
from hmt.supernet.elastify.specialize import specialize_supernet
from hmt.supernet.elastify.train import elastify_supernet
from hmt.supernet.train import resolve_config

REPO = Path(__file__).resolve().parents[3]
MODELS = Path(__file__).resolve().parent / "models.py"
TINY = {"batch_size": 32, "max_train_samples": 32}


def hmt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.app", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                            "HOME": str(Path.home())})


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = resolve_config(overrides={
        **TINY, "backbone_epochs": 0, "partition_epochs": 1, "distill_epochs": 1, "finetune_epochs": 1,
        "eval_variants": 2, "finetune_random_subnets": 1, "calibration_samples": 32, "val_fraction": 0.05,
        "extra": {"elastify": {"input_shape": [1, 3, 32, 32], "file": str(MODELS), "factory": "user_net"}},
    })
    out = tmp_path_factory.mktemp("specialize") / "parent"
    elastify_supernet(config, out)
    return out


def request(**kwargs: object) -> SpecializeRequest:
    return SpecializeRequest(**{"variants": ("e2.555555",), "epochs": 1, **TINY, **kwargs})  # type: ignore[arg-type]


def test_only_the_variants_path_learns_and_the_original_stays_exact(parent: Path, tmp_path: Path) -> None:
    result = specialize_supernet(parent, tmp_path / "out", request())
    before, after = load_supernet(parent), load_supernet(tmp_path / "out")  # both verified
    arch = after.space.parse(f"{after.space.tag}.e2.555555")
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        largest = after.space.largest()
        assert torch.equal(before.net(x, largest), after.net(x, largest))  # the original, bit for bit
        assert not torch.equal(before.net(x, arch), after.net(x, arch))  # the specialized path learnt
    assert result.metrics["largest_vs_original_max_abs_after"] == 0.0
    table = pd.read_csv(tmp_path / "out" / "variants.csv")
    assert list(table.role) == ["largest", "specialized"] and table.arch_id.iloc[1] == arch.arch_id
    assert {"val_acc", "test_acc", "macs"} <= set(table.columns)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["parents"][0]["manifest_sha256"] == before.artifact.manifest_sha256
    assert manifest["metrics"]["specialized"] == [arch.arch_id] and manifest["metrics"]["epochs"] == 1
    assert "/" + "tmp" not in (tmp_path / "out" / "manifest.json").read_text()  # no path of this machine
    report = json.loads((tmp_path / "out" / "specialize.json").read_text())
    assert report["variants"][0]["chosen_by"] == "--variants"


def test_detached_exits_train_their_heads_and_leave_the_blocks_to_the_final_exit(parent: Path,
                                                                                tmp_path: Path) -> None:
    net = load_supernet(parent).net
    arch = net.space.parse(f"{net.space.tag}.e2.555555")
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    params = {name: p for name, p in net.named_parameters() if p.requires_grad}
    grads = {}
    for detach in (False, True):
        net.zero_grad(set_to_none=True)
        early = net.forward_exits(x, arch, detach_early=detach)[0]  # exit 0: a head on stage 0's blocks
        early.square().sum().backward()
        grads[detach] = {name for name, p in params.items() if p.grad is not None and bool(p.grad.abs().sum() > 0)}
    joint_blocks = {n for n in grads[False] if n.startswith("blocks.")}
    assert joint_blocks, sorted(grads[False])  # joint: the early loss reaches the blocks
    assert not {n for n in grads[True] if n.startswith("blocks.")}, sorted(grads[True])  # detached: never
    assert grads[True] and grads[True] <= grads[False]  # the head itself still learns
    result = specialize_supernet(parent, tmp_path / "out", request(exits="detached", kd_temperature=4.0))
    assert result.metrics["exits"] == "detached" and result.metrics["kd_temperature"] == 4.0
    assert result.metrics["largest_vs_original_max_abs_after"] == 0.0
    report = json.loads((tmp_path / "out" / "specialize.json").read_text())
    assert report["exits"] == "detached" and report["kd_temperature"] == 4.0
    for bad, words in (({"exits": "both"}, "--exits must be one of joint, detached"),
                       ({"kd_temperature": 0.0}, "--kd-temperature")):
        with pytest.raises(UsageError, match=words):
            request(**bad).validate()


def test_a_training_seed_changes_the_training_order_not_the_split(parent: Path, tmp_path: Path) -> None:
    a = specialize_supernet(parent, tmp_path / "a", request())
    b = specialize_supernet(parent, tmp_path / "b", request(seed=1))
    assert b.metrics["training_seed"] == 1 and a.metrics["training_seed"] == 0
    wa = load_file(str(tmp_path / "a" / "weights.safetensors"))
    wb = load_file(str(tmp_path / "b" / "weights.safetensors"))
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)  # another training order, other weights
    # the same validation images: the largest (the exact original) scores the same on both
    assert float(a.variants.val_acc.iloc[0]) == float(b.variants.val_acc.iloc[0])
    with pytest.raises(UsageError, match="--seed"):
        request(seed=-1).validate()


def test_selection_reads_the_validation_split_never_the_test_split(parent: Path) -> None:
    space = load_supernet(parent).space
    tag = space.tag
    table = pd.DataFrame([
        {"arch_id": f"{tag}.e2.BBBBBB", "val_acc": 0.90, "test_acc": 0.90, "macs": 100},
        {"arch_id": f"{tag}.e2.777777", "val_acc": 0.895, "test_acc": 0.50, "macs": 70},  # within 1 on val
        {"arch_id": f"{tag}.e2.555555", "val_acc": 0.50, "test_acc": 0.90, "macs": 50},  # within 1 on test only
        {"arch_id": "other-000000.e2.222222", "val_acc": 0.90, "test_acc": 0.90, "macs": 1},  # another space
    ])
    choice = cheapest_within(space, table, "front.csv", 1.0)
    assert choice.arch.arch_id == f"{tag}.e2.777777" and "validation" in choice.chosen_by
    with pytest.raises(UsageError, match="no variant is within 0.1 points"):
        cheapest_within(space, table, "front.csv", 0.1)
    chosen = select_variants(space, SpecializeRequest(variants=("e2.777777",), front_within=1.0), table, "front.csv")
    assert [c.arch.arch_id for c in chosen] == [f"{tag}.e2.777777"]  # each once
    with pytest.raises(UsageError, match="largest variant"):
        select_variants(space, SpecializeRequest(variants=("e2.BBBBBB",)), table, "front.csv")


def test_bad_requests_fail_with_one_line_and_exit_code_2(parent: Path, tmp_path: Path) -> None:
    space = load_supernet(parent).space
    for given, words in (("e2.55", "not a variant of this supernet's space"), ("e7.555555", "exit stage 7"),
                         ("nonsense", "--variants nonsense")):
        with pytest.raises(UsageError, match=words):
            select_variants(space, SpecializeRequest(variants=(given,)), pd.DataFrame(), "variants.csv")
    with pytest.raises(UsageError, match="nothing to specialize"):
        SpecializeRequest().validate()
    # The original's blocks and skips only: nothing on the path can learn (the original stays exact).
    frozen = space.make(["skip" if "skip" in p.choices else "base" for p in space.positions])
    with pytest.raises(UsageError, match="nothing on this variant's path can learn"):
        specialize_supernet(parent, tmp_path / "frozen", request(variants=(frozen.arch_id,)))
    done = hmt("specialize", "--supernet", str(parent), "--out", str(tmp_path / "o"), "--variants", "e2.DDDDDD")
    assert done.returncode == 2, done.stderr
    assert "--variants e2.DDDDDD" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.slow
def test_out_is_never_a_folder_of_the_users(parent: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    done = hmt("specialize", "--supernet", str(parent), "--variants", "e2.555555", "--out", str(mine))
    assert done.returncode == 3 and "not an hmt artifact" in done.stderr
    assert (mine / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_the_specialized_artifact_converts(parent: Path, tmp_path: Path) -> None:
    specialize_supernet(parent, tmp_path / "sp", request())
    tag = load_supernet(tmp_path / "sp").space.tag
    done = hmt("convert", "--supernet", str(tmp_path / "sp"), "--variant", f"{tag}.e2.555555",
               "--out", str(tmp_path / "conv"), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "conv" / f"{tag}.e2.555555").is_dir()


@pytest.mark.slow
def test_a_killed_specialization_resumes_where_it_stood(parent: Path, tmp_path: Path) -> None:
    from hmt.supernet.train.trainer import TrainingInterrupted

    two = replace(request(), epochs=2)
    specialize_supernet(parent, tmp_path / "whole", two)
    with pytest.raises(TrainingInterrupted):
        specialize_supernet(parent, tmp_path / "resumed", two, stop_after_epochs=1)
    notes: list[str] = []
    seen: list[str] = []
    specialize_supernet(parent, tmp_path / "resumed", two, notify=notes.append,
                        progress=lambda task, done, total, info=None: seen.append(f"{task} {info}"))
    assert any("specialize resumes at its epoch 2" in n for n in notes), notes
    assert {s for s in seen if s.startswith("specialize")} == {"specialize epoch 2/2"}
    a = load_file(str(tmp_path / "whole" / "weights.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "weights.safetensors"))
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    assert not (tmp_path / "resumed.ckpt").exists()


def test_the_front_of_a_specialized_supernet_is_made_of_its_listed_variants(parent: Path, tmp_path: Path) -> None:
    from hmt.errors import InputError
    from hmt.pareto import ParetoOptions, SearchOptions, find_front

    specialize_supernet(parent, tmp_path / "sp", request())
    space = load_supernet(tmp_path / "sp").space
    listed = {space.largest().arch_id, f"{space.tag}.e2.555555"}
    profile = REPO / "profiles" / "jetson-nano.json"
    run = find_front(tmp_path / "sp", profile, tmp_path / "front", ParetoOptions(max_eval_samples=32))
    archive = pd.read_csv(tmp_path / "front" / "archive.csv")
    evaluated = set(archive[archive.derived_from.isna()].arch_id)
    assert evaluated == listed and run.metrics["evaluations"] == 2  # no search: the listed variants only
    derived = archive[archive.derived_from.notna()]
    assert set(derived.derived_from) <= listed and len(derived) == 4  # and exits 0 and 1 of each, free
    assert run.result.options.method == "listed" and any("it was specialized for" in n for n in run.notes)
    # The whole space when asked for, with a note; a list of the user's, by CSV.
    searched = find_front(tmp_path / "sp", profile, tmp_path / "searched",
                          ParetoOptions(max_eval_samples=32, search=SearchOptions(evaluations=4, population=2)))
    assert searched.result.options.method == "nearby" and any("searched with" in n for n in searched.notes)
    mine = tmp_path / "mine.csv"
    mine.write_text(f"arch_id,note\n{space.tag}.e1.555xxx,x\n{space.tag}.e1.555xxx.int8,same variant\n")
    own = find_front(tmp_path / "sp", profile, tmp_path / "own", ParetoOptions(max_eval_samples=32,
                                                                                candidates_path=mine))
    own_archive = pd.read_csv(tmp_path / "own" / "archive.csv")
    assert set(own_archive[own_archive.derived_from.isna()].arch_id) == {space.largest().arch_id,
                                                                         f"{space.tag}.e1.555xxx"}
    assert own.metrics["evaluations"] == 2
    mine.write_text("arch_id\nnot-an-id\n")
    with pytest.raises(InputError, match="mine.csv, row 2"):
        find_front(tmp_path / "sp", profile, tmp_path / "bad", ParetoOptions(candidates_path=mine))
    done = hmt("pareto", "--supernet", str(tmp_path / "sp"), "--profile", str(profile), "--method", "nearby",
               "--candidates", str(mine), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and "--candidates" in done.stderr and "Traceback" not in done.stderr, done.stderr
    done = hmt("pareto", "--supernet", str(tmp_path / "sp"), "--profile", str(profile), "--max-eval-samples", "32",
               "--out", str(tmp_path / "cli"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "listed: the variants of its variants.csv, no search" in done.stdout + done.stderr


def test_ensemble_logits_average_the_tempered_softmaxes() -> None:
    from hmt.supernet.elastify.phases import ensemble_logits

    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g) * 3
    for t in (1.0, 4.0):
        mixed = ensemble_logits([a, b], t)
        expected = (torch.softmax(a / t, 1) + torch.softmax(b / t, 1)) / 2
        assert torch.allclose(torch.softmax(mixed / t, 1), expected, atol=1e-6)
        assert torch.allclose(torch.softmax(ensemble_logits([a, a], t) / t, 1), torch.softmax(a / t, 1), atol=1e-6)


@pytest.fixture(scope="module")
def weighted_parent(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A parent elastified from a weights file (the original), and a second training of the same
    architecture (other weights): the files a user passes as --weights and --teacher-weights."""
    from safetensors.torch import save_file

    sys.path.insert(0, str(MODELS.parent))
    try:
        import models  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    folder = tmp_path_factory.mktemp("teachers")
    files = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        files.append(folder / f"user-seed{seed}.safetensors")
        save_file({k: v.contiguous() for k, v in models.user_net().state_dict().items()}, str(files[-1]))
    config = resolve_config(overrides={
        **TINY, "backbone_epochs": 0, "partition_epochs": 1, "distill_epochs": 1, "finetune_epochs": 1,
        "eval_variants": 2, "finetune_random_subnets": 1, "calibration_samples": 32, "val_fraction": 0.05,
        "extra": {"elastify": {"input_shape": [1, 3, 32, 32], "file": str(MODELS), "factory": "user_net",
                               "weights": str(files[0])}},
    })
    elastify_supernet(config, folder / "parent")
    return folder / "parent", files[0], files[1]


def test_extra_teachers_average_with_the_original_and_are_recorded(weighted_parent: tuple[Path, Path, Path],
                                                                   tmp_path: Path) -> None:
    parent, original, other = weighted_parent
    alone = specialize_supernet(parent, tmp_path / "alone", request())
    # The original's own weights as a second teacher: the ensemble's soft targets are the original's.
    twice = specialize_supernet(parent, tmp_path / "twice", request(teachers=(str(original),)))
    mixed = specialize_supernet(parent, tmp_path / "mixed", request(teachers=(str(other),)))
    w = {name: load_file(str(tmp_path / name / "weights.safetensors")) for name in ("alone", "twice", "mixed")}
    assert all(torch.allclose(w["alone"][k], w["twice"][k], atol=1e-5) for k in w["alone"])
    assert any(not torch.allclose(w["alone"][k], w["mixed"][k], atol=1e-5) for k in w["alone"])  # it taught
    assert alone.metrics["teachers"] == []
    assert mixed.metrics["teachers"] == [{"file": other.name, "sha256": hashlib.sha256(other.read_bytes()).hexdigest()}]
    assert mixed.metrics["largest_vs_original_max_abs_after"] == 0.0  # the original stays exact
    report = json.loads((tmp_path / "mixed" / "specialize.json").read_text())
    assert report["teachers"] == mixed.metrics["teachers"] and "extra teachers" in report["losses"]
    assert str(other.parent) not in (tmp_path / "mixed" / "manifest.json").read_text()  # a name, not a path
    assert twice.metrics["teachers"][0]["file"] == original.name


def test_a_teacher_that_is_not_the_originals_architecture_is_refused(weighted_parent: tuple[Path, Path, Path],
                                                                     tmp_path: Path) -> None:
    from safetensors.torch import save_file

    parent, original, _ = weighted_parent
    wrong = tmp_path / "wrong.safetensors"
    save_file({"fc.weight": torch.zeros(3, 3)}, str(wrong))
    done = hmt("specialize", "--supernet", str(parent), "--out", str(tmp_path / "o"), "--variants", "e2.555555",
               "--teacher-weights", str(wrong))
    assert done.returncode == 3, done.stderr  # a bad input file, as a bad --weights
    assert "--teacher-weights" in done.stderr and "wrong.safetensors" in done.stderr, done.stderr
    assert "the original's own architecture" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "o").exists()
    missing = hmt("specialize", "--supernet", str(parent), "--out", str(tmp_path / "o"), "--variants", "e2.555555",
                  "--teacher-weights", str(tmp_path / "absent.safetensors"))
    assert missing.returncode == 3 and "absent.safetensors: does not exist" in missing.stderr, missing.stderr
    with pytest.raises(UsageError, match="given twice"):
        request(teachers=(str(original), str(original))).validate()
    diverged = load_file(str(original))
    name = next(k for k, v in diverged.items() if v.is_floating_point())
    diverged[name] = torch.full_like(diverged[name], float("nan"))
    save_file(diverged, str(tmp_path / "nan.safetensors"))
    with pytest.raises(InputError, match="NaN") as caught:
        specialize_supernet(parent, tmp_path / "o", request(teachers=(str(tmp_path / "nan.safetensors"),)))
    assert "architecture" not in str(caught.value) and not (tmp_path / "o").exists()
