"""Elastification through the command line, end to end on the embedded CIFAR-10 subset:
the original stays exact through every training phase, the manifest records where the
model came from, the artifact reloads (from its stored source) and converts unchanged."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[3]
MODELS = Path(__file__).resolve().parent / "models.py"
# --backbone-epochs stays at its default (> 0): without --train-original the weights are kept.
FAST = ["--max-train-samples", "32", "--batch-size", "32", "--partition-epochs", "1",
        "--distill-epochs", "1", "--finetune-epochs", "1", "--eval-variants", "1"]


def hmt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.app", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=900, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                            "HOME": str(Path.home())})


def user_net() -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("elastify_models_train", MODELS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(3)
    net = module.user_net()
    # Non-trivial statistics, so a BN that drifted in training would show.
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return net.eval()


@pytest.fixture(scope="module")
def elastified(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("elastify")
    weights = tmp / "user.safetensors"
    save_file({k: v.contiguous() for k, v in user_net().state_dict().items()}, str(weights))
    out = tmp / "sn"
    result = hmt("train-supernet", "--model", f"{MODELS}:user_net", "--weights", str(weights), "--input-shape",
                 "1,3,32,32", *FAST, "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return out, weights, json.loads(result.stdout)


def test_training_keeps_the_original_exact(elastified: tuple[Path, Path, dict]) -> None:
    out, _, doc = elastified
    m = doc["metrics"]
    assert m["largest_vs_original_max_abs_before"] <= 1e-5
    assert m["largest_vs_original_max_abs_after"] <= 1e-5
    assert m["original_test_acc"] == m["largest_test_acc"]
    assert m["original_trained_here"] is False and "as given: --weights" in m["original_weights"]
    history = json.loads((out / "history.json").read_text())
    assert {h["phase"] for h in history} == {"exits", "distill", "finetune"}
    # The reloaded artifact (network rebuilt from its stored copy of the source) is exact too.
    from hmt.supernet import load_supernet

    loaded = load_supernet(out)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours = loaded.net(x, loaded.space.largest())
        theirs = user_net()(x)
    assert float((ours - theirs).abs().max()) <= 1e-5
    for arch_id in ("largest", "smallest"):
        arch = getattr(loaded.space, arch_id)()
        with torch.no_grad():
            assert torch.allclose(loaded.net.materialize(arch)(x), loaded.net(x, arch), atol=1e-5, rtol=0)


def test_manifest_records_source_factory_and_weights(elastified: tuple[Path, Path, dict]) -> None:
    out, weights, _ = elastified
    manifest = json.loads((out / "manifest.json").read_text())
    provenance = manifest["config"]["extra"]["provenance"]
    assert provenance["source_sha256"] == hashlib.sha256(MODELS.read_bytes()).hexdigest()
    assert provenance["factory"] == "user_net"
    assert provenance["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert (out / "source.py").read_bytes() == MODELS.read_bytes()
    report = json.loads((out / "elastify.json").read_text())
    assert report["blocks"] and all("choices" in b and "notes" in b for b in report["blocks"])
    import pandas as pd

    table = pd.read_csv(out / "variants.csv")
    assert {"largest", "smallest"} <= set(table.role)


def test_convert_takes_the_elastified_supernet(elastified: tuple[Path, Path, dict], tmp_path: Path) -> None:
    out, _, _ = elastified
    result = hmt("convert", "--supernet", str(out), "--variant", "largest", "--variant", "smallest",
                 "--out", str(tmp_path / "converted"), "--json")
    assert result.returncode == 0, result.stderr[-3000:]


def test_untraceable_model_exits_with_one_line(tmp_path: Path) -> None:
    result = hmt("train-supernet", "--model", f"{MODELS}:untraceable", "--input-shape", "1,3,32,32", *FAST,
                 "--out", str(tmp_path / "sn"))
    assert result.returncode == 5
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "--leaf gate" in lines[0] and "Traceback" not in result.stderr


def test_elastify_options_need_a_model(tmp_path: Path) -> None:
    result = hmt("train-supernet", "--leaf", "x", "--out", str(tmp_path / "sn"))
    assert result.returncode == 2 and "--model or --torchvision" in result.stderr
