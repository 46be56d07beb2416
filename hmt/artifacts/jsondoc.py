"""Parse the JSON documents hmt reads from disk (manifests, bundle files, profiles, indexes).

``json.loads`` raises more than ``JSONDecodeError`` on a damaged or hostile file: bytes that are
not UTF-8/16/32 raise ``UnicodeDecodeError``, and brackets nested deeper than the interpreter's
recursion limit raise ``RecursionError`` (a 200 kB file of ``[`` is enough). Each is a bad
file, never a bug: :func:`parse_json` turns all three into one error naming the file.
"""

from __future__ import annotations

import json
from typing import Any

from hmt.errors import ArtifactError, HmtError


def parse_json(raw: bytes | str, where: object, *, error: type[HmtError] = ArtifactError) -> Any:
    """``raw`` parsed as JSON; ``error`` (default :class:`ArtifactError`) naming ``where`` if it is not
    valid JSON, not text, or nested too deeply."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc})") from exc
    except UnicodeError as exc:
        raise error(f"{where}: not valid JSON (not UTF-8 text: {exc.__class__.__name__})") from exc
    except RecursionError as exc:
        raise error(f"{where}: not valid JSON (nested too deeply)") from exc
