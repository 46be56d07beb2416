"""Cut points: found where one tensor crosses, head then tail equals the whole, bundles carry them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from offload_bundles import INPUT_SHAPE, segment_0

from hmt.bundle import load_bundle
from hmt.convert.partition import find_inner_cuts, smaller_than_before, split_model, verify_split
from hmt.deploy.offload import OffloadBundles
from hmt.errors import VerificationError
from hmt.offload.codec import wire_bytes
from hmt.offload.parts import Answer, SplitChain
from hmt.offload.plan import boundary_plan, load_plan


def test_cuts_fall_between_blocks_never_inside_the_residual() -> None:
    cuts = find_inner_cuts(segment_0(np.random.default_rng(0)))
    # c2 is live together with r1 (the residual), so no cut after the second conv.
    assert [c.tensor for c in cuts] == ["c1", "r1", "a2", "r2", "c3"]
    assert cuts[-1].shape == (1, 4, 4, 4) and cuts[0].shape == (1, 8, 8, 8)
    kept = smaller_than_before(cuts, int(np.prod(INPUT_SHAPE)))
    assert [c.tensor for c in kept] == ["c3"]  # the only one smaller than the 192-element input


def test_head_then_tail_equals_whole_for_every_cut() -> None:
    model = segment_0(np.random.default_rng(1))
    for cut in find_inner_cuts(model):
        head, tail = split_model(model, cut.tensor)
        assert [o.name for o in head.graph.output] == [cut.tensor] == [i.name for i in tail.graph.input]
        assert verify_split(model, head, tail, seed=5, samples=3) <= 1e-5


def test_a_wrong_split_is_refused() -> None:
    model = segment_0(np.random.default_rng(1))
    other = segment_0(np.random.default_rng(2))  # same graph, other weights
    head, _ = split_model(model, "r2")
    _, tail = split_model(other, "r2")
    with pytest.raises(VerificationError, match="differs from the whole graph"):
        verify_split(model, head, tail, seed=0)


def test_bundle_cuts_sizes_and_chain_equality(offload_bundles: OffloadBundles) -> None:
    device = load_bundle(offload_bundles.device)
    plan = load_plan(device)
    deep = plan.for_variant("deep")
    assert [(c.kind, c.device_segments, c.tensor.name) for c in deep] == [
        ("input", 0, "input"), ("inner", 0, "c3"), ("boundary", 1, "features_0")]
    assert [c.kind for c in plan.for_variant("shallow")] == ["input", "inner"]
    inner = deep[1]
    assert inner.size_bytes("float32") == 64 * 4 and inner.size_bytes("float16") == 128
    assert inner.size_bytes("int8") == wire_bytes(64, "int8") == 64 + 4
    assert offload_bundles.max_rel_error <= 1e-5
    # Every cut, the whole chain: the device's head then the tail equals running it all locally.
    chain = SplitChain(device, device.spec.variant("deep"), deep)
    rng = np.random.default_rng(4)
    for _ in range(3):
        x = rng.standard_normal(INPUT_SHAPE).astype(np.float32)
        whole = chain.run_local(x, None)
        for cut in deep:
            middle = chain.run_head(x, cut, None)
            assert not isinstance(middle, Answer) and middle.shape == cut.tensor.shape
            split = chain.run_tail(middle, cut, None)
            assert (split.class_index, split.exit) == (whole.class_index, whole.exit)
            assert abs(split.confidence - whole.confidence) <= 1e-5


def test_peer_bundle_has_tails_not_heads(offload_bundles: OffloadBundles) -> None:
    peer = load_bundle(offload_bundles.peer)
    names = {r.path for r in peer.artifact.manifest.files}
    assert any(n.endswith(".tail.onnx") for n in names) and not any(n.endswith(".head.onnx") for n in names)
    assert load_plan(peer).for_variant("deep")[1].kind == "inner"


def test_split_bundles_keep_the_source_config(offload_bundles: OffloadBundles, conv_bundle: Path) -> None:
    # serve checks the manifest's target against bundle.json's: a split that dropped the
    # source's config was refused by `hmt serve DEVICE --peer` on a real (x86-64) bundle.
    source = load_bundle(conv_bundle).artifact.manifest.config
    for path, role in ((offload_bundles.device, "device"), (offload_bundles.peer, "peer")):
        config = load_bundle(path).artifact.manifest.config
        assert {k: config[k] for k in source} == dict(source) and config["role"] == role


def test_a_plain_bundle_offloads_at_its_boundaries(conv_bundle: Path) -> None:
    bundle = load_bundle(conv_bundle)
    assert load_plan(bundle) == boundary_plan(bundle)
    assert [c.kind for c in boundary_plan(bundle).for_variant("deep")] == ["input", "boundary"]
