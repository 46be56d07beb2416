"""Built-in backbones as data: a stem, stages of block specs and a head.

``register_backbone`` maps a name to a builder; ``BACKBONES`` lists them, and tests are
parametrised from it so a new backbone is tested without new test code.
"""

# Importing the families registers them (explicit list, no star-import magic).
from hmt.supernet.backbones import cifar_resnet, conv1d, mobilenetv2, resnet, vgg  # noqa: F401
from hmt.supernet.backbones.registry import BACKBONES, BackboneDef, StageDef, build_backbone_def, register_backbone

__all__ = ["BACKBONES", "BackboneDef", "StageDef", "build_backbone_def", "register_backbone"]
