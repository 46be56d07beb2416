"""Train (or only measure) a plain network the way a user obtains their original: a standard
CIFAR recipe on the training split that hmt's supernet training also uses (45k images; the
5k validation images and the 10k test images are never trained on).

Recipe: SGD with Nesterov momentum 0.9, weight decay 5e-4, one-cycle learning rate
(hmt.supernet.train.trainer.lr_at), label smoothing 0.1, random crop (reflect pad 4) and
flip, bf16 autocast and channels-last on CUDA. A checkpoint after every epoch: rerun the
same command to resume.

    python -m benchmarks.supernet.originals --model benchmarks/supernet/models/cifar_resnet18.py:build \\
        --data CIFAR_DIR --epochs 200 --lr 0.2 --weights-out r18.safetensors --out r18.json

``--init`` starts from existing weights (safetensors, a torch state dict, or a pretrained
checkpoint the model file's ``load_pretrained`` reads); ``--epochs 0`` only measures them.
``--input-norm imagenet`` measures a network trained on ImageNet-normalised pixels as it was
trained (hmt normalises CIFAR-10 with its own channel statistics).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.harness import Driver

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.supernet.originals", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="FILE.py:factory returning the untrained network")
    p.add_argument("--init", type=Path, help="weights to start from (or to measure with --epochs 0)")
    p.add_argument("--data", type=Path, required=True, help="CIFAR-10 folder (train.zip, test.zip)")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--seed", type=int, default=0, help="initialisation and batch order (not the split)")
    p.add_argument("--split-seed", type=int, default=0,
                   help="the train/validation split; keep 0 to share hmt's split (train-supernet, specialize)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--input-norm", choices=("dataset", "imagenet"), default="dataset")
    p.add_argument("--max-train-samples", type=int, help="cap the training split (quick checks)")
    p.add_argument("--cache-dir", type=Path)
    p.add_argument("--checkpoint-dir", type=Path, help="default: WEIGHTS_OUT.ckpt")
    p.add_argument("--weights-out", type=Path, help="the trained weights (.safetensors)")
    p.add_argument("--out", type=Path, required=True, help="result JSON")
    return p.parse_args(argv)


def _renorm(info: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) taking hmt's normalised pixels to ImageNet-normalised ones."""
    mean_d = torch.tensor(info.mean, device=device).view(1, -1, 1, 1)
    std_d = torch.tensor(info.std, device=device).view(1, -1, 1, 1)
    mean_i = torch.tensor(IMAGENET_MEAN, device=device).view(1, -1, 1, 1)
    std_i = torch.tensor(IMAGENET_STD, device=device).view(1, -1, 1, 1)
    return std_d / std_i, (mean_d - mean_i) / std_i


def _accuracy(net: torch.nn.Module, x: np.ndarray, y: np.ndarray, info: Any, device: torch.device,
              norm: tuple[torch.Tensor, torch.Tensor] | None) -> float:
    from hmt.data import eval_loader

    net.eval()
    loader = eval_loader(x, y, info=info, batch_size=1000, device=device, channels_last=device.type == "cuda")
    correct = seen = 0
    with torch.no_grad():
        for xb, yb in loader:
            if norm is not None:
                xb = xb * norm[0] + norm[1]
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                correct += int((net(xb).argmax(1) == yb).sum())
            seen += len(yb)
    return correct / max(1, seen)


def _load_init(net: torch.nn.Module, model_option: str, init: Path) -> None:
    """safetensors or a plain state dict through hmt's loader; a ``.th`` checkpoint through the
    model file's own ``load_pretrained`` (its layout is the file's business)."""
    import importlib.util

    from hmt.convert.sources import apply_weights

    if init.suffix != ".th":
        apply_weights(net, init)
        return
    spec = importlib.util.spec_from_file_location("_hmt_original_model", model_option.split(":", 1)[0])
    if spec is None or spec.loader is None:
        raise SystemExit(f"--model {model_option}: cannot import the file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "load_pretrained"):
        raise SystemExit(f"--init {init}: a .th checkpoint needs load_pretrained(net, path) in {spec.origin}")
    module.load_pretrained(net, init)


def _revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _machine(device: torch.device) -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "os": platform.system()}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    out["cpu"] = platform.processor() or platform.machine()
    return out


def main(argv: list[str] | None = None) -> int:
    from hmt.convert.sources import load_factory_module
    from hmt.data import split_train_val
    from hmt.data.load import load_dataset
    from hmt.supernet.train.trainer import derive_seed

    args = _parse(argv)
    device = torch.device(args.device)
    started = time.perf_counter()
    data = load_dataset("cifar10", args.data, cache_dir=args.cache_dir)
    train, val = split_train_val(data, 0.1, np.random.default_rng(derive_seed(args.split_seed, 1)))
    if args.max_train_samples:
        train = type(train)(train.x[: args.max_train_samples], train.y[: args.max_train_samples])
    torch.manual_seed(derive_seed(args.seed, 0))
    net = load_factory_module(args.model)
    if args.init is not None:
        _load_init(net, args.model, args.init)
    net.to(device)
    channels_last = device.type == "cuda"
    if channels_last:
        net.to(memory_format=torch.channels_last)
    norm = _renorm(data.info, device) if args.input_norm == "imagenet" else None
    result: dict[str, Any] = {"init_val_acc": None, "init_test_acc": None}
    if args.init is not None:
        result["init_val_acc"] = _accuracy(net, val.x, val.y, data.info, device, norm)
        result["init_test_acc"] = _accuracy(net, data.test_x, data.test_y, data.info, device, norm)
    history: list[dict[str, float]] = []
    if args.epochs > 0:
        history = _train(net, train, data.info, args, device, norm)
    result.update(val_acc=_accuracy(net, val.x, val.y, data.info, device, norm),
                  test_acc=_accuracy(net, data.test_x, data.test_y, data.info, device, norm),
                  train_images=len(train.x), epochs=args.epochs, train_s=sum(h["epoch_s"] for h in history),
                  params=sum(p.numel() for p in net.parameters()))
    if args.weights_out is not None:
        from safetensors.torch import save_file

        state = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
        args.weights_out.parent.mkdir(parents=True, exist_ok=True)
        save_file(state, str(args.weights_out))
    doc = {
        "area": "supernet", "name": f"original-{Path(args.model.split(':')[0]).stem}",
        "command": "python -m benchmarks.supernet.originals " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "revision": _revision(),
        "machine": _machine(device), "seed": args.seed, "split_seed": args.split_seed,
        "baseline": {"init_val_acc": result["init_val_acc"], "init_test_acc": result["init_test_acc"]},
        "results": {**result, "wall_s": time.perf_counter() - started,
                    "recipe": {"lr": args.lr, "weight_decay": args.weight_decay, "batch_size": args.batch_size,
                               "label_smoothing": 0.1, "schedule": "one-cycle", "input_norm": args.input_norm}},
        "claims": [{"claim": f"{Path(args.model.split(':')[0]).stem} trained alone, {args.epochs} epochs",
                    "figure": f"{100 * result['test_acc']:.2f}% test, {100 * result['val_acc']:.2f}% validation"}],
        "history": history,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: v for k, v in doc["results"].items() if k != "recipe"}))
    return 0


def _train(net: torch.nn.Module, train: Any, info: Any, args: argparse.Namespace, device: torch.device,
           norm: tuple[torch.Tensor, torch.Tensor] | None) -> list[dict[str, float]]:
    from hmt.data import BatchLoader
    from hmt.supernet.train.checkpoint import load_checkpoint, save_checkpoint
    from hmt.supernet.train.trainer import derive_seed, lr_at

    loader = BatchLoader(train.x, train.y, info=info, batch_size=args.batch_size, device=device, augment=True,
                         shuffle=True, generator=torch.Generator().manual_seed(derive_seed(args.seed, 3)),
                         drop_last=True, channels_last=device.type == "cuda")
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                                weight_decay=args.weight_decay)
    ckpt = args.checkpoint_dir or Path(str(args.weights_out or args.out) + ".ckpt")
    fingerprint = f"{args.model}:{args.init}:{args.epochs}:{args.lr}:{args.batch_size}:{args.seed}"
    saved = load_checkpoint(ckpt, config_fingerprint=fingerprint)
    start, history = 0, []
    if saved is not None:
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start, history = int(saved["epoch"]), list(saved["history"])
        print(f"resuming from epoch {start}", file=sys.stderr)
    total = len(loader) * args.epochs
    for epoch in range(start, args.epochs):
        net.train()
        loader.set_epoch(epoch)
        t0, loss_sum = time.perf_counter(), torch.zeros((), device=device)
        for i, (xb, yb) in enumerate(loader):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(args.lr, epoch * len(loader) + i, total)
            if norm is not None:
                xb = xb * norm[0] + norm[1]
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = F.cross_entropy(net(xb), yb, label_smoothing=0.1)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        history.append({"epoch": epoch, "train_loss": float(loss_sum) / len(loader),
                        "epoch_s": time.perf_counter() - t0})
        print(f"epoch {epoch + 1}/{args.epochs} loss {history[-1]['train_loss']:.3f} "
              f"{history[-1]['epoch_s']:.1f} s", file=sys.stderr, flush=True)
        ckpt.mkdir(parents=True, exist_ok=True)
        save_checkpoint(ckpt, {"config_fingerprint": fingerprint, "epoch": epoch + 1, "history": history,
                               "model": net.state_dict(), "optimizer": optimizer.state_dict()})
    return history


BENCH = Driver(
    baseline="the weights' own accuracy before training (with --init); a network trained from scratch has none",
    quick=["--model", "{repo}/benchmarks/supernet/models/cifar_resnet56.py:build", "--data", "{repo}/hmt/data/embedded",
           "--epochs", "1", "--max-train-samples", "64", "--batch-size", "32", "--device", "cpu", "--out", "{report}"],
    needs="a GPU and the CIFAR-10 data: scripts/gpu_originals.sh runs it",
    summarise=lambda report: report["results"],
    claims=lambda report: report["claims"],
)


if __name__ == "__main__":
    raise SystemExit(main())
