"""INT8 / FP16 variants of a tiny chain: measured accuracy within tolerance, refused past a bound."""

from __future__ import annotations

import numpy as np
import pytest

from hmt.errors import UsageError, VerificationError
from hmt.precision import split_variant_id, variant_id
from hmt.precision.accuracy import chain_accuracy, check_accuracy, require_within
from hmt.precision.quantize import QuantOptions, quantize_chain


def test_variant_ids_round_trip() -> None:
    arch = "cifar_resnet8-abc123.e1.BB7x"
    assert variant_id(arch) == arch
    assert variant_id(arch, "int8") == f"{arch}.int8"
    assert split_variant_id(f"{arch}.int8") == (arch, "int8")
    assert split_variant_id(f"{arch}.fp16") == (arch, "fp16")
    assert split_variant_id(arch) == (arch, "fp32")
    assert split_variant_id(f"{arch}.fp32") == (arch, "fp32")  # said explicitly: the same variant
    assert split_variant_id("largest.fp32") == ("largest", "fp32")
    with pytest.raises(UsageError):
        variant_id(arch, "int4")


def test_int8_chain_is_qdq_and_within_tolerance(tiny_chain, tiny_data) -> None:
    segments, exits = tiny_chain
    x, y = tiny_data
    q_segments, q_exits = quantize_chain(segments, exits, x[:48], "int8", options=QuantOptions(pad_policy="always"))
    ops = {n.op_type for m in (*q_segments, *q_exits) for n in m.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    # Per-channel weights: the first conv's weight scale has one value per output channel,
    # 16 of them since the 8-channel chain is zero-padded to 16 before quantising (pad_channels).
    scales = [i for i in q_segments[0].graph.initializer if "_w__pad" in i.name and i.name.endswith("_scale")]
    assert scales and scales[0].dims == [16]
    unpadded = quantize_chain(segments, exits, x[:48], "int8", options=QuantOptions(pad_channels=0))[0]
    scales = [i for i in unpadded[0].graph.initializer if i.name.endswith("_w_scale")]
    assert scales and scales[0].dims == [8]
    check = check_accuracy("int8", (segments, exits), (q_segments, q_exits), x, y, max_drop=0.05)
    assert check.float_per_exit[-1] == 1.0  # labels are the float chain's predictions
    assert check.passed, check.to_json()
    assert 0.9 <= check.quantised_per_exit[-1] <= 1.0
    assert require_within(check, what="tiny.int8") is check


def test_badly_calibrated_int8_is_refused(tiny_chain, tiny_data) -> None:
    segments, exits = tiny_chain
    x, y = tiny_data
    # Calibrating on inputs 1000x too large stretches every activation range: the
    # quantisation steps swallow the real signal, and the measured accuracy must show it.
    q_segments, q_exits = quantize_chain(segments, exits, 1000 * x[:48], "int8")
    check = check_accuracy("int8", (segments, exits), (q_segments, q_exits), x, y, max_drop=0.05)
    assert not check.passed
    assert check.drop > 0.05
    with pytest.raises(VerificationError, match=r"tiny\.int8: int8 accuracy .* points below fp32"):
        require_within(check, what="tiny.int8")


def test_fp16_keeps_fp32_io_and_accuracy(tiny_chain, tiny_data) -> None:
    from onnx import TensorProto

    segments, exits = tiny_chain
    x, y = tiny_data
    h_segments, h_exits = quantize_chain(segments, exits, x, "fp16")
    for model in (*h_segments, *h_exits):
        assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
        assert any(i.data_type == TensorProto.FLOAT16 for i in model.graph.initializer)
    accuracy = chain_accuracy(h_segments, h_exits, x, y)
    assert accuracy[-1] >= 0.97


def test_bad_options_are_usage_errors(tiny_chain) -> None:
    segments, exits = tiny_chain
    with pytest.raises(UsageError):
        QuantOptions(activation="int4").validate()
    with pytest.raises(UsageError, match="pad policy"):
        QuantOptions(pad_policy="sometimes").validate()
    with pytest.raises(UsageError, match="pad channels"):
        QuantOptions(pad_channels=-1).validate()
    with pytest.raises(UsageError):
        check_accuracy("int8", (segments, exits), (segments, exits), np.zeros((1, 3, 8, 8), np.float32),
                       np.zeros(1, int), max_drop=2.0)


def test_fp16_chain_is_topologically_sorted_and_merges(tiny_chain, tiny_data) -> None:
    import onnx

    from hmt.fuse.engines.ort import merge_chain

    segments, exits = tiny_chain
    x, _ = tiny_data
    h_segments, h_exits = quantize_chain(segments, exits, x, "fp16")
    merged = merge_chain([*h_segments, h_exits[-1]])  # fuse's chain candidate: needs sorted graphs
    onnx.checker.check_model(merged)
    from hmt.precision.quantize import float_features

    (out,) = float_features(merged, [x[:1]])
    (ref,) = float_features(h_exits[-1], float_features(h_segments[1], float_features(h_segments[0], [x[:1]])))
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-3)


def test_measured_padding_keeps_one_of_the_two_exact_graphs(tiny_chain, tiny_data) -> None:
    """pad_policy="measure" times the padded and the plain INT8 graph and keeps one: either way
    its predictions match the plain one's (padding only adds exact zeros)."""
    segments, exits = tiny_chain
    x, y = tiny_data
    measured = quantize_chain(segments, exits, x[:48], "int8")
    plain = quantize_chain(segments, exits, x[:48], "int8", options=QuantOptions(pad_channels=0))
    a = chain_accuracy(*measured, x, y)
    b = chain_accuracy(*plain, x, y)
    assert abs(a[-1] - b[-1]) <= 0.03
