"""Branch-wise distillation for an elastified supernet (AdaptiveNet eq. 1), stream widths
included: every block runs one randomly drawn alternative on the frozen original's input
features and matches the original's output (MSE). With stream widths, each step draws a
width per stage (the original's width among them); a block on a slim stream runs its slim
unit on the original's input channels it keeps and matches the output channels it keeps,
the stem and the head likewise. ``fresh_only`` draws only among the operators that start
from random weights (``FRESH``), for the extra epochs they need."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from hmt.supernet.elastify.stream import FULL
from hmt.supernet.space import WIDTH_KIND

if TYPE_CHECKING:
    from hmt.supernet.elastify.supernet import ElastifiedSupernet

# Operators whose weights start random (the others start from the original's weights).
FRESH = ("dws",)


@torch.no_grad()
def _original_io(net: ElastifiedSupernet, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor],
                                                                     list[torch.Tensor], torch.Tensor]:
    was_training = net.training
    net.eval()
    stem = net.stem(x)
    h, inputs, outputs = stem, [], []
    for p in range(len(net.space.positions)):
        inputs.append(h)
        h = net.blocks[p](h)
        outputs.append(h)
    logits = net.exits[-1](h)
    net.train(was_training)
    return stem, inputs, outputs, logits


def _pick(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return x if index is None else x.index_select(1, index)


def distill_loss(net: ElastifiedSupernet, x: torch.Tensor, rng: np.random.Generator, *,
                 fresh_only: bool = False) -> torch.Tensor:
    stem, inputs, targets, logits = _original_io(net, x)
    space, stream = net.space, net.stream
    widths = ["base"] * space.num_stages
    if stream is not None and not fresh_only:
        for s in range(space.num_stages):
            levels = ("base", *stream.levels[s])
            widths[s] = levels[int(rng.integers(len(levels)))]
    losses = []
    if stream is not None and widths[0] != "base":
        out = stream.stem_units[widths[0]](x)
        losses.append(F.mse_loss(out.float(), _pick(stem, stream.index(-1, widths[0])).float()))
    in_w, last_p = widths[0], -1
    for p, pos in enumerate(space.positions):
        if pos.kind == WIDTH_KIND:
            continue
        out_w, last_p = widths[pos.stage], p
        slim = (in_w, out_w) != ("base", "base")
        if slim:
            options = [c for c in (FULL, "w75", "w50", "w25") if c == FULL or c in pos.choices]
        else:
            options = [c for c in pos.choices if c not in ("base", "skip") and (not fresh_only or c in FRESH)]
        if options:
            choice = options[int(rng.integers(len(options)))]
            target = targets[p + 1] if choice == "merge" else targets[p]
            if slim:
                assert stream is not None
                h = _pick(inputs[p], stream.index(stream.previous[p], in_w))
                out = stream.unit(p, choice, in_w, out_w)(h)
                target = _pick(target, stream.index(p, out_w))
            else:
                out = net.blocks[p](inputs[p], choice)
            losses.append(F.mse_loss(out.float(), target.float()))
        in_w = out_w
    last_w = widths[-1]
    if stream is not None and last_w != "base" and last_p >= 0:
        out = stream.head_units[last_w](_pick(targets[last_p], stream.index(last_p, last_w)))
        losses.append(F.mse_loss(out.float(), logits.float()))
    if not losses:
        return torch.zeros((), device=x.device, requires_grad=True)
    return torch.stack(losses).mean()
