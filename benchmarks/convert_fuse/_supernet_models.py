"""Largest and smallest supernet variants as ``hmt convert --model`` factories (benchmarks only).

With ``HMT_BENCH_SUPERNET=<artifact dir>`` the variants come from a trained supernet
artifact; otherwise from a freshly built supernet with random weights of the backbone
``HMT_BENCH_BACKBONE`` (default ``resnet18``, the backbone of the cifar10 preset): latency does not depend on weights.
"""

from __future__ import annotations

import os
from typing import Any


def _supernet() -> tuple[Any, Any]:
    import torch

    artifact = os.environ.get("HMT_BENCH_SUPERNET")
    if artifact:
        from hmt.supernet import load_supernet

        loaded = load_supernet(artifact)
        return loaded.net, loaded.space
    from hmt.supernet import build_supernet

    torch.manual_seed(0)
    net = build_supernet(os.environ.get("HMT_BENCH_BACKBONE", "resnet18"), num_classes=10,
                         input_shape=(3, 32, 32)).eval()
    return net, net.space


def largest() -> Any:
    net, space = _supernet()
    return net.materialize(space.largest())


def smallest() -> Any:
    net, space = _supernet()
    return net.materialize(space.smallest())
