"""Offline check of the composition correction on a profile that already has a validation table.

The validation variants of a profile (measured end to end, idle) are split at random: the
correction is fitted on ``--train`` of them (standing in for the calibration variants) and
scored on the rest, raw block-table sum vs corrected, over ``--splits`` splits; also
leave-one-out. Uses the library's fit (hmt/profile/composition.py) and features
(Predictor.composition_features), so it measures what ``--calibrate-variants`` would do.

    python -m benchmarks.profile.composition_cv runs/profile-h100 runs/r20gpu --batch 64 --train 12
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.harness import Driver

BENCH = Driver(
    baseline="the raw block-table sum (no correction) on the same held-out variants",
    needs="a profile with a validation table and its supernet (PROFILE SUPERNET)",
)


def main() -> int:
    from hmt.profile import load_profile
    from hmt.profile.composition import CompositionModel, fit_composition
    from hmt.profile.fits import kendall_tau, mape, share_within
    from hmt.profile.predictor import Predictor
    from hmt.supernet import load_supernet

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile")
    parser.add_argument("supernet")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--train", type=int, default=12)
    parser.add_argument("--splits", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the summary here (JSON)")
    args = parser.parse_args()

    profile = load_profile(args.profile)
    predictor = Predictor(profile)
    loaded = load_supernet(args.supernet)
    table = profile.table("validation")
    idle = table[table.condition == "idle"].reset_index(drop=True)
    features = [predictor.composition_features(loaded.net.variant_blocks(loaded.space.parse(a)), batch=args.batch)
                for a in idle.arch_id]
    y = idle.measured_ms.to_numpy(float)
    raw = np.array([f.raw_ms for f in features])

    def metrics(measured: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
        return {"kendall_tau": kendall_tau(measured, predicted), "mape": mape(measured, predicted),
                "within_10pct": share_within(measured, predicted, 0.10)}

    def fitted(rows: np.ndarray) -> CompositionModel:
        fit = fit_composition([features[i] for i in rows], y[rows].tolist(), seed=args.seed)
        return CompositionModel.from_fit(fit, batch=args.batch)

    rng = np.random.default_rng(args.seed)
    splits: dict[str, list[dict[str, float]]] = {"raw": [], "corrected": []}
    n = len(y)
    for _ in range(args.splits):
        order = rng.permutation(n)
        train, test = order[: args.train], order[args.train:]
        model = fitted(train)
        splits["raw"].append(metrics(y[test], raw[test]))
        splits["corrected"].append(metrics(y[test], np.array([model.apply(features[i]) for i in test])))
    loo = np.array([fitted(np.delete(np.arange(n), i)).apply(features[i]) for i in range(n)])
    full = fitted(np.arange(n))
    summary = {
        "profile": args.profile, "variants": n, "train": args.train, "test": n - args.train, "splits": args.splits,
        "all_variants": {"raw": metrics(y, raw), "corrected_loo": metrics(y, loo)},
        "fit_on_all": {"a_scale": full.a_scale, "b_ms_per_block": full.b_ms_per_block,
                       "l_ms_per_layer": full.l_ms_per_layer, "c_ms": full.c_ms},
        "held_out": {kind: {stat: {q: float(np.percentile([r[stat] for r in rows], p))
                                   for q, p in (("p10", 10), ("median", 50), ("p90", 90))}
                            for stat in ("kendall_tau", "mape", "within_10pct")}
                     for kind, rows in splits.items()},
    }
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
