"""The data a quantised variant is calibrated and checked on, as float32 arrays.

Both ``hmt.convert`` (quantising the variants it converts) and ``hmt.pareto`` (pricing
quantised copies of the front) read it, so it lives here, below both: it needs only the
supernet's stored calibration set and held-out samples already loaded by the caller.
"""

from __future__ import annotations

from typing import Any

# Held-out samples are normalised in batches of this many (the result does not depend on it).
_BATCH = 512


def held_out_arrays(data: Any) -> tuple[Any, Any]:
    """Held-out samples (``hmt.pareto.data.HeldOut``: ``x``, ``y``, ``info``) normalised as the
    supernet was trained: float32 inputs, labels."""
    import numpy as np

    from hmt.data import eval_loader

    batches = list(eval_loader(data.x, data.y, info=data.info, batch_size=_BATCH, device="cpu", channels_last=False))
    return (np.concatenate([xb.numpy() for xb, _ in batches]).astype(np.float32),
            np.concatenate([yb.numpy() for _, yb in batches]))


def calibration_array(loaded: Any) -> Any:
    """The supernet's stored calibration images (``hmt.supernet.load_supernet``), normalised,
    as one float32 array."""
    import numpy as np

    return np.concatenate([b.numpy() for b in loaded.calibration_batches()]).astype(np.float32)


__all__ = ["calibration_array", "held_out_arrays"]
