"""The training presets of ``hmt train-supernet --preset``: a registry of option overrides.

Torch-free (the command line lists the names in its --help without importing torch);
:func:`hmt.supernet.train.config.resolve_config` applies one under the config file and flags.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # Minutes on a laptop CPU, on the embedded CIFAR-10 subset: shows every phase working.
    "tiny": {
        "backbone": "cifar_resnet8",
        "batch_size": 64,
        "backbone_epochs": 8,
        "backbone_lr": 0.05,
        "partition_epochs": 1,
        "distill_epochs": 2,
        "finetune_epochs": 3,
        "finetune_random_subnets": 1,
        "eval_variants": 50,
        "calibration_samples": 512,
    },
    # Full CIFAR-10 ResNet-18 on one GPU (about 13 minutes on an H100 alone, 2026-11-26):
    # the original trained from scratch, then frozen; widths (inner and stream), low-rank and
    # depth as alternatives, in-place distilled from it, four subnets a step. Half the random
    # subnets are width levels and they leave at the last two exits: with 160 fine-tuning
    # epochs this moved the best variant within 2 points from 4.2x to 5.9x faster (ONNX Runtime on
    # the project's 2-core CI CPU, 2026-11-26: benchmarks/supernet/results/headline_r18.json).
    "cifar10": {
        "backbone": "resnet18",
        "operators": ("w75", "w50", "w25", "lr50", "skip", "sw75", "sw50", "sw25"),
        "batch_size": 512,
        "backbone_epochs": 60,
        "backbone_lr": 0.2,
        "partition_epochs": 2,
        "partition_lr": 0.05,
        "distill_epochs": 4,
        "distill_lr": 0.05,
        "finetune_epochs": 160,
        "finetune_lr": 0.05,
        "finetune_random_subnets": 3,
        "finetune_structured_share": 0.5,
        "finetune_exits": "late",
        "eval_variants": 50,
    },
    # The shipped supernet (hmt/data/embedded/supernet-cifar-resnet56): the pretrained CIFAR
    # ResNet-56 (pass --pretrained ../shared/models/resnet-cifar10/resnet56-4bfd9763.th), kept
    # exact, elastified.
    "cifar-resnet56": {
        "backbone": "cifar_resnet56",
        # A smaller space than ResNet-18's (depth, inner width 75/50%, stream 75/50%): with
        # every option of cifar10 the first ResNet-56 run left no variant within 5 points.
        "operators": ("w75", "w50", "skip", "sw75", "sw50"),
        "batch_size": 512,
        # The akamaster weights were trained on PNG pixels with ImageNet normalisation:
        # phase 1 fine-tunes them to this data (JPEG copy, CIFAR statistics), then freezes.
        "backbone_epochs": 15,
        "backbone_lr": 0.02,
        "partition_epochs": 3,
        "partition_lr": 0.05,
        "distill_epochs": 3,
        "distill_lr": 0.05,
        "finetune_epochs": 120,
        "finetune_lr": 0.03,
        "finetune_random_subnets": 3,
        # The ResNet-18 recipe's width levels and late exits (see cifar10), since 2026-11-26's
        # retraining (benchmarks/supernet/results/headline_shipped.json).
        "finetune_structured_share": 0.5,
        "finetune_exits": "late",
        "eval_variants": 50,
        "calibration_samples": 640,  # the artifact stays under 10 MB
    },
    "basicmotions": {
        "backbone": "conv1d",
        "dataset": "basicmotions",
        "batch_size": 16,
        "val_fraction": 0.2,
        "backbone_epochs": 60,
        "backbone_lr": 0.05,
        "partition_epochs": 5,
        "distill_epochs": 20,
        "finetune_epochs": 40,
        "finetune_lr": 0.02,
        "eval_variants": 50,
        "label_smoothing": 0.0,
    },
    "fsdd": {
        "backbone": "conv1d",
        "dataset": "fsdd",
        "batch_size": 64,
        "backbone_epochs": 30,
        "backbone_lr": 0.05,
        "partition_epochs": 2,
        "distill_epochs": 5,
        "finetune_epochs": 15,
        "eval_variants": 50,
    },
}
