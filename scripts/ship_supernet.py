"""Make a supernet artifact fit to ship inside the repository (``hmt/data/embedded``): the same
files, verified on load, written again under a manifest that names no path of the machine that
trained it, and refused if it is over the size limit.

- ``data_path``: null (the data source stays recorded by name and sha256 in ``supernet.json``);
- an elastified model's ``file`` and ``weights``: their file names (their sha256 are recorded in
  ``extra.provenance``);
- parents: none (they stayed on the training machine; a specialization's parent stays named by
  its manifest sha256 in ``extra.specialize``);
- the training machine's environment moves to ``extra.trained_with``, the metrics stay.

    python scripts/ship_supernet.py SRC DST [--max-mb 10]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def portable(config: dict[str, Any], environment: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(config))
    out["data_path"] = None
    if out.get("pretrained"):
        out["pretrained"] = Path(str(out["pretrained"])).name
    extra = out.setdefault("extra", {})
    elastify = extra.get("elastify") or {}
    for key in ("file", "weights"):
        if elastify.get(key):
            elastify[key] = Path(str(elastify[key])).name
    extra["trained_with"] = environment
    return out


def machine_paths(root: Path) -> list[str]:
    """Strings in the artifact's JSON files that look like a path of a machine."""
    found: list[str] = []

    def walk(value: Any, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, str) and (value.startswith(("/", "~")) or "../" in value or ":\\" in value):
            found.append(f"{where} = {value!r}")

    for path in sorted(root.glob("*.json")):
        walk(json.loads(path.read_text()), path.name)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--max-mb", type=float, default=10.0, help="size limit of the whole artifact (1e6 bytes)")
    args = parser.parse_args()

    from hmt.artifacts import ArtifactWriter
    from hmt.supernet import load_supernet

    loaded = load_supernet(args.src)  # verifies every file's sha256
    artifact = loaded.artifact
    size_mb = sum(r.size_bytes for r in artifact.manifest.files) / 1e6
    if size_mb > args.max_mb:
        print(f"{args.src}: {size_mb:.2f} MB of files, over the {args.max_mb:g} MB limit", file=sys.stderr)
        return 1
    config = portable(dict(artifact.manifest.config), dict(artifact.manifest.environment))
    with ArtifactWriter(args.dst, kind=artifact.kind, config=config) as writer:
        for record in artifact.manifest.files:
            shutil.copyfile(artifact.file(record.path), writer.path(record.path))
        writer.metrics.update(artifact.manifest.metrics)
    found = machine_paths(args.dst)
    if found:
        print("paths of a machine left in the shipped artifact:\n  " + "\n  ".join(found), file=sys.stderr)
        return 1
    load_supernet(args.dst)
    print(f"wrote {args.dst}: {size_mb:.2f} MB, {len(artifact.manifest.files)} files, no machine path")
    return 0


if __name__ == "__main__":
    from hmt.errors import HmtError

    try:
        raise SystemExit(main())
    except HmtError as exc:  # a bad input: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
