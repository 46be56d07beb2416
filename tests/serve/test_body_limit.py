"""The default body limit takes a JSON batch of --max-batch inputs (one input always fits), bounded."""

from __future__ import annotations

import json

import numpy as np

from hmt.bundle import TensorSpec
from hmt.serve.http.service import ApiOptions


def test_a_json_batch_of_max_batch_images_fits_the_default_limit() -> None:
    spec = TensorSpec("input", (1, 3, 32, 32), "float32")
    x = np.random.default_rng(0).standard_normal((64, 3, 32, 32)).astype(np.float32)
    body = json.dumps({"inputs": x.tolist()}).encode()
    assert len(body) > 1 << 20  # what the limit was
    assert ApiOptions(max_batch=64).body_limit(spec) >= len(body)
    assert ApiOptions(max_batch=1).body_limit(spec) == 1 << 20  # one small input: the floor


def test_the_default_limit_stays_bounded_and_an_explicit_one_wins() -> None:
    big = TensorSpec("input", (1, 3, 224, 224), "float32")
    assert ApiOptions(max_batch=64).body_limit(big) == 64 << 20
    huge = TensorSpec("input", (1, 3, 1024, 1024), "float32")
    assert ApiOptions(max_batch=64).body_limit(huge) == 32 * 3 * 1024 * 1024 + 4096  # one input still fits
    assert ApiOptions(max_body_bytes=4096, max_batch=64).body_limit(big) == 4096
