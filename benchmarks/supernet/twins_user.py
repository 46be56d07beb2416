"""Issue 22: the user's ResNet-18 originals and the twins of its specialized width variants, each
trained alone on the same 45k training split with the original's recipe
(``python -m benchmarks.supernet.originals``, jobs of ``scripts/gpu_originals.sh``).

Reads the originals' result files (``--original NAME=JSON``), the twins' (``--twin ARCH=JSON``, the
arch id without its space tag) and the specialization summaries that ``benchmarks.supernet
specialized`` wrote (``--specialized JSON``). For every twin it takes the specialized variant of the
same architecture that is best on the validation split and reports both splits side by side:

    python -m benchmarks.supernet twins_user --original r18-e300=R18_E300.json \\
        --twin e3.555555555555=TWIN_W50.json --specialized benchmarks/supernet/results/specialized_long.json \\
        --out REPORT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver


def _pairs(items: list[str], option: str) -> list[tuple[str, Path]]:
    out = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"{option} {item!r}: expected NAME=JSON")
        if not Path(path).is_file():
            raise SystemExit(f"{option} {item!r}: {path} is not a file (a result of benchmarks.supernet.originals)")
        out.append((name, Path(path)))
    return out


def _trained_alone(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    results = doc["results"]
    return {"val_acc": results["val_acc"], "test_acc": results["test_acc"], "epochs": results["epochs"],
            "train_images": results["train_images"], "params": results["params"],
            "train_s": round(results["train_s"], 1), "recipe": results.get("recipe"),
            "model": doc["command"].split("--model ", 1)[1].split()[0], "date": doc["date"],
            "revision": doc["revision"], "gpu": doc["machine"].get("gpu")}


def _specialized(paths: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        doc = json.loads(path.read_text())
        r18 = doc["results"]["models"].get("r18")
        if not r18:
            continue
        for spec in r18["specialized"]:
            rows.append({"source": path.name, "revision": doc["revision"], "original": r18["original"],
                         "elastic_finetune_epochs": r18["elastic"]["finetune_epochs"], **spec})
    return rows


def compare(twins: list[tuple[str, Path]], specialized: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per twin: the twin beside the specialized variant of its architecture best on validation."""
    out = []
    for arch, path in twins:
        twin = _trained_alone(path)
        same = [s for s in specialized if s["arch_id"].split(".", 1)[1] == arch]
        row: dict[str, Any] = {"arch": arch, "twin": twin, "specialized": None}
        if same:
            best = max(same, key=lambda s: s["after"]["val_acc"])
            row["specialized"] = {k: best[k] for k in ("name", "source", "epochs", "lr", "elastic_finetune_epochs",
                                                        "speedup", "latency_ms", "original_latency_ms")}
            row["specialized"].update(val_acc=best["after"]["val_acc"], test_acc=best["after"]["test_acc"],
                                      original_val_acc=best["original"]["val_acc"],
                                      original_test_acc=best["original"]["test_acc"])
            row["val_points_vs_twin"] = round(100 * (best["after"]["val_acc"] - twin["val_acc"]), 2)
            row["test_points_vs_twin"] = round(100 * (best["after"]["test_acc"] - twin["test_acc"]), 2)
        out.append(row)
    return out


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    claims = []
    for name, o in report["originals"].items():
        claims.append({"claim": f"ResNet-18 original {name} ({o['epochs']} epochs, batch "
                                f"{(o['recipe'] or {}).get('batch_size')}), trained alone on 45k images",
                       "figure": f"{100 * o['test_acc']:.2f}% test, {100 * o['val_acc']:.2f}% validation"})
    for row in report["twins"]:
        t, s = row["twin"], row["specialized"]
        figure = f"twin {100 * t['test_acc']:.2f}% test / {100 * t['val_acc']:.2f}% val"
        if s:
            figure += (f"; specialized {s['name']} {100 * s['test_acc']:.2f}% / {100 * s['val_acc']:.2f}% "
                       f"({row['test_points_vs_twin']:+.2f} / {row['val_points_vs_twin']:+.2f} points)")
        claims.append({"claim": f"{row['arch']} trained alone ({t['epochs']} epochs, batch "
                                f"{(t['recipe'] or {}).get('batch_size')}) vs specialized", "figure": figure})
    return claims


BENCH = Driver(
    baseline="each architecture trained alone on the same split with the original's recipe",
    needs="result files of benchmarks.supernet.originals and benchmarks.supernet specialized",
    claims=_claims,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--original", action="append", default=[], metavar="NAME=JSON")
    parser.add_argument("--twin", action="append", default=[], metavar="ARCH=JSON")
    parser.add_argument("--specialized", action="append", default=[], type=Path, metavar="JSON")
    parser.add_argument("--note", action="append", default=[])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report = {"originals": {name: _trained_alone(path) for name, path in _pairs(args.original, "--original")},
              "twins": compare(_pairs(args.twin, "--twin"), _specialized(args.specialized)),
              "notes": args.note}
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
