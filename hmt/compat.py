"""Python 3.8 stand-ins for the few newer built-ins the device half uses.

The device half (serve, the runtime, the client, the offload device side) runs on Python
3.8, as JetPack 5 ships; ``tests/runtime/test_device_python.py`` checks it with vermin.
These are ``zip(..., strict=True)`` and ``itertools.pairwise`` (both 3.10).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def strict_zip(*iterables: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """``zip(*iterables, strict=True)``: raises ValueError when the lengths differ (the
    built-in itself on Python 3.10+, where serve's decision path calls it every tick)."""
    if sys.version_info >= (3, 10):
        return zip(*iterables, strict=True)  # novermin (3.10+ only, guarded above)
    return _strict_zip_38(*iterables)


def _strict_zip_38(*iterables: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    iterators = [iter(it) for it in iterables]
    if not iterators:
        return
    while True:
        items = []
        for index, iterator in enumerate(iterators):
            try:
                items.append(next(iterator))
            except StopIteration:
                if index == 0:
                    for k, rest in enumerate(iterators[1:], start=2):
                        for _ in rest:
                            raise ValueError(f"strict_zip() argument {k} is longer than argument 1") from None
                    return
                raise ValueError(f"strict_zip() argument {index + 1} is shorter than argument 1") from None
        yield tuple(items)


def pairwise(iterable: Iterable[T]) -> Iterator[tuple[T, T]]:
    """``itertools.pairwise``: (a, b), (b, c), ... of ``iterable``."""
    iterator = iter(iterable)
    try:
        previous = next(iterator)
    except StopIteration:
        return
    for item in iterator:
        yield previous, item
        previous = item
