"""deploy leaves out a quantised variant that fuse measured no faster than its fp32 twin."""

from __future__ import annotations

import pytest

from hmt.deploy.sources import FusedVariant, drop_slower_quantised
from hmt.errors import UsageError

BASE = "cifar_resnet56-03130f.e0.5SSSSSSSSSxxxxxxxxxxxxxxxxxxxx"


def _variant(arch_id: str, median_ms: float | None) -> FusedVariant:
    choice = {"candidate": "ort[all,threads=1](chain)"} | ({"median_ms": median_ms} if median_ms is not None else {})
    return FusedVariant(arch_id, arch_id, (), (), "onnxruntime", choice["candidate"], choice)


def test_int8_slower_than_its_fp32_twin_is_left_out_with_a_note() -> None:
    fp32, int8 = _variant(BASE, 0.019), _variant(f"{BASE}.int8", 0.028)
    kept, notes = drop_slower_quantised([fp32, int8], [fp32, int8])
    assert kept == [fp32]
    assert len(notes) == 1 and f"{BASE}.int8 left out" in notes[0] and "0.028 ms vs 0.019 ms" in notes[0]
    # Its twin not selected for the bundle but fused in the same run: still compared.
    kept, _ = drop_slower_quantised([int8, _variant("other", 1.0)], [fp32, int8, _variant("other", 1.0)])
    assert [v.arch_id for v in kept] == ["other"]
    with pytest.raises(UsageError, match="no variant left"):
        drop_slower_quantised([int8], [fp32, int8])


def test_int8_faster_or_without_a_twin_is_kept() -> None:
    fp32, int8 = _variant(BASE, 1.34), _variant(f"{BASE}.int8", 0.58)
    assert drop_slower_quantised([fp32, int8], [fp32, int8]) == ([fp32, int8], [])
    lone = _variant(f"{BASE}.int8", 0.9)
    assert drop_slower_quantised([lone], [lone]) == ([lone], [])
    unknown = _variant(f"{BASE}.int8", None)  # an older fused report without medians: nothing to compare
    assert drop_slower_quantised([fp32, unknown], [fp32, unknown]) == ([fp32, unknown], [])


def test_a_named_int8_variant_is_kept_with_a_note() -> None:
    fp32, int8 = _variant(BASE, 0.019), _variant(f"{BASE}.int8", 0.028)
    kept, notes = drop_slower_quantised([fp32, int8], [fp32, int8], named=(f"{BASE}.int8",))
    assert kept == [fp32, int8]
    assert len(notes) == 1 and "kept as asked" in notes[0] and "0.028 ms vs 0.019 ms" in notes[0]
