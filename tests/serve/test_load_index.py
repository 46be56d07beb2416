"""Load index (AdaScale eq. 2) and AR forecast on synthetic series."""

from __future__ import annotations

import numpy as np
import pytest

from hmt.errors import UsageError
from hmt.serve import LoadForecaster, LoadWeights, ResourceSample, fit_ar, load_index, load_index_of


def test_load_index_weights_and_absent_gpu() -> None:
    w = LoadWeights(cpu=2.0, gpu=1.0, memory=1.0)
    assert load_index(0.5, 0.25, 1.0, w) == pytest.approx((2 * 0.5 + 1.0 + 0.25) / 4)
    # no GPU reading: its weight drops out
    assert load_index(0.5, 0.25, None, w) == pytest.approx((2 * 0.5 + 0.25) / 3)
    assert load_index(2.0, -1.0, None, LoadWeights(memory=1.0)) == pytest.approx(0.5)  # clipped to 0..1
    # The default counts the CPU only, as profile-device's alpha fit does.
    assert load_index(0.3, 0.9, 0.8, LoadWeights()) == pytest.approx(0.3)
    with pytest.raises(UsageError):
        LoadWeights(cpu=-1.0)
    with pytest.raises(UsageError):
        load_index(0.5, 0.5, None, LoadWeights(cpu=0.0, gpu=1.0, memory=0.0))


def test_load_index_of_sample() -> None:
    s = ResourceSample(time_s=0.0, cpu_util=0.4, mem_available_bytes=750, mem_total_bytes=1000, gpu_util=None)
    assert s.mem_util == pytest.approx(0.25)
    assert load_index_of(s, LoadWeights(memory=1.0)) == pytest.approx((0.4 + 0.25) / 2)
    assert load_index_of(s) == pytest.approx(0.4)


def test_fit_ar_recovers_coefficients() -> None:
    rng = np.random.default_rng(0)
    c, phi1, phi2 = 0.1, 0.6, -0.3
    x = np.zeros(3000)
    for t in range(2, x.size):
        x[t] = c + phi1 * x[t - 1] + phi2 * x[t - 2] + rng.normal(0, 0.02)
    model = fit_ar(x, 2)
    assert model.coefficients == pytest.approx((phi1, phi2), abs=0.03)
    assert model.intercept == pytest.approx(c, abs=0.01)
    with pytest.raises(UsageError):
        fit_ar([0.1, 0.2], 2)


def test_ar_forecast_iterates() -> None:
    from hmt.serve import ARModel

    model = ARModel(intercept=0.0, coefficients=(0.5,))
    assert model.forecast([0.8], 3) == pytest.approx([0.4, 0.2, 0.1])


def test_forecaster_falls_back_then_tracks() -> None:
    f = LoadForecaster(order=2, window=40)
    with pytest.raises(UsageError):
        f.forecast(1)
    f.update(0.3)
    assert f.forecast(3) == pytest.approx([0.3, 0.3, 0.3])  # too little history
    assert f.model is None
    # a noiseless AR(1) toward 0.5: x_t = 0.25 + 0.5 x_{t-1}
    x = 0.9
    for _ in range(30):
        f.update(x)
        x = 0.25 + 0.5 * x
    out = f.forecast(2)
    assert out[0] == pytest.approx(x, abs=1e-6)
    assert out[1] == pytest.approx(0.25 + 0.5 * x, abs=1e-6)


def test_forecaster_constant_and_clipped() -> None:
    f = LoadForecaster(order=2, window=20)
    for _ in range(20):
        f.update(0.7)
    assert f.forecast(5) == pytest.approx([0.7] * 5)
    g = LoadForecaster(order=1, window=20)
    for v in np.linspace(0.5, 1.0, 20):  # rising ramp: the extrapolation is clipped at 1
        g.update(float(v))
    assert np.all(g.forecast(30) <= 1.0)
    with pytest.raises(UsageError):
        LoadForecaster(order=3, window=4)


def test_a_primed_sampler_measures_from_the_priming() -> None:
    """PsutilSampler.prime: CPU spent before it (a replay's load generator starting) is not in the next
    sample. This process burns ~0.3 s of CPU, primes, sleeps: its own share of the next sample is low."""
    import time

    from hmt.serve.deciding.monitor import PsutilSampler

    sampler = PsutilSampler(use_nvml=False)
    until = time.perf_counter() + 0.3
    x = 0.0
    while time.perf_counter() < until:
        x = x * 1.0000001 + 1.0
    sampler.prime()
    time.sleep(0.1)
    own = sampler().own_cpu_util
    assert own is not None and own < 0.2
