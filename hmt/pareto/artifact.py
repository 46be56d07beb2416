"""The pareto artifact: front, runtime index, archive, plot; written atomically, loaded verified.

Files:

- ``front.json``: the front (per point: arch id and config, accuracy per exit,
  predicted latency / energy / memory, the profile it was predicted for), the answer
  for every budget combination (or the closest miss), the search's settings and work;
- ``index.json``: the runtime index (``hmt.pareto.index``; loads without torch);
- ``archive.csv``: every evaluated variant, with ``on_front``;
- ``front.png``: accuracy vs latency, front highlighted, budgets drawn.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hmt.artifacts import Artifact, ArtifactWriter, ParentRecord, load_artifact
from hmt.errors import ArtifactError, UsageError
from hmt.pareto.index import FrontIndex

KIND = "pareto"
FRONT = "front.json"
INDEX = "index.json"
ARCHIVE = "archive.csv"
PLOT = "front.png"
FRONT_SCHEMA = "hmt.pareto-front"
FRONT_SCHEMA_VERSION = 1


@dataclass
class LoadedFront:
    artifact: Artifact
    doc: dict[str, Any]
    index: FrontIndex

    @property
    def points(self) -> list[dict[str, Any]]:
        return list(self.doc["points"])


def write_pareto_artifact(out: Path, *, front_doc: Mapping[str, Any], index: FrontIndex,
                          archive_rows: Iterable[Mapping[str, Any]], plot_png: bytes, config: dict[str, Any],
                          parents: Iterable[Artifact | ParentRecord], metrics: Mapping[str, Any],
                          force: bool = False, inputs: Iterable[Path | str] = ()) -> Path:
    import csv

    rows = list(archive_rows)
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    with ArtifactWriter(out, kind=KIND, config=config, parents=parents, force=force, inputs=inputs) as w:
        w.write_json(FRONT, dict(front_doc))
        w.write_json(INDEX, index.to_json_dict())
        w.write_bytes(ARCHIVE, buffer.getvalue().encode())
        w.write_bytes(PLOT, plot_png)
        w.metrics.update(metrics)
    return out


def load_front(path: Path | str) -> LoadedFront:
    """Load a pareto artifact, verifying every checksum, its schema and index."""
    artifact = load_artifact(path, kind=KIND)
    doc = artifact.read_json(FRONT)
    if not isinstance(doc, dict) or doc.get("schema") != FRONT_SCHEMA:
        raise ArtifactError(f"{artifact.file(FRONT)}: not an hmt pareto front (schema {FRONT_SCHEMA!r})")
    if doc.get("schema_version") != FRONT_SCHEMA_VERSION:
        raise ArtifactError(f"{artifact.file(FRONT)}: schema_version {doc.get('schema_version')!r}; "
                            f"this hmt reads {FRONT_SCHEMA_VERSION}")
    index = FrontIndex.from_json_dict(artifact.read_json(INDEX), source=str(artifact.file(INDEX)))
    if len(index) != len(doc.get("points", [])):
        raise ArtifactError(f"{artifact.root}: index has {len(index)} entries, front has "
                            f"{len(doc.get('points', []))} points")
    return LoadedFront(artifact, doc, index)


def front_variant_ids(front: LoadedFront, *, supernet_manifest_sha256: str | None = None,
                      max_variants: int | None = None, min_accuracy: float | None = None) -> list[str]:
    """Arch ids of the front's points, fastest first; at most ``max_variants`` spread along it.

    The spread keeps the fastest and the most accurate point and takes the rest evenly by
    rank in latency, so a small bundle still covers the whole latency range serve switches
    over. ``min_accuracy`` (a fraction) first drops the points below it: a front reaches down
    to exit-0 variants no one deploys, and without a floor the spread spends bundle slots on
    them. ``supernet_manifest_sha256`` guards against a front searched on another supernet.
    """
    if supernet_manifest_sha256 is not None:
        searched = [p.manifest_sha256 for p in front.artifact.manifest.parents if p.kind == "supernet"]
        if searched and supernet_manifest_sha256 not in searched:
            raise ArtifactError(f"{front.artifact.root}: this front was searched on another supernet "
                                f"(manifest sha256 {searched[0][:12]}…, given {supernet_manifest_sha256[:12]}…)")
    points = sorted(front.points, key=lambda p: (float(p["latency_ms"]), -float(p["accuracy"]), str(p["arch_id"])))
    if not points:
        raise ArtifactError(f"{front.artifact.root / FRONT}: the front has no points")
    if min_accuracy is not None:
        if not 0.0 <= min_accuracy <= 1.0:
            raise UsageError(f"minimum accuracy must be a fraction in [0, 1], got {min_accuracy}")
        best_accuracy = max(float(p["accuracy"]) for p in points)
        points = [p for p in points if float(p["accuracy"]) >= min_accuracy]
        if not points:
            raise UsageError(f"{front.artifact.root / FRONT}: no front point reaches {100 * min_accuracy:.2f}% "
                             f"(the most accurate has {100 * best_accuracy:.2f}%); lower the floor")
    ids = [str(p["arch_id"]) for p in points]
    if max_variants is None or max_variants >= len(ids):
        return ids
    if max_variants < 1:
        raise ArtifactError(f"max_variants must be >= 1, got {max_variants}")
    best = max(range(len(points)), key=lambda i: (float(points[i]["accuracy"]), -i))
    chosen = {0, best}
    if max_variants > len(chosen):
        step = (len(points) - 1) / (max_variants - 1)
        for k in range(max_variants):
            if len(chosen) >= max_variants:
                break
            chosen.add(round(k * step))
        for i in range(len(points)):
            if len(chosen) >= max_variants:
                break
            chosen.add(i)
    return [ids[i] for i in sorted(chosen)][:max_variants] if max_variants >= 2 else [ids[best]]
