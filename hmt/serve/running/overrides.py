"""Serve settings overridden at start, layered over the bundle's signed ``serve.json`` (which stays untouched).

Layers, lowest first; a later layer wins key by key:

1. the defaults (:class:`hmt.runtime.settings.ServeSettings`);
2. the bundle's ``serve.json`` (signed and verified with the bundle; never rewritten);
3. ``--serve-config FILE``: a JSON object of the same shape, any subset of it;
4. environment variables ``HMT_SERVE_<SECTION>__<KEY>`` (``__`` between levels, e.g.
   ``HMT_SERVE_BUDGETS__LATENCY_MS=40``, ``HMT_SERVE_MONITOR_PERIOD_S=0.5``); ``HMT_SERVE_TOKEN``
   is the token, not a setting;
5. ``--set KEY=VALUE`` (dotted keys, e.g. ``--set switch.min_dwell_s=0``), then serve's own flags
   (``--latency-ms``, ``--memory-mb``, ``--exit-confidence``, ``--no-early-exit``, ``--engine``).

Values are JSON literals (``40``, ``0.5``, ``true``, ``null``, ``"tvm"``) or bare words (``tvm``).
Every key is checked against the schema and every value against its field's type before the
settings are built, and a refusal names the key and the layer it came from. :func:`layered_settings`
returns the settings and, for every key, its effective value and where it came from (``/v1/status``
key ``settings``).
"""

from __future__ import annotations

import difflib
import json
import math
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from hmt.artifacts.jsondoc import parse_json
from hmt.errors import InputError, UsageError
from hmt.runtime.settings import ServeSettings

# ``int | None`` builds a types.UnionType on Python 3.10+; 3.8 has only typing.Union.
_UNION_TYPES = (types.UnionType,) if hasattr(types, "UnionType") else ()  # novermin (3.10+ only, guarded)

ENV_PREFIX = "HMT_SERVE_"
ENV_RESERVED = ("HMT_SERVE_TOKEN",)
DEFAULT = "default"
BUNDLE = "bundle serve.json"
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class Layer:
    """One source of overrides: dotted key -> value, and how to name it in errors and in status."""

    source: str
    values: Mapping[str, Any]


def _leaf_types() -> dict[str, Any]:
    """Every setting's dotted key and its type hint (nested dataclasses flattened)."""
    out: dict[str, Any] = {}

    def walk(cls: type[Any], prefix: str) -> None:
        hints = _type_hints(cls)
        for f in fields(cls):
            hint = hints[f.name]
            if is_dataclass(hint) and isinstance(hint, type):
                walk(hint, f"{prefix}{f.name}.")
            else:
                out[prefix + f.name] = hint

    walk(ServeSettings, "")
    return out


class _Opaque:
    """Stands for a hint no override value fits (tuples, mappings): such a setting is not overridable."""


_SIMPLE: dict[str, Any] = {"int": int, "float": float, "bool": bool, "str": str, "None": type(None)}


def _type_hints(cls: type[Any]) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``; on Python 3.8/3.9, where ``float | None`` cannot be evaluated,
    the same read from the annotation strings (simple types, unions of them, nested dataclasses)."""
    if sys.version_info >= (3, 10):
        return typing.get_type_hints(cls)
    module = sys.modules[cls.__module__]
    hints: dict[str, Any] = {}
    for f in fields(cls):
        if not isinstance(f.type, str):
            hints[f.name] = f.type
            continue
        nested = getattr(module, f.type.strip(), None)
        if is_dataclass(nested):
            hints[f.name] = nested
            continue
        parts = tuple(_SIMPLE.get(part.strip(), _Opaque) for part in f.type.split("|"))
        hints[f.name] = typing.Union[parts] if len(parts) > 1 else parts[0]
    return hints


LEAVES = _leaf_types()


def _allowed(hint: Any) -> tuple[type[Any], ...]:
    if isinstance(hint, _UNION_TYPES) or typing.get_origin(hint) is typing.Union:
        return tuple(t for arg in typing.get_args(hint) for t in _allowed(arg))
    return (type(None),) if hint is type(None) else (hint,)


def _fits(value: Any, allowed: tuple[type[Any], ...]) -> bool:
    if value is None or isinstance(value, bool):
        return type(value) in allowed
    if isinstance(value, (int, float)) and float in allowed:
        return math.isfinite(value)
    return (isinstance(value, int) and int in allowed) or (isinstance(value, str) and str in allowed)


def _check_value(key: str, value: Any, source: str) -> Any:
    allowed = _allowed(LEAVES[key])
    if _fits(value, allowed):
        return value
    names = {bool: "true or false", float: "a finite number", int: "an integer", str: "a string",
             type(None): "null"}
    expected = " or ".join(names.get(t, t.__name__) for t in allowed)
    raise UsageError(f"{source}: {key} must be {expected}, got {json.dumps(value)[:40]}")


def _check_key(key: str, source: str) -> None:
    if key not in LEAVES:
        close = difflib.get_close_matches(key, list(LEAVES), n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else f"; settings are {', '.join(sorted(LEAVES))}"
        raise UsageError(f"{source}: unknown serve setting {key!r}{hint}")


def parse_value(text: str) -> Any:
    """A JSON literal, or the text itself (``--set engine=tvm``)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not a JSON literal (RecursionError: brackets nested too deeply)
        return text


def flatten(mapping: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """A nested serve.json-shaped object as dotted keys (sections must be objects)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        dotted = prefix + str(key)
        if isinstance(value, Mapping):
            if not any(k.startswith(dotted + ".") for k in LEAVES):
                _check_key(dotted, source)
                raise UsageError(f"{source}: {dotted} is a single setting, not a section")
            out.update(flatten(value, source, dotted + "."))
        else:
            out[dotted] = value
    return out


def set_layer(assignments: list[str] | tuple[str, ...]) -> Layer:
    values: dict[str, Any] = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. --set budgets.latency_ms=40")
        values[key.strip()] = parse_value(text.strip())
    return Layer("--set", values)


def file_layer(path: Path) -> Layer:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise InputError(f"--serve-config {path}: larger than {MAX_CONFIG_BYTES} bytes")
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"--serve-config {path}: cannot read it ({exc.strerror or exc})") from exc
    doc = parse_json(raw, f"--serve-config {path}", error=InputError)
    if not isinstance(doc, dict):
        raise InputError(f"--serve-config {path}: expected a JSON object shaped like serve.json")
    source = f"--serve-config {path.name}"
    return Layer(source, flatten(doc, source))


def env_layer(environ: Mapping[str, str]) -> Layer:
    values: dict[str, Any] = {}
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in ENV_RESERVED:
            continue
        key = ".".join(part.lower() for part in name[len(ENV_PREFIX):].split("__"))
        _check_key(key, f"environment variable {name}")
        values[key] = parse_value(text)
    return Layer("environment", values)


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, leaf = key.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return out


def layered_settings(bundle_config: Mapping[str, Any], layers: list[Layer],
                     where: str = "serve.json") -> tuple[ServeSettings, dict[str, dict[str, Any]]]:
    """The settings the layers make over ``bundle_config``, and per key its value and source."""
    defaults = flatten(ServeSettings().to_json_dict(), DEFAULT)
    sources = dict.fromkeys(defaults, DEFAULT)
    merged = dict(defaults)
    bundle = flatten(bundle_config, where)
    for layer in [Layer(BUNDLE, bundle), *layers]:
        for key, value in layer.values.items():
            _check_key(key, layer.source)
            merged[key] = _check_value(key, value, layer.source) if layer.source != BUNDLE else value
            sources[key] = layer.source
        try:  # each layer must make valid settings: a refusal names the layer that broke them
            ServeSettings.from_mapping(_nest(merged), f"{where} with {layer.source}")
        except UsageError as exc:
            if layer.source == BUNDLE:
                raise
            keys = ", ".join(sorted(layer.values))
            raise UsageError(f"{layer.source} ({keys}): {exc}") from exc
    settings = ServeSettings.from_mapping(_nest(merged), where)
    effective = flatten(settings.to_json_dict(), DEFAULT)
    return settings, {key: {"value": effective[key], "source": sources[key]} for key in sorted(effective)}
