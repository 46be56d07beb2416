"""Render benchmarks/README.md's figures from the committed results: ``python -m benchmarks.render [--check]``.

Every ``benchmarks/AREA/results/*.json`` is read (a new driver's result is picked up without
editing this file); each claim becomes one row of its area's table, with the date, the machine
and a link to the result. The README's text above the marker line is kept as written.
``--check`` writes nothing and exits 1 when the README is not what the results render to.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import AREAS, REQUIRED_KEYS, ROOT

README = ROOT / "README.md"
MARKER = "<!-- Everything below is rendered from benchmarks/*/results/*.json by `python -m benchmarks.render`. -->"


class ResultError(ValueError):
    """A result file that cannot be rendered (not JSON, a key missing, a claim malformed)."""


def load_results(root: Path = ROOT) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """Every result, by area: the named areas first, then any other folder holding results/."""
    folders = sorted({p.parent.parent.name for p in root.glob("*/results/*.json")})
    order = [a for a in AREAS if a in folders] + [a for a in folders if a not in AREAS]
    found: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for area in order:
        rows = []
        for path in sorted((root / area / "results").glob("*.json")):
            try:
                doc = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ResultError(f"{path.relative_to(root)}: not JSON ({exc})") from exc
            missing = [key for key in REQUIRED_KEYS if key not in doc]
            if missing:
                raise ResultError(f"{path.relative_to(root)}: missing keys {', '.join(missing)}")
            for claim in doc["claims"]:
                if not isinstance(claim, dict) or not {"claim", "figure"} <= set(claim):
                    raise ResultError(f"{path.relative_to(root)}: a claim needs 'claim' and 'figure': {claim!r}")
            rows.append((path, doc))
        found[area] = rows
    return found


def machine_words(machine: Any) -> str:
    """A short description of a result's machine (cpu, cores, gpu, note)."""
    if isinstance(machine, str):
        return machine
    if not isinstance(machine, dict):
        return "?"
    words = [str(machine.get("cpu") or machine.get("platform") or "?")]
    cores = machine.get("logical_cpus") or machine.get("cpus")
    if cores:
        words.append(f"{cores} CPUs")
    if machine.get("gpu"):
        words.append(str(machine["gpu"]))
    if machine.get("note"):
        words.append(str(machine["note"]))
    return ", ".join(words)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(results: dict[str, list[tuple[Path, dict[str, Any]]]]) -> str:
    """The rendered part of the README (below the marker)."""
    out = [MARKER, ""]
    for area, rows in results.items():
        out += [f"## {area}", "", "| claim | figure | measured | result |", "|---|---|---|---|"]
        for path, doc in rows:
            when = f"{str(doc['date'])[:10]}, `{doc['revision']}`, {machine_words(doc['machine'])}"
            link = f"[{path.name}]({area}/results/{path.name})"
            for claim in doc["claims"]:
                out.append(f"| {_cell(claim['claim'])} | {_cell(claim['figure'])} | {_cell(when)} | {link} |")
            if not doc["claims"]:
                out.append(f"| (no claim: see the result) | | {_cell(when)} | {link} |")
        out.append("")
    return "\n".join(out)


def rendered_readme(readme: Path = README, root: Path = ROOT) -> str:
    text = readme.read_text()
    head = text.split(MARKER, 1)[0].rstrip("\n")
    return head + "\n\n" + render(load_results(root))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is not up to date")
    args = parser.parse_args(argv)
    try:
        new = rendered_readme()
    except ResultError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    if args.check:
        if README.read_text() != new:
            print("benchmarks/README.md is not up to date: run python -m benchmarks.render", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
