"""Search space as data: ids, canonical configs, sampling."""

from __future__ import annotations

import numpy as np
import pytest

from hmt.errors import UsageError
from hmt.supernet.space import BlockPosition, SearchSpace


def _space() -> SearchSpace:
    ch = ("base", "w50", "lr50", "skip", "merge")
    return SearchSpace(
        backbone="toy",
        num_classes=10,
        input_shape=(3, 8, 8),
        num_stages=2,
        positions=(
            BlockPosition("s0.b0", 0, 0, "basic", 4, 4, 1, ch),
            BlockPosition("s0.b1", 0, 1, "basic", 4, 4, 1, ("base", "w50", "skip")),
            BlockPosition("s1.b0", 1, 0, "basic", 4, 8, 2, ("base", "lr50")),
        ),
    )


def test_id_round_trip_and_json() -> None:
    space = _space()
    arch = space.make(["w50", "skip", "lr50"], 1)
    assert arch.arch_id == f"{space.tag}.e1.5SL"
    assert space.parse(arch.arch_id) == arch
    assert space.from_json(arch.to_json_dict()) == arch
    assert SearchSpace.from_json_dict(space.to_json_dict()).tag == space.tag


def test_canonicalisation_merge_and_exit() -> None:
    space = _space()
    merged = space.make(["merge", "w50", "lr50"], 1)
    assert merged.choices == ("merge", "-", "lr50")
    early = space.make(["base", "base", "lr50"], 0)
    assert early.choices == ("base", "base", "-")
    assert space.parse(early.arch_id) == early


@pytest.mark.parametrize(
    "bad",
    ["other-123456.e0.BBx", "{tag}.e5.BBB", "{tag}.e1.BBQ", "{tag}.e1.BB", "{tag}.e0.BBB", "{tag}.e1.BBM", "nonsense"],
)
def test_parse_refuses_bad_ids(bad: str) -> None:
    space = _space()
    with pytest.raises(UsageError):
        space.parse(bad.format(tag=space.tag))


def test_sampling_is_seeded_and_valid() -> None:
    space = _space()
    a = [space.sample(np.random.default_rng(7)).arch_id for _ in range(3)]
    b = [space.sample(np.random.default_rng(7)).arch_id for _ in range(3)]
    assert a == b
    ids = {space.sample(np.random.default_rng(i)).arch_id for i in range(50)}
    assert len(ids) > 5
    for arch_id in ids:
        space.parse(arch_id)


def test_largest_smallest_and_size() -> None:
    space = _space()
    assert space.largest().choices == ("base", "base", "base")
    assert space.smallest().exit_stage == 0
    assert space.size() == 5 * 3 + 5 * 3 * 2


def test_resolve_takes_named_and_tagless_ids() -> None:
    """What users type: 'largest', 'smallest', or an id without its space tag, as specialize's
    help prints it (``e3.555555555555``) and then hands to convert."""
    space = _space()
    assert space.resolve("largest") == space.largest()
    assert space.resolve("smallest") == space.smallest()
    arch = space.make(["w50", "skip", "lr50"], 1)
    assert space.resolve("e1.5SL") == arch
    assert space.resolve(arch.arch_id) == arch
    with pytest.raises(UsageError, match="belongs to space"):
        space.resolve("other-123456.e1.5SL")
