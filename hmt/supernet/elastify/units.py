"""The units of an elastified supernet's variants (``variant_units``, ``unit_module``,
every unit for the latency table), with stream widths in the keys as the built-in
supernet writes them (``hmt.supernet.supernet.unit_key``: ``w50/B5`` is inner width 50%
reading the full stream and writing a 50% one)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from torch import nn

from hmt.supernet.blocks import keep_statistics
from hmt.supernet.elastify.stream import FULL, keep_count, plain_unit, slice_exit
from hmt.supernet.space import NOT_EXECUTED, WIDTH_KIND, ArchConfig
from hmt.supernet.supernet import parse_unit_key, unit_key

# ``net`` below is an hmt.supernet.elastify.supernet.ElastifiedSupernet, which calls these lazily:
# naming its class here would make the two modules import each other.
ElastifiedSupernet = Any

Unit = tuple[str, int, str]


def _block_key(choice: str, in_w: str, out_w: str) -> str:
    if (in_w, out_w) == ("base", "base"):
        return choice
    return unit_key(FULL if choice == "base" else choice, in_w, out_w)


def variant_units(net: ElastifiedSupernet, arch: ArchConfig) -> tuple[list[Unit], dict[int, int], dict[int, Unit]]:
    widths = net.space.stage_widths(arch)
    units: list[Unit] = [("stem", 0, "base" if widths[0] == "base" else unit_key(FULL, "base", widths[0]))]
    stage_end: dict[int, int] = {}
    exits: dict[int, Unit] = {}
    last = net.space.num_stages - 1
    in_w = widths[0]
    for s in range(arch.exit_stage + 1):
        if not isinstance(net.entries[s], nn.Identity):
            units.append(("entry", s, "base"))
        for p in net._stage_positions(s):
            if arch.choices[p] != NOT_EXECUTED and net.space.positions[p].kind != WIDTH_KIND:
                units.append(("block", p, _block_key(arch.choices[p], in_w, widths[s])))
                in_w = widths[s]
        stage_end[s] = len(units)
        w = widths[s]
        exits[s] = ("exit", s, "base" if w == "base" else unit_key(FULL if s == last else "base", w, w))
    return units, stage_end, exits


def _original(module: nn.Module) -> nn.Module:
    """An eval-mode copy of one of the original's modules, its BN layers marked to keep their
    statistics (its frozen norms ignore re-estimation anyway; an opaque leaf's plain ones too)."""
    return keep_statistics(copy.deepcopy(module)).eval()


def unit_module(net: ElastifiedSupernet, unit: Unit) -> nn.Module:
    """A plain eval-mode module for one unit (slim units as ordinary layers)."""
    kind, index, key = unit
    choice, in_w, out_w = parse_unit_key(key)
    stream = net.stream
    if kind == "entry":
        return copy.deepcopy(net.entries[index]).eval()
    if kind == "stem":
        if out_w == "base" or stream is None:
            return _original(net.stem)
        return plain_unit(stream.stem_units[out_w])
    if kind == "exit":
        last = index == len(net.exits) - 1
        if out_w == "base" or stream is None:
            return _original(net.exits[index]) if last else copy.deepcopy(net.exits[index]).eval()
        if last:
            return plain_unit(stream.head_units[out_w])
        return slice_exit(net.exits[index], stream.index(net._stage_positions(index)[-1], out_w)).eval()
    if (in_w, out_w) == ("base", "base") or stream is None:
        if key == "base":
            return _original(net.blocks[index].base)
        return net.blocks[index].materialize(key).eval()
    if choice == "skip":
        return nn.Identity()
    return plain_unit(stream.unit(index, choice, in_w, out_w))


def iter_units(net: ElastifiedSupernet) -> Iterator[tuple[Unit, tuple[int, ...]]]:
    """Every unit any variant runs, with its input shape (no batch)."""
    shapes = net.block_input_shapes()
    stream = net.stream
    levels = stream.levels if stream is not None else {}
    stem_shape = shapes["stem"]
    yield ("stem", 0, "base"), stem_shape
    for w in levels.get(0, ()):
        yield ("stem", 0, unit_key(FULL, "base", w)), stem_shape
    last = net.space.num_stages - 1
    for s in range(net.space.num_stages):
        for p in net._stage_positions(s):
            pos = net.space.positions[p]
            if pos.kind == WIDTH_KIND:
                continue
            shape = shapes[pos.name]
            for choice in pos.choices:
                yield ("block", p, choice), shape
            if stream is None:
                continue
            channels = stream.group_channels[stream.group_of[stream.previous[p]]]
            inner = [c for c in pos.choices if c in ("w75", "w50", "w25")]
            for in_w, out_w in stream.width_pairs(p):
                for choice in ("base", *inner, *(("skip",) if "skip" in pos.choices and in_w == out_w else ())):
                    yield ("block", p, _block_key(choice, in_w, out_w)), (keep_count(channels, in_w), *shape[1:])
        shape = shapes[f"exit{s}"]
        yield ("exit", s, "base"), shape
        for w in levels.get(s, ()):
            yield ("exit", s, unit_key(FULL if s == last else "base", w, w)), (keep_count(shape[0], w), *shape[1:])
