"""The block latency table (AdaptiveNet 5.1): every block choice timed at its real shape.

Each (position, choice) of the supernet, stem and exit heads included, is timed alone on
the engine (ONNX Runtime by default: exported to ONNX in memory) at batch 1 and at any
further batch asked for. The engine's fixed cost per run is measured on a pass-through
model (one Identity node) at the same input size and kept separately: a variant's
predicted latency is that fixed cost once plus the sum of its blocks' costs net of it
(``predictor``). Both are times per call under sustained load (``timing.sustained_ms``):
a variant runs its blocks back to back, so a block pays its share of any CPU budget's
stalls, which its per-call median (``latency_ms``, kept) would not see; time spent waiting
for a CPU that other processes held is left out, as the median leaves it out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hmt.profile.features import LayerFeature, block_totals, layer_features
from hmt.profile.timing import Runner
from hmt.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn


class BlockRef(Protocol):
    position: str
    choice: str
    module: nn.Module
    input_shape: tuple[int, ...]


BLOCK_UNITS = {"position": "name", "choice": "name", "batch": "count", "input_shape": "shape",
               "macs": "MAC", "bytes_moved": "byte", "intensity": "MAC/byte", "n_layers": "count",
               "overhead_ms": "ms", "net_ms": "ms"}


def measure_block_table(
    blocks: Iterable[BlockRef], runner: Runner, *, batches: Sequence[int] = (1,), warmup: int = 5,
    repeats: int = 30, progress: ProgressCallback = no_progress,
) -> tuple[pd.DataFrame, dict[tuple[str, str, int], list[LayerFeature]]]:
    """One row per (position, choice, batch) with latency, spread, conditions and features,
    and each row's per-layer features (for the eq. 2 fit on blocks)."""
    import pandas as pd

    refs = list(blocks)
    rows: list[dict[str, Any]] = []
    layers: dict[tuple[str, str, int], list[LayerFeature]] = {}
    overheads: dict[tuple[int, ...], float] = {}
    total = len(refs) * len(batches)
    done = 0
    for ref in refs:
        for batch in batches:
            shape = (batch, *ref.input_shape)
            if shape not in overheads:
                overheads[shape] = runner.overhead_ms(shape, warmup=warmup, repeats=repeats)
            features = layer_features(ref.module, ref.input_shape, batch=batch)  # on CPU, before any move
            measurement = runner.time(ref.module, shape, warmup=warmup, repeats=repeats)
            layers[(ref.position, ref.choice, batch)] = features
            totals = block_totals(features)
            rows.append({
                "position": ref.position, "choice": ref.choice, "batch": batch,
                "input_shape": "x".join(str(d) for d in ref.input_shape),
                **measurement.row(),
                "macs": totals["macs"], "bytes_moved": totals["bytes_moved"], "intensity": totals["intensity"],
                "n_layers": int(totals["n_layers"]), "overhead_ms": overheads[shape],
                "net_ms": max(0.0, measurement.sustained_or_median_ms - overheads[shape]),
            })
            done += 1
            progress("block table", done, total, f"{ref.position}/{ref.choice} b{batch}")
    return pd.DataFrame(rows), layers
