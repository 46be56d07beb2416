"""The device-profile document: schema, provenance, tables, validation, load and save.

A profile is one JSON document plus, where a table is large, CSV files beside it. Every
number in it is a *quantity* ``{"value": v, "unit": u, "source": id}`` whose ``source``
names an entry of ``provenance``: either measured (where, when, how) or estimated (a
citation). Tables carry one ``source`` for all their cells. :func:`validate_profile`
refuses a document that breaks any of this, naming the field at fault.

Two on-disk forms:

- an hmt artifact directory (kind ``device-profile``): ``profile.json`` + CSV tables +
  plots, written atomically with a checksummed manifest (what ``profile-device`` writes);
- a single JSON file with every table inline (what ``profiles/`` ships).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.artifacts.jsondoc import parse_json
from hmt.errors import ArtifactError, InputError

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_NAME = "hmt.device-profile"
PROFILE_SCHEMA_VERSION = 1
ARTIFACT_KIND = "device-profile"
PROFILE_FILE = "profile.json"
INLINE_TABLE_MAX_ROWS = 64

ORIGINS = ("measured", "estimated", "fitted")
_PROVENANCE_REQUIRED = {
    "measured": ("where", "when", "how"),
    "fitted": ("when", "how", "inputs"),
    "estimated": ("citation",),
}
_TOP_LEVEL_REQUIRED = ("schema", "schema_version", "device", "provenance")


def quantity(value: float | int, unit: str, source: str, **extra: Any) -> dict[str, Any]:
    """A number with its unit and the provenance id that explains where it came from."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"quantity {value!r} {unit} from {source!r} is not finite")
    out: dict[str, Any] = {"value": value, "unit": unit, "source": source}
    out.update(extra)
    return out


def measured(where: str, when: str, how: str, **extra: Any) -> dict[str, Any]:
    return {"origin": "measured", "where": where, "when": when, "how": how, **extra}


def fitted(when: str, how: str, inputs: list[str], **extra: Any) -> dict[str, Any]:
    return {"origin": "fitted", "when": when, "how": how, "inputs": inputs, **extra}


def estimated(citation: str, **extra: Any) -> dict[str, Any]:
    return {"origin": "estimated", "citation": citation, **extra}


@dataclass
class DeviceProfile:
    """A profile document plus its tables (pandas DataFrames, keyed by table name).

    ``doc["tables"][name]`` describes each table (columns, units, source); the data live
    in ``tables[name]`` in memory and either inline (``rows``) or in a CSV file on disk.
    """

    doc: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.doc["device"]["name"])

    @property
    def device_id(self) -> str:
        return str(self.doc["device"]["id"])

    def value(self, dotted: str) -> float:
        """The value of the quantity at ``dotted`` (e.g. ``"benchmarks.peak_gemm_gmacs"``)."""
        node: Any = self.doc
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise KeyError(f"profile {self.name!r} has no {dotted!r}")
            node = node[part]
        if not isinstance(node, Mapping) or "value" not in node:
            raise KeyError(f"profile {self.name!r}: {dotted!r} is not a quantity")
        return float(node["value"])

    def get_value(self, dotted: str, default: float | None = None) -> float | None:
        try:
            return self.value(dotted)
        except KeyError:
            return default

    def table(self, name: str) -> pd.DataFrame:
        if name not in self.tables:
            raise KeyError(f"profile {self.name!r} has no table {name!r} (it has {sorted(self.tables)})")
        return self.tables[name]

    def add_table(self, name: str, frame: pd.DataFrame, *, units: Mapping[str, str], source: str) -> None:
        missing = [c for c in frame.columns if c not in units]
        if missing:
            raise ValueError(f"table {name!r}: no unit given for columns {missing}")
        self.tables[name] = frame.reset_index(drop=True)
        self.doc.setdefault("tables", {})[name] = {
            "columns": [str(c) for c in frame.columns],
            "units": {str(c): units[c] for c in frame.columns},
            "source": source,
            "n_rows": len(frame),
        }


# --------------------------------------------------------------------------- validation


def _iter_quantities(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if "value" in node and ("unit" in node or "source" in node):
            yield path, node
            return
        for key, child in node.items():
            if key in ("provenance", "tables"):
                continue
            yield from _iter_quantities(child, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _iter_quantities(child, f"{path}[{index}]")


def _iter_bare_numbers(node: Any, path: str) -> Iterator[str]:
    """Numbers that are not inside a quantity (ints used as counts in 'device' are allowed)."""
    if isinstance(node, dict):
        if "value" in node and "source" in node:
            return
        for key, child in node.items():
            if key in ("provenance", "tables", "schema_version", "device"):
                continue
            yield from _iter_bare_numbers(child, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _iter_bare_numbers(child, f"{path}[{index}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path


def validate_profile(doc: Any, *, source: str) -> None:
    """Refuse a profile document that breaks the schema; the message names the field."""
    if not isinstance(doc, dict):
        raise InputError(f"{source}: a profile is a JSON object, got {type(doc).__name__}")
    for key in _TOP_LEVEL_REQUIRED:
        if key not in doc:
            raise InputError(f"{source}: missing top-level field {key!r}")
    if doc["schema"] != SCHEMA_NAME:
        raise InputError(f"{source}: schema is {doc['schema']!r}, expected {SCHEMA_NAME!r}")
    if doc["schema_version"] != PROFILE_SCHEMA_VERSION:
        raise InputError(
            f"{source}: schema_version {doc['schema_version']!r}; this hmt reads version {PROFILE_SCHEMA_VERSION}"
        )
    device = doc["device"]
    if not isinstance(device, dict) or not all(isinstance(device.get(k), str) for k in ("name", "id", "origin")):
        raise InputError(f"{source}: device needs string fields name, id and origin")
    if device["origin"] not in ("measured", "estimated"):
        raise InputError(f"{source}: device.origin {device['origin']!r} is not 'measured' or 'estimated'")
    provenance = doc["provenance"]
    if not isinstance(provenance, dict) or not provenance:
        raise InputError(f"{source}: provenance must be a non-empty object")
    for pid, entry in provenance.items():
        if not isinstance(entry, dict) or entry.get("origin") not in ORIGINS:
            raise InputError(f"{source}: provenance[{pid!r}].origin must be one of {ORIGINS}")
        for key in _PROVENANCE_REQUIRED[entry["origin"]]:
            if not entry.get(key):
                raise InputError(f"{source}: provenance[{pid!r}] ({entry['origin']}) lacks {key!r}")
    for path, node in _iter_quantities(doc, ""):
        for key in ("value", "unit", "source"):
            if key not in node:
                raise InputError(f"{source}: quantity {path} lacks {key!r}")
        value = node["value"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"{source}: quantity {path} has a non-numeric or non-finite value {value!r}")
        if node["source"] not in provenance:
            raise InputError(f"{source}: quantity {path} cites unknown provenance {node['source']!r}")
    bare = list(_iter_bare_numbers(doc, ""))
    if bare:
        raise InputError(f"{source}: numbers without a unit and source at {', '.join(bare[:5])}")
    for name, meta in doc.get("tables", {}).items():
        if not isinstance(meta, dict):
            raise InputError(f"{source}: tables[{name!r}] must be an object")
        for key in ("columns", "units", "source"):
            if key not in meta:
                raise InputError(f"{source}: tables[{name!r}] lacks {key!r}")
        if meta["source"] not in provenance:
            raise InputError(f"{source}: tables[{name!r}] cites unknown provenance {meta['source']!r}")
        if set(meta["units"]) != set(meta["columns"]):
            raise InputError(f"{source}: tables[{name!r}]: units must name exactly its columns")
        if ("rows" in meta) == ("file" in meta):
            raise InputError(f"{source}: tables[{name!r}] needs exactly one of 'rows' (inline) or 'file' (CSV)")


# --------------------------------------------------------------------------- (de)serialise


def _frame_from_rows(name: str, meta: dict[str, Any], source: str) -> pd.DataFrame:
    import pandas as pd

    rows = meta["rows"]
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise InputError(f"{source}: tables[{name!r}].rows must be a list of objects")
    frame = pd.DataFrame(rows, columns=meta["columns"])
    return frame


def _frame_from_csv(name: str, meta: dict[str, Any], path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: table {name!r} is not a readable CSV ({exc})") from exc
    if list(frame.columns) != list(meta["columns"]):
        raise InputError(f"{path}: columns {list(frame.columns)} differ from the profile's {meta['columns']}")
    return frame


def profile_to_json_files(profile: DeviceProfile, *, inline: bool) -> dict[str, bytes]:
    """Serialise to ``{file name: bytes}``: ``profile.json`` and one CSV per large table.

    With ``inline=True`` every table goes into the JSON (the single-file form).
    """
    doc = json.loads(json.dumps(profile.doc))  # deep copy, JSON types only
    files: dict[str, bytes] = {}
    for name, frame in profile.tables.items():
        meta = doc.setdefault("tables", {}).setdefault(name, {})
        meta.pop("rows", None)
        meta.pop("file", None)
        meta["n_rows"] = len(frame)
        if inline or len(frame) <= INLINE_TABLE_MAX_ROWS:
            meta["rows"] = json.loads(frame.to_json(orient="records"))
        else:
            file_name = f"{name}.csv"
            buffer = io.StringIO()
            frame.to_csv(buffer, index=False, float_format="%.6g")
            files[file_name] = buffer.getvalue().encode()
            meta["file"] = file_name
    validate_profile(doc, source="profile being written")
    files[PROFILE_FILE] = (json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    return files


def profile_from_doc(doc: Any, *, source: str, base_dir: Path | None = None) -> DeviceProfile:
    validate_profile(doc, source=source)
    tables: dict[str, pd.DataFrame] = {}
    for name, meta in doc.get("tables", {}).items():
        if "rows" in meta:
            tables[name] = _frame_from_rows(name, meta, source)
        else:
            if base_dir is None:
                raise InputError(f"{source}: table {name!r} is in file {meta['file']!r} but no directory was given")
            from hmt.artifacts import safe_join

            tables[name] = _frame_from_csv(name, meta, safe_join(base_dir, meta["file"], what="table file"))
    return DeviceProfile(doc=doc, tables=tables)


def read_profile_json(path: Path) -> DeviceProfile:
    """A single-file profile (``profiles/*.json``); refuses malformed JSON or schema."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise InputError(f"{path}: does not exist; expected a profile-device artifact directory or a profiles/*.json "
                         "file") from exc
    doc = parse_json(raw, path, error=InputError)
    return profile_from_doc(doc, source=str(path), base_dir=path.parent)


def load_profile(path: Path | str) -> DeviceProfile:
    """Load a profile: an artifact directory (verified) or a single JSON file."""
    from hmt.artifacts import load_artifact

    path = Path(path).absolute()  # load_artifact needs a named directory ('.' has no name)
    if path.is_dir():
        artifact = load_artifact(path, kind=ARTIFACT_KIND)
        try:
            doc = artifact.read_json(PROFILE_FILE)
        except ArtifactError:
            raise
        profile = profile_from_doc(doc, source=str(artifact.file(PROFILE_FILE)), base_dir=artifact.root)
        return profile
    if path.suffix == ".json":
        return read_profile_json(path)
    raise InputError(f"{path}: not a profile directory or .json file")


def is_profile_json(path: Path) -> bool:
    """Whether ``path`` holds a single-file hmt device profile (what :func:`write_profile_json` writes)."""
    if path.stat().st_size > 64 << 20:
        return False
    try:
        data = parse_json(path.read_bytes(), path, error=InputError)
    except InputError:
        return False
    return isinstance(data, dict) and isinstance(data.get("device"), dict) and all(
        key in data for key in _TOP_LEVEL_REQUIRED)


def check_profile_json_output(path: Path | str, *, inputs: Sequence[Path | str] = ()) -> Path:
    """Refuse ``path`` (``--export-json``) unless it is new or an hmt device profile; callers check it
    before measuring, so a refusal does not come after minutes of profiling."""
    from hmt.artifacts.outputs import check_output_file

    return check_output_file(path, recognise=is_profile_json, description="an hmt device profile (.json)",
                             inputs=inputs, what="--export-json")


def write_profile_json(profile: DeviceProfile, path: Path, *, inputs: Sequence[Path | str] = ()) -> Path:
    """The single-file form (every table inline), written atomically: what ``profiles/`` ships.

    An existing ``path`` is replaced only if it is such a profile."""
    from hmt.artifacts import atomic_write_bytes

    check_profile_json_output(path, inputs=inputs)
    atomic_write_bytes(Path(path), profile_to_json_files(profile, inline=True)[PROFILE_FILE])
    Path(path).chmod(0o644)  # a file to share, not the 0600 of the temporary it was written as
    return Path(path)


def write_profile_artifact(
    profile: DeviceProfile,
    out_dir: Path,
    *,
    config: dict[str, Any],
    parents: tuple[Any, ...] = (),
    extra_files: Mapping[str, bytes] | None = None,
    metrics: Mapping[str, Any] | None = None,
    force: bool = False,
    inputs: Sequence[Path | str] = (),
) -> Path:
    """Write the profile atomically as an hmt artifact; a failure leaves ``out_dir`` untouched."""
    from hmt.artifacts import ArtifactWriter

    files = profile_to_json_files(profile, inline=False)
    with ArtifactWriter(out_dir, kind=ARTIFACT_KIND, config=config, parents=parents, force=force,
                        inputs=inputs) as writer:
        for name, data in files.items():
            writer.write_bytes(name, data)
        for name, data in (extra_files or {}).items():
            writer.write_bytes(name, data)
        writer.metrics.update(metrics or {})
    return out_dir
