"""Training configuration: one frozen dataclass, presets, and loading from a JSON file.

Resolution order: preset -> config file -> command-line overrides. The resolved config
goes into the artifact's manifest and its hash guards resume (a checkpoint made with
another config is never silently continued).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hmt.artifacts.jsondoc import parse_json
from hmt.errors import InputError, UsageError
from hmt.supernet.presets import PRESETS  # the registry, re-exported here

PARTITION_MODES = ("freeze", "update-if-better")
FINETUNE_EXITS = ("uniform", "late")


@dataclass(frozen=True)
class TrainConfig:
    backbone: str = "cifar_resnet20"
    dataset: str = "cifar10"
    data_path: str | None = None  # None: the small CIFAR-10 subset embedded in the repo
    pretrained: str | None = None  # the original network's weights (torch.load weights_only)
    operators: tuple[str, ...] | None = None  # None: every operator the block kind admits
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    batch_size: int = 128
    val_fraction: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    label_smoothing: float = 0.1
    amp: bool = True  # bf16 autocast on CUDA; ignored on CPU
    # Phase 1: the backbone (or the pretrained network fine-tuned to the data).
    backbone_epochs: int = 2
    backbone_lr: float = 0.1
    # Phase 2: multi-stage partition training (AdaScale Algorithm 1), epochs per partition.
    partition_epochs: int = 1
    partition_lr: float = 0.02
    partition_mode: str = "freeze"
    # Phase 3: branch-wise feature distillation of every alternative (AdaptiveNet eq. 1).
    distill_epochs: int = 1
    distill_lr: float = 0.05
    # Elastified models only: more distillation epochs, after phase 3, for the operators
    # that start from random weights (dws), which phase 3's shared epochs leave behind.
    # 0 (the default) adds none; about distill_epochs is a reasonable length.
    distill_fresh_epochs: int = 0
    # Phase 4: sampled-subnet fine-tuning (largest + smallest + random; the largest teaches).
    finetune_epochs: int = 1
    finetune_lr: float = 0.02
    finetune_random_subnets: int = 2
    # Share of the random subnets drawn as width levels (SearchSpace.sample_structured)
    # instead of a uniform choice per block; 0 keeps plain uniform sampling.
    finetune_structured_share: float = 0.0
    # Share of those width levels drawn tied (one level for the stream and the inner widths:
    # the width-multiplier networks, where the fronts' fast accurate variants sit); 0 keeps
    # independent levels.
    finetune_tied_share: float = 0.0
    # Exits of the random subnets: "uniform" over stages, or "late" (the last two stages
    # only), where a front's accurate variants leave; early exits still learn from the
    # original's logits every step.
    finetune_exits: str = "uniform"
    kd_temperature: float = 1.0
    exit_loss_weight: float = 0.5
    # AdaptiveNet: after phase 1 the user's network is frozen (weights and BN statistics), so
    # the largest variant is the original, exact, and teaches every other variant. True
    # fine-tunes the original along with the alternatives (AdaScale Alg. 1 partitions
    # update it, and the largest trains on labels during sandwich fine-tuning).
    finetune_original: bool = False
    # The per-variant table.
    eval_variants: int = 50
    # Training images stored in the artifact to re-estimate each variant's BN statistics.
    calibration_samples: int = 2048
    eval_batch_size: int = 512
    max_train_samples: int | None = None  # cap for quick runs and tests
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> TrainConfig:
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0.0 < self.val_fraction < 0.9:
            raise UsageError(f"val_fraction must be in (0, 0.9), got {self.val_fraction}")
        if self.partition_mode not in PARTITION_MODES:
            raise UsageError(f"partition_mode must be one of {PARTITION_MODES}, got {self.partition_mode!r}")
        for name in (
            "backbone_epochs",
            "partition_epochs",
            "distill_epochs",
            "distill_fresh_epochs",
            "finetune_epochs",
            "eval_variants",
            "finetune_random_subnets",
        ):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.calibration_samples < 1:
            raise UsageError(f"calibration_samples must be >= 1, got {self.calibration_samples}")
        for name in ("backbone_lr", "partition_lr", "distill_lr", "finetune_lr"):
            if not 0.0 < getattr(self, name) <= 10.0:
                raise UsageError(f"{name} must be in (0, 10], got {getattr(self, name)}")
        for name in ("finetune_structured_share", "finetune_tied_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.finetune_exits not in FINETUNE_EXITS:
            raise UsageError(f"finetune_exits must be one of {FINETUNE_EXITS}, got {self.finetune_exits!r}")
        if self.max_train_samples is not None and self.max_train_samples < 10:
            raise UsageError(f"max_train_samples must be >= 10, got {self.max_train_samples}")
        return self

    def to_json_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["operators"] = list(self.operators) if self.operators is not None else None
        return data

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json_dict(), sort_keys=True).encode()).hexdigest()[:16]


def portable_config(data: dict[str, Any], out_dir: Path | str) -> dict[str, Any]:
    """``data`` (a ``to_json_dict``) as an artifact records it: input paths relative to ``out_dir``."""
    from hmt.artifacts.paths import relative_to_artifact

    out = dict(data)
    for key in ("data_path", "pretrained"):
        if out.get(key):
            out[key] = relative_to_artifact(out[key], out_dir)
    extra = dict(out.get("extra") or {})
    if isinstance(extra.get("elastify"), dict):
        spec = dict(extra["elastify"])
        for key in ("file", "weights"):
            if spec.get(key):
                spec[key] = relative_to_artifact(spec[key], out_dir)
        extra["elastify"] = spec
        out["extra"] = extra
    return out


def _coerce(name: str, value: Any, source: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    if name not in fields:
        raise UsageError(f"{source}: unknown training option {name!r}; known: {', '.join(sorted(fields))}")
    if name == "operators" and value is not None:
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"{source}: 'operators' must be a list of operator names")
        return tuple(str(v) for v in value)
    default = fields[name].default
    if isinstance(default, bool) and not isinstance(value, bool):
        raise UsageError(f"{source}: {name!r} must be true or false, got {value!r}")
    if isinstance(default, int) and not isinstance(default, bool) and not isinstance(value, int):
        raise UsageError(f"{source}: {name!r} must be an integer, got {value!r}")
    if isinstance(default, float) and not isinstance(value, (int, float)):
        raise UsageError(f"{source}: {name!r} must be a number, got {value!r}")
    return value


def resolve_config(
    *, preset: str | None = None, config_file: Path | None = None, overrides: dict[str, Any] | None = None
) -> TrainConfig:
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise UsageError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
        values.update(PRESETS[preset])
    if config_file is not None:
        try:
            raw = Path(config_file).read_bytes()
        except FileNotFoundError as exc:
            raise InputError(f"{config_file}: does not exist; expected a JSON config file") from exc
        except OSError as exc:
            raise InputError(f"{config_file}: cannot be read ({exc.strerror or exc}); expected a JSON config "
                             "file") from exc
        loaded = parse_json(raw, config_file, error=InputError)
        if not isinstance(loaded, dict):
            raise InputError(f"{config_file}: expected a JSON object of training options")
        for key, value in loaded.items():
            values[key] = _coerce(key, value, str(config_file))
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = _coerce(key, value, "command line")
    return TrainConfig(**values).validate()
