"""Time a variant's chain at two precisions on this host, in one alternating loop.

The full-depth path (every segment, then the last exit head) runs under ONNX Runtime's
CPU provider (or CUDA where ``device="cuda"`` and the provider is installed) at the
``all`` level, as fuse's baseline does; fp32 and the quantised chain alternate in rounds
of bursts (``hmt.fuse.engines.timing.measure_rounds``), so background load hits both alike
and the ratio of their medians is the figure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from hmt.fuse.engines.timing import Timing


def path_runner(segments: Sequence[onnx.ModelProto], exits: Sequence[onnx.ModelProto], x: np.ndarray, *,
                threads: int = 0, device: str = "cpu", merged: bool = False) -> Callable[[], list[Any]]:
    """A zero-argument callable running segment 0..n-1 then the last exit head on ``x``.

    ``merged``: the path as one graph (``hmt.fuse.engines.ort.merge_chain``, fuse's chain
    candidate): one ORT call, and for INT8 no dequantise/quantise at the graph boundaries.
    """
    from hmt.fuse.engines.ort import OrtConfig, merge_chain
    from hmt.fuse.runtime import chain, ort_step

    config = OrtConfig(intra_op_threads=threads)
    models = [*segments, exits[-1]]
    if merged and len(models) > 1:
        models = [merge_chain(models)]
    steps = [ort_step(m.SerializeToString(), config, device) for m in models]
    names = [m.graph.input[0].name for m in models]
    return chain(steps, {names[0]: x}, names[1:])


def time_chains(chains: Mapping[str, tuple[Sequence[onnx.ModelProto], Sequence[onnx.ModelProto]]], x: np.ndarray,
                *, threads: int = 0, device: str = "cpu", repeats: int = 40, burst: int = 20, drop: int = 4,
                merged: bool = False) -> dict[str, Timing]:
    """Median-ready timings of each labelled chain's full-depth path on input ``x``.

    As fuse times (:func:`hmt.fuse.engines.timing.measure_rounds`): rounds of alternating
    bursts of ``burst`` calls, the first ``drop`` untimed, at least ``repeats`` timed calls
    each (at least 3 rounds); a chain's median is the median of its round medians."""
    from hmt.fuse.engines.timing import measure_rounds

    runners = {label: path_runner(segs, exits, x, threads=threads, device=device, merged=merged)
               for label, (segs, exits) in chains.items()}
    drop = min(drop, burst - 1)
    rounds = max(3, -(-repeats // (burst - drop)))
    return measure_rounds(runners, rounds=rounds, burst=burst, drop=drop, warmup=5, drop_slower_than=None)


__all__ = ["path_runner", "time_chains"]
