"""serve.json values of the wrong JSON type are refused naming the key, before any range check compares them."""

from __future__ import annotations

from typing import Any

import pytest

from hmt.errors import UsageError
from hmt.runtime.settings import MAX_ESTIMATES_WINDOW, MIN_MONITOR_PERIOD_S, ServeSettings


@pytest.mark.parametrize(("config", "words"), [
    ({"budgets": {"latency_ms": "fast"}}, "budgets: latency_ms must be a finite number or null, got 'fast'"),
    ({"budgets": {"memory_mb": [64]}}, "budgets: memory_mb must be a finite number or null, got list"),
    ({"monitor_period_s": [1]}, "monitor_period_s must be a finite number, got list"),
    ({"monitor_period_s": "0.25"}, "monitor_period_s must be a finite number, got '0.25'"),
    ({"early_exit": {"confidence": True}}, "early_exit: confidence must be a finite number, got True"),
    ({"early_exit": {"enabled": 1}}, "early_exit: enabled must be true or false, got 1"),
    ({"estimates": {"window": 64.5}}, "estimates: window must be an integer, got 64.5"),
    ({"estimates": {"window": float("nan")}}, "estimates: window must be an integer, got nan"),
    ({"switch": {"min_dwell_s": float("inf")}}, "switch: min_dwell_s must be a finite number, got inf"),
    ({"switch": {"miss_streak": None}}, "switch: miss_streak must be an integer, got None"),
    ({"engine": 3}, "engine must be a string, got 3"),
    ({"optimizer": {"alpha_latency": {"a": 1}}}, "optimizer: alpha_latency must be a finite number or null, got dict"),
])
def test_a_value_of_the_wrong_type_names_its_key(config: dict[str, Any], words: str) -> None:
    with pytest.raises(UsageError) as err:
        ServeSettings.from_mapping(config, where="b/serve.json")
    assert str(err.value) == f"b/serve.json: {words}"


def test_numbers_stay_numbers_and_null_stays_allowed() -> None:
    settings = ServeSettings.from_mapping({"budgets": {"latency_ms": 40, "memory_mb": None},
                                           "switch": {"min_dwell_s": 0}, "monitor_period_s": 1})
    assert settings.budgets.latency_ms == 40 and settings.switch.min_dwell_s == 0
    assert settings.monitor_period_s == 1


@pytest.mark.parametrize(("config", "words"), [
    ({"monitor_period_s": 1e-9}, f"monitor_period_s must be in [{MIN_MONITOR_PERIOD_S}, "),
    ({"monitor_period_s": 1e9}, "monitor_period_s must be in ["),
    ({"estimates": {"window": 10**12}}, f"estimates.window must be at most {MAX_ESTIMATES_WINDOW}"),
])
def test_the_loop_period_and_the_windows_are_bounded(config: dict[str, Any], words: str) -> None:
    # A period near zero made the idle control loop spin a core; a window is a size serve keeps.
    with pytest.raises(UsageError) as err:
        ServeSettings.from_mapping(config)
    assert words in str(err.value)


def test_a_latency_budget_below_a_microsecond_is_refused_everywhere() -> None:
    """Ratios of latency to such a budget overflow (a summary would hold Infinity, not JSON)."""
    from hmt.errors import InputError
    from hmt.runtime.settings import Budgets
    from hmt.serve.running.scenario import Scenario

    assert Budgets(latency_ms=1e-3).latency_ms == 1e-3
    for tiny in (5e-324, 1e-310, 1e-4):
        with pytest.raises(UsageError, match="budgets.latency_ms must be a number >= 0.001"):
            Budgets(latency_ms=tiny)
        with pytest.raises(InputError, match="latency_budget_ms"):
            Scenario.from_text(f"time_s,latency_budget_ms\n0,{tiny!r}\n")
