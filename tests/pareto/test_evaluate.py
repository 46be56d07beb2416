"""Prefix-reuse evaluation gives exactly what evaluating each variant alone gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hmt.errors import InputError
from hmt.pareto.evaluate import FeatureCache, PrefixEvaluator, evaluate_plain


def _batches(n_batches: int = 3, size: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(size, 3, 32, 32, generator=g), torch.randint(0, 10, (size,), generator=g))
            for _ in range(n_batches)]


def _archs(space, n: int, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    return [space.sample(rng) for _ in range(n)] + [space.largest(), space.smallest()]


def _calibration(loaded, calibrate: bool | str):  # type: ignore[no-untyped-def]
    from hmt.pareto.data import calibration_batches

    if calibrate == "three batches":  # the running average over several batches, in order
        return [x for x, _ in _batches(n_batches=3, size=8)]
    batches = calibration_batches(loaded) if calibrate else None
    assert not calibrate or batches
    return batches


@pytest.mark.parametrize(("cache_bytes", "calibrate"), [(0, True), (1 << 20, True), (256 << 20, True),
                                                        (256 << 20, "three batches"), (256 << 20, False)])
def test_prefix_reuse_equals_plain_evaluation(tiny_loaded, cache_bytes: int,  # type: ignore[no-untyped-def]
                                              calibrate: bool | str) -> None:
    net, space = tiny_loaded.net, tiny_loaded.space
    batches = _batches()
    calibration = _calibration(tiny_loaded, calibrate)
    archs = _archs(space, 14)
    plain, plain_stats = evaluate_plain(net, archs, batches, calibration=calibration)
    evaluator = PrefixEvaluator(net, batches, calibration=calibration, cache_bytes=cache_bytes)
    # Three groups, the way a search hands them over (later groups repeat earlier archs).
    reused = evaluator.evaluate(archs[:6]) + evaluator.evaluate(archs[6:12]) + evaluator.evaluate(archs[12:])
    assert [r.accuracy_per_exit for r in reused] == [p.accuracy_per_exit for p in plain]
    assert [r.arch_id for r in reused] == [a.arch_id for a in archs]
    stats = evaluator.stats
    assert 0 < stats.block_evals < stats.block_evals_plain <= plain_stats.block_evals
    assert stats.calib_block_evals < stats.calib_block_evals_plain or not calibrate
    assert stats.cache_peak_bytes <= cache_bytes
    if cache_bytes == 0:
        assert stats.cache_hits == 0


def test_shared_prefix_runs_once_per_batch(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    net, space = tiny_loaded.net, tiny_loaded.space
    first = space.positions[0].choices
    # Same first block, different second blocks: the stem and s0.b0 and exit0 run once.
    # (Not the original's first block: the original runs its own stem, every other variant
    # the shared copy, so only non-original variants share a prefix with each other.)
    archs = [space.make([first[1], c, "base"], 1) for c in space.positions[1].choices[:4]]
    batches = _batches(n_batches=2)
    evaluator = PrefixEvaluator(net, batches, cache_bytes=0)  # shared BN statistics: no calibration pass
    evaluator.evaluate(archs)
    # per batch: stem + s0.b0 + exit0 once, then 4 x (block + exit1)
    assert evaluator.stats.block_evals == 2 * (3 + 4 * 2)
    assert evaluator.stats.block_evals_plain == 2 * 4 * (3 + 2)
    # Evaluating them again costs nothing; an arch sharing only known prefixes costs nothing either.
    evaluator.evaluate(archs)
    evaluator.evaluate([space.make([first[1], "base", "base"], 0)])
    assert evaluator.stats.block_evals == 2 * (3 + 4 * 2)


def test_feature_cache_keeps_the_important_and_is_bounded() -> None:
    cache = FeatureCache(3 * 4 * 10)  # three 10-float tensors
    cache.put("a", torch.zeros(10), importance=5)
    cache.put("b", torch.zeros(10), importance=1)
    cache.put("c", torch.zeros(10), importance=1)
    assert cache.get("b") is not None  # b is now more recent than c
    cache.put("d", torch.zeros(10), importance=2)  # evicts c (least important, least recent)
    assert cache.get("c") is None and cache.get("b") is not None and cache.get("a") is not None
    cache.put("e", torch.zeros(10), importance=0)  # everything held matters more: not admitted
    assert cache.get("e") is None and len(cache) == 3
    cache.put("f", torch.zeros(10), importance=9)  # evicts b (importance 1)
    assert cache.get("b") is None and cache.get("a") is not None
    cache.put("huge", torch.zeros(100), importance=99)  # larger than the whole cache: not stored
    assert cache.get("huge") is None and cache.used_bytes <= cache.capacity_bytes and cache.evictions == 2


def test_empty_data_is_refused(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="0 batches"):
        PrefixEvaluator(tiny_loaded.net, [])
    empty = [(torch.zeros(0, 3, 32, 32), torch.zeros(0, dtype=torch.long))]
    with pytest.raises(InputError, match="0 samples"):
        PrefixEvaluator(tiny_loaded.net, empty)
    with pytest.raises(InputError, match="0 samples"):
        evaluate_plain(tiny_loaded.net, [tiny_loaded.space.largest()], empty)


def test_validation_split_reproduces_the_trainers_accuracies(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """The default held-out data is the supernet's own validation split and the BN
    statistics are re-estimated on its calibration set: the largest and smallest variants
    score exactly what train-supernet recorded for them."""
    import pandas as pd

    from hmt.pareto.data import device_batches, held_out_data

    data = held_out_data(tiny_loaded)
    assert "validation split" in data.source
    table = pd.read_csv(tiny_loaded.artifact.file("variants.csv"))
    evaluator = PrefixEvaluator(tiny_loaded.net, device_batches(data, batch_size=256),
                                calibration=_calibration(tiny_loaded, True))
    for row in table.itertuples():
        arch = tiny_loaded.space.parse(row.arch_id)
        (result,) = evaluator.evaluate([arch])
        expected = [getattr(row, f"val_acc_exit{s}") for s in range(arch.exit_stage + 1)]
        assert list(result.accuracy_per_exit) == pytest.approx(expected, abs=1e-9)
    subset = held_out_data(tiny_loaded, max_samples=20, seed=1)
    assert len(subset) == 20 and "stratified subset of 20" in subset.source
    with pytest.raises(Exception, match="max eval samples"):
        held_out_data(tiny_loaded, max_samples=0)


def test_validation_split_rebuilt_from_data_given(tiny_loaded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """split "val" with --data rebuilds the supernet's own validation split from that data (the
    same file by sha256), on a machine where the recorded path is not there; other data is
    refused by name."""
    from pathlib import Path

    import hmt.data
    from hmt.errors import ArtifactError
    from hmt.pareto.data import held_out_data

    embedded = Path(hmt.data.__file__).parent / "embedded"
    recorded = held_out_data(tiny_loaded)
    given = held_out_data(tiny_loaded, data_path=embedded, split="val")
    assert "validation split" in given.source
    np.testing.assert_array_equal(given.x, recorded.x)
    np.testing.assert_array_equal(given.y, recorded.y)
    other = tmp_path / "other"
    other.mkdir()
    import zipfile

    with zipfile.ZipFile(embedded / "train.zip") as src, zipfile.ZipFile(other / "train.zip", "w") as dst:
        for entry in src.infolist()[:-1]:  # one training image fewer: another file
            dst.writestr(entry, src.read(entry))
    (other / "test.zip").write_bytes((embedded / "test.zip").read_bytes())
    with pytest.raises(ArtifactError, match="validation split cannot be rebuilt"):
        held_out_data(tiny_loaded, data_path=other, split="val")
