"""Write a CIFAR-10-C-style shift set from the CIFAR-10 test split (a ``shift-set`` artifact).

    PYTHONPATH=$PWD python3 scripts/make_corruptions.py --data ../shared/datasets/cifar10-jpeg \
        --out runs/cifar10-c --severity 3 --severity 5 --seed 0

Six corruptions (gaussian_noise, shot_noise, defocus_blur, brightness, contrast,
jpeg_compression) with the published CIFAR-10-C parameters; ``--limit N`` keeps a
class-balanced subset of the 10,000 test images (the first N/10 of each class in the
reader's (class, file name) order) for quick runs. ``hmt adapt ... --data OUT`` reads it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from hmt.adapt.corruptions import CORRUPTIONS, write_shift_set
from hmt.data import load_dataset
from hmt.errors import HmtError


def balanced_subset(labels: np.ndarray, limit: int) -> np.ndarray:
    classes = np.unique(labels)
    per_class = max(1, limit // len(classes))
    return np.sort(np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in classes]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True,
                        help="CIFAR-10 source (e.g. ../shared/datasets/cifar10-jpeg)")
    parser.add_argument("--out", type=Path, required=True, help="output shift-set directory (replaced atomically)")
    parser.add_argument("--severity", type=int, action="append", help="severity 1..5 (repeatable; default 3 and 5)")
    parser.add_argument("--corruption", action="append", choices=list(CORRUPTIONS),
                        help="corruption (repeatable; default all six)")
    parser.add_argument("--limit", type=int, default=None, help="class-balanced subset of the test split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1,
                        help="processes making sets in parallel (the sets do not depend on it)")
    args = parser.parse_args(argv)
    try:
        dataset = load_dataset("cifar10", args.data)
        x, y = dataset.test
        if args.limit is not None:
            keep = balanced_subset(y, args.limit)
            x, y = x[keep], y[keep]
        start = time.perf_counter()

        def progress(task: str, done: int, total: int | None, info: str | None = None) -> None:
            print(f"{task}: {done}/{total} {info or ''} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)

        names = write_shift_set(
            args.out, x, y,
            corruptions=args.corruption or list(CORRUPTIONS),
            severities=args.severity or [3, 5],
            seed=args.seed,
            source={"dataset": dataset.info.source, "sha256": dataset.info.source_sha256, "split": "test",
                    "limit": str(args.limit)},
            progress=progress,
            workers=args.workers,
        )
    except HmtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"wrote {args.out}: {len(y)} images x ({', '.join(names)}) + clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
