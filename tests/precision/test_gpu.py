"""GPU providers: an FP16 chain on ORT's CUDA provider agrees with fp32 (run with -m gpu on a GPU host)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_fp16_chain_on_cuda_provider_agrees_with_fp32(tiny_chain, tiny_data) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDA provider (install onnxruntime-gpu)")
    from hmt.fuse.engines.ort import merge_chain
    from hmt.precision.measure import path_runner, time_chains
    from hmt.precision.quantize import quantize_chain

    segments, exits = tiny_chain
    x, _ = tiny_data
    half = quantize_chain(segments, exits, x, "fp16")
    fp32_out = path_runner(segments, exits, x[:1])()[0]
    session = ort.InferenceSession(merge_chain([*half[0], half[1][-1]]).SerializeToString(),
                                   providers=["CUDAExecutionProvider"])
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    fp16_out = session.run(None, {session.get_inputs()[0].name: x[:1]})[0]
    np.testing.assert_allclose(fp16_out, fp32_out, rtol=2e-2, atol=2e-2)
    timings = time_chains({"fp32": (segments, exits), "fp16": half}, x[:1], device="cuda", repeats=5)
    assert set(timings) == {"fp32", "fp16"}
