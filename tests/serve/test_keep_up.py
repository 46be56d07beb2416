"""A variant is judged at the request rate it would serve (issue 28): one the cores cannot keep up with
queues, so its estimate grows with its utilisation; the active variant keeps its measured figures."""

from __future__ import annotations

import pytest

from hmt.errors import UsageError
from hmt.serve.deciding.keep_up import RequestRate, at_own_load


def test_a_variant_the_cores_cannot_keep_up_with_is_inflated_by_its_utilisation() -> None:
    latencies = [30.0, 99.0]
    # 40 requests/s on 2 cores: a 50 ms variant keeps both cores busy; the 99 ms one needs 1.98 of 2.
    out = at_own_load(latencies, 40.0, 2.0, active=0)
    assert out[0] == 30.0
    assert out[1] == pytest.approx(99.0 * 99.0 / 50.0)  # 196 ms: what its requests took at p95 (184-191 ms)


def test_the_active_variant_and_variants_that_keep_up_are_left_as_measured() -> None:
    latencies = [30.0, 99.0]
    assert at_own_load(latencies, 40.0, 2.0, active=1) is latencies  # its own queue is in the measured wait
    assert at_own_load(latencies, 10.0, 2.0, active=0) is latencies  # 10 requests/s: 0.5 cores busy
    assert at_own_load(latencies, 0.0, 2.0, active=-1) is latencies  # no requests yet


def test_the_request_rate_counts_the_answers_of_the_last_window() -> None:
    rate = RequestRate(window_s=1.0)
    for i in range(40):
        rate.add(i * 0.025)  # 40 requests/s for one second
    assert rate.per_s(0.999) == pytest.approx(40.0)
    assert rate.per_s(1.5) == pytest.approx(20.0)  # the first half second has left the window
    assert rate.per_s(3.0) == 0.0
    with pytest.raises(UsageError, match="window_s"):
        RequestRate(window_s=0.0)
