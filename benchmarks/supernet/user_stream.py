"""Issue 22: strong originals elastified through the user path, one summary per original.

Reads what a GPU run and this machine measured and puts it side by side, per original:
- the front CSV (``front.py``: validation and test accuracy, MACs per variant);
- the run's ``history.json`` (GPU seconds per training phase);
- the headline report (``headline.py``: candidates chosen on the validation split, timed
  with ONNX Runtime against the original in alternating bursts);
- the targets of the issue, and the standalone ladder where one exists (the same
  architecture trained alone), so each figure stands beside what it has to beat.

    python -m benchmarks.supernet user_stream \\
        --model r18 benchmarks/supernet/results/user_r18_front.csv runs/r18-history.json runs/r18-headline.json \\
        --target r18 4 6 --out report.json
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver


def phase_seconds(history: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """GPU seconds and epochs per training phase, in the order the phases ran."""
    phases: OrderedDict[str, dict[str, float]] = OrderedDict()
    for row in history:
        phase = phases.setdefault(str(row["phase"]), {"seconds": 0.0, "epochs": 0})
        phase["seconds"] += float(row["epoch_s"])
        phase["epochs"] += 1
    return {k: {"seconds": round(v["seconds"], 1), "epochs": int(v["epochs"])} for k, v in phases.items()}


def mac_front(rows: list[dict[str, Any]], largest: dict[str, Any], select: str = "val_acc",
              report: str = "test_acc") -> dict[str, Any]:
    """Fewest MACs within 1 and 2 points of the original, chosen on ``select`` (validation accuracy, or
    test half A for an original that has seen the validation split), reported on ``report``."""
    out: dict[str, Any] = {"selected_on": select, "reported_on": report}
    for margin in (1, 2):
        within = [r for r in rows if float(r[select]) >= float(largest[select]) - margin / 100 - 1e-9]
        best = min(within, key=lambda r: r["macs"])
        out[f"within_{margin}pt"] = {"arch_id": best["arch_id"], select: float(best[select]),
                                     report: float(best[report]), "original_" + report: float(largest[report]),
                                     "mac_reduction": round(largest["macs"] / best["macs"], 2)}
    return out


def summarise_model(name: str, front: Path, history: Path, headline: Path | None,
                    targets: tuple[float, float] | None, test_half: bool = False) -> dict[str, Any]:
    rows = [dict(r, val_acc=float(r["val_acc"]), test_acc=float(r["test_acc"]), macs=int(r["macs"]))
            for r in csv.DictReader(front.open())]
    largest = max(rows, key=lambda r: r["macs"])
    if test_half and not {"test_a_acc", "test_b_acc"} <= set(largest):
        sys.exit(f"{front}: --test-half {name} needs test_a_acc and test_b_acc columns "
                 "(benchmarks.supernet.front writes them)")
    doc: dict[str, Any] = {
        "original": {"arch_id": largest["arch_id"], "val_acc": largest["val_acc"], "test_acc": largest["test_acc"],
                     "macs": largest["macs"]},
        "variants_evaluated": len(rows),
        "gpu_seconds_per_phase": phase_seconds(json.loads(history.read_text())),
        "fewest_macs": mac_front(rows, largest, *(("test_a_acc", "test_b_acc") if test_half else ())),
    }
    if headline is not None:
        report = json.loads(headline.read_text())
        report = report.get("results", report)  # a harness result or the driver's own report
        doc["timed"] = {key: report.get(key) for key in ("selected_on", "best_within_1pt", "best_within_2pt")}
        doc["timed"]["original_latency_ms"] = report["original"]["latency_ms"]
        doc["timed"]["machine"] = report.get("machine")
    if targets is not None:
        doc["targets"] = {"speedup_within_1pt": targets[0], "speedup_within_2pt": targets[1]}
        timed = doc.get("timed") or {}
        for margin, target in ((1, targets[0]), (2, targets[1])):
            best = timed.get(f"best_within_{margin}pt")
            if target > 0:
                doc["targets"][f"met_within_{margin}pt"] = bool(best and best["speedup"] >= target)
    return doc


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    claims = []
    for name, doc in report["models"].items():
        timed = doc.get("timed") or {}
        if not timed:  # not timed: the front's fewest MACs within each margin
            front = doc["fewest_macs"]
            report_on = front.get("reported_on", "test_acc")
            for margin in (1, 2):
                best = front[f"within_{margin}pt"]
                claims.append({"claim": f"{name}: fewest MACs within {margin} point(s), chosen on "
                                        f"{front.get('selected_on', 'val_acc')} (not timed)",
                               "figure": f"{best['mac_reduction']:.2f}x fewer MACs at {best[report_on] * 100:.2f} % "
                                         f"{report_on} (original {best['original_' + report_on] * 100:.2f} %)"})
            continue
        for margin in (1, 2):
            best = timed.get(f"best_within_{margin}pt")
            target = (doc.get("targets") or {}).get(f"speedup_within_{margin}pt")
            figure = (f"{best['speedup']:.2f}x at {best['test_acc'] * 100:.2f} % test (original "
                      f"{doc['original']['test_acc'] * 100:.2f} %)" if best else "no timed variant")
            if target:
                figure += f"; target {target}x"
            claims.append({"claim": f"{name}: fastest variant within {margin} point(s), chosen on validation, "
                                    "ORT batch 1, 1 thread", "figure": figure})
    return claims


BENCH = Driver(
    baseline="each original itself (the largest variant, bit-exact), timed in the same loop as every candidate",
    needs="front CSVs, training histories and headline reports of a GPU run (--model NAME FRONT HISTORY HEADLINE)",
    claims=_claims,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", nargs=4, action="append", required=True,
                        metavar=("NAME", "FRONT_CSV", "HISTORY_JSON", "HEADLINE_JSON"),
                        help="one original (HEADLINE_JSON may be '-' when it was not timed)")
    parser.add_argument("--target", nargs=3, action="append", default=[], metavar=("NAME", "X_1PT", "X_2PT"),
                        help="the issue's speed-up targets for NAME within 1 and 2 points (0: none)")
    parser.add_argument("--test-half", action="append", default=[], metavar="NAME",
                        help="choose NAME's variants on test half A and report half B (an original pretrained on "
                             "every training image has seen the validation split; front.py writes both halves)")
    parser.add_argument("--note", action="append", default=[], help="a sentence kept in the report (repeatable)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    targets = {name: (float(a), float(b)) for name, a, b in args.target}
    models = {name: summarise_model(name, Path(front), Path(history), None if headline == "-" else Path(headline),
                                    targets.get(name), name in args.test_half)
              for name, front, history, headline in args.model}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"models": models, "notes": args.note}, indent=2))


if __name__ == "__main__":
    main()
