"""deploy --blocks on the shipped supernet: a composed variant answers as the whole-variant graph (<= 1e-5),
the torch-free sub-space agrees with the supernet's, shared blocks are loaded and counted once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hmt.errors import ArtifactError, UsageError
from hmt.runtime.blocks import BlockStore, compose, load_block_space, load_calibration, unit_file


def test_composed_variant_equals_whole_variant_graph(written_blocks: Any) -> None:
    import onnxruntime as ort

    from hmt.deploy.blocks import whole_variant_onnx

    space = load_block_space(written_blocks.bundle)
    store = BlockStore(written_blocks.bundle, space)
    x = np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32)
    modules = written_blocks.summary["modules"]
    for arch_id in written_blocks.ids:
        runner = compose(store, space.parse(arch_id))
        whole = whole_variant_onnx(modules, written_blocks.loaded.space.parse(arch_id),
                                   written_blocks.root / f"{arch_id}.onnx")
        expected = ort.InferenceSession(str(whole), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = runner.logits(x)
        assert got.shape == expected.shape == (4, 10)
        assert float(np.max(np.abs(got - expected))) <= 1e-5
        # a different variant's answer differs: the check above can fail
        assert not np.allclose(got, compose(store, space.parse(written_blocks.ids[0])).logits(x), atol=1e-3) \
            or arch_id == written_blocks.ids[0]


def test_torch_free_sub_space_agrees_with_the_supernet(written_blocks: Any) -> None:
    from hmt.deploy.blocks import sample_sub_space, sub_space

    loaded = written_blocks.loaded
    space = load_block_space(written_blocks.bundle)
    sub = sub_space(loaded.space, [loaded.space.parse(a) for a in written_blocks.ids])
    rng = np.random.default_rng(3)
    for _ in range(40):
        arch = sample_sub_space(loaded.space, sub, rng)
        config = space.make(list(arch.choices), arch.exit_stage)
        assert config.arch_id == arch.arch_id
        assert space.parse(arch.arch_id) == config
        units, stage_end, exits = loaded.net.variant_units(arch)
        assert space.units_of(config) == (units, stage_end, exits)
        assert space.composable(config)
    with pytest.raises(UsageError, match="not in the shipped"):
        space.make(["base"] * len(space.positions), 0)  # stage 0's width 'base' is outside this sub-space


def test_shared_blocks_load_once_and_are_released_with_their_last_variant(written_blocks: Any) -> None:
    space = load_block_space(written_blocks.bundle)
    store = BlockStore(written_blocks.bundle, space)
    a, b = (compose(store, space.parse(i)) for i in written_blocks.ids)
    shared = set(a.variant.units) & set(b.variant.units)
    sessions = {u for u in set(a.variant.units) | set(b.variant.units) if not space.units[u].identity}
    assert shared and store.loads == len(sessions) == len(store.loaded_units())
    assert any(space.units[u].identity for u in a.variant.units)  # skipped blocks run no session
    both = store.loaded_bytes()
    assert both < sum(space.footprint_bytes(space.parse(i)) for i in written_blocks.ids)
    a.close()
    assert set(store.loaded_units()) == {u for u in b.variant.units if not space.units[u].identity}
    b.close()
    assert store.loaded_units() == [] and store.loaded_bytes() == 0 < both


def test_calibration_set_and_recorded_accuracy(written_blocks: Any) -> None:
    from hmt.runtime.blocks import accuracy_on

    space = load_block_space(written_blocks.bundle)
    x, y = load_calibration(written_blocks.bundle, space)
    assert x.shape == (48, 3, 32, 32) and y.shape == (48,)
    store = BlockStore(written_blocks.bundle, space)
    for arch_id in written_blocks.ids:
        # deploy measured it with torch on the same units; the device's ORT chain agrees
        assert accuracy_on(compose(store, space.parse(arch_id)), x, y) == pytest.approx(space.accuracy[arch_id])


def test_a_changed_block_is_refused(written_blocks: Any, tmp_path: Any) -> None:
    import shutil
    from types import SimpleNamespace

    from hmt.artifacts import load_artifact

    copy = tmp_path / "art"
    shutil.copytree(written_blocks.bundle.root, copy)
    space = load_block_space(written_blocks.bundle)
    unit = next(iter(space.units))
    path = copy / unit_file(unit)
    path.write_bytes(path.read_bytes()[:-8] + b"\0" * 8)
    artifact = load_artifact(copy, kind="blocks-test", verify_checksums=False)
    bundle = SimpleNamespace(artifact=artifact, root=copy)
    store = BlockStore(bundle, load_block_space(bundle))  # type: ignore[arg-type]
    with pytest.raises(ArtifactError):
        store.acquire([unit])
