"""Elastify any user model (AdaptiveNet on-cloud elastification, issue 12).

``trace`` (torch.fx, clear refusals) -> ``graph`` (blocks, stem, head, stages) ->
``alternatives`` (width, low rank, depthwise-separable, kernel, skip, merge) ->
``supernet`` (the elastified supernet, original path frozen and exact) -> ``train``
(exits, branch-wise distillation, fine-tuning; the artifact).
"""

from hmt.supernet.elastify.source import TORCHVISION_MODELS, ModelSpec

__all__ = ["TORCHVISION_MODELS", "ModelSpec"]
