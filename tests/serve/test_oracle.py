"""The oracle the loop is measured against (issue 28): per phase, the most accurate variant whose static
run missed at most 5% of that phase's deadlines, else the one that missed fewest."""

from __future__ import annotations

from hmt.serve.reporting.oracle import compare, oracle_choice, phase_bounds, phase_scores
from hmt.serve.running.scenario import RequestRecord

ACCURACY = {"big": 0.92, "mid": 0.88, "small": 0.80}


def records(variant: str, miss_every: dict[int, int], per_phase: int = 100, phase_s: float = 5.0,
            budget_ms: float = 10.0) -> list[RequestRecord]:
    """``per_phase`` requests per phase; in phase k one in ``miss_every[k]`` is over the budget (0: none)."""
    out = []
    for k in range(3):
        every = miss_every.get(k, 0)
        for j in range(per_phase):
            missed = every and j % every == 0
            out.append(RequestRecord(time_s=k * phase_s + j * phase_s / per_phase, status=200, client_ms=1.0,
                                     latency_ms=2 * budget_ms if missed else budget_ms / 2, compute_ms=1.0,
                                     variant=variant, exit=1, predicted=0, label=None, latency_budget_ms=budget_ms))
    return out


def test_the_oracle_is_the_most_accurate_variant_within_five_percent_per_phase() -> None:
    bounds = phase_bounds([0.0, 5.0, 10.0], 15.0)
    assert bounds == [(0.0, 5.0), (5.0, 10.0), (10.0, 15.0)]
    static = {
        "big": phase_scores(records("big", {1: 2}), bounds, ACCURACY),  # 50% misses when loaded
        "mid": phase_scores(records("mid", {1: 25}), bounds, ACCURACY),  # 4%: meets the phase
        "small": phase_scores(records("small", {}), bounds, ACCURACY),
    }
    assert static["mid"][1].miss_share == 0.04 and static["big"][0].miss_share == 0.0
    assert oracle_choice(static, ACCURACY) == ["big", "mid", "big"]
    # Nothing within 5%: the fewest misses.
    worse = {"big": phase_scores(records("big", {1: 2}), bounds, ACCURACY),
             "mid": phase_scores(records("mid", {1: 5}), bounds, ACCURACY)}
    assert oracle_choice(worse, ACCURACY)[1] == "mid"


def test_the_adaptive_run_tracks_the_oracle_within_the_slack() -> None:
    bounds = phase_bounds([0.0, 5.0, 10.0], 15.0)
    static = {"big": phase_scores(records("big", {1: 2}), bounds, ACCURACY),
              "mid": phase_scores(records("mid", {}), bounds, ACCURACY)}
    # Adaptive: big, then mid with 6% misses (oracle mid: 0%, slack 5 points: not tracked), then big.
    adaptive = [r for r in records("big", {}) if not 5.0 <= r.time_s < 10.0]
    adaptive += [r for r in records("mid", {1: 16}) if 5.0 <= r.time_s < 10.0]
    rows = compare(phase_scores(sorted(adaptive, key=lambda r: r.time_s), bounds, ACCURACY), static, ACCURACY,
                   largest="big")
    assert [r["oracle_variant"] for r in rows] == ["big", "mid", "big"]
    assert [r["tracks_oracle"] for r in rows] == [True, False, True]
    assert rows[1]["accuracy_within_slack"] and not rows[1]["misses_within_slack"]
    assert rows[1]["static_largest"]["miss_share"] == 0.5


def test_replay_arrivals_keep_the_mean_rate() -> None:
    """Poisson and on/off arrivals (the bursty load shapes) send at the constant rate's mean."""
    import numpy as np

    from hmt.serve.running.scenario import ONOFF_PERIOD_S, DriveOptions, next_arrival_s

    period_s, end_s = 0.1, 100.0
    for arrivals in ("constant", "poisson", "onoff"):
        rng = np.random.default_rng(0)
        t, times = 0.0, []
        while t < end_s:
            t = next_arrival_s(t, period_s, 0.0, arrivals, rng)
            times.append(t)
        assert abs(len(times) - end_s / period_s) <= 0.05 * end_s / period_s, arrivals
        if arrivals == "onoff":  # nothing in the second half of a cycle
            assert all(t % ONOFF_PERIOD_S < ONOFF_PERIOD_S / 2 + 1e-9 or t % ONOFF_PERIOD_S > 1 - 1e-9 for t in times)
    assert DriveOptions(duration_s=1.0, arrivals="poisson").arrivals == "poisson"
    # Staggered clients stay staggered from one on/off cycle to the next (not all due at its start).
    sends = []
    for client in range(4):
        phase = period_s * client / 4
        t = phase / 2  # the first send: at the doubled rate, over half a gap (as _client_loop)
        sends.append(round(t, 9))
        for _ in range(60):
            t = next_arrival_s(t, period_s, 0.0, "onoff", None, phase)
            sends.append(round(t, 9))
    assert len(set(sends)) == len(sends)


def test_the_oracle_competes_within_the_phases_memory_budget() -> None:
    """A phase whose memory budget keeps big out: the oracle is the most accurate variant that fits
    (even though big's static run met its deadlines); nothing fits: the variant of least memory."""
    from types import SimpleNamespace

    from hmt.serve.reporting.oracle import phase_memory_budgets

    bounds = phase_bounds([0.0, 5.0, 10.0], 15.0)
    static = {v: phase_scores(records(v, {}), bounds, ACCURACY) for v in ACCURACY}
    memory = {"big": 3.5, "mid": 1.0, "small": 0.5}
    assert oracle_choice(static, ACCURACY, memory_mb=memory, phase_memory_mb=[None, 2.0, 0.0]) == \
        ["big", "mid", "small"]
    # The phase's budget is what the loop had: the median of its decisions' memory budget there.
    ticks = [SimpleNamespace(time_s=t, memory_budget_mb=m)
             for t, m in [(1.0, None), (6.0, 900.0), (7.0, 0.0), (8.0, 0.0), (11.0, 900.0)]]
    assert phase_memory_budgets(ticks, bounds) == [None, 0.0, 900.0]


def test_a_low_battery_phase_is_judged_by_the_loops_objective() -> None:
    """Where the battery was below full the loop weighed energy (eq. 3 at the phase's mu): the oracle
    is the meeting variant of the best score there, not the most accurate; at full battery (no
    ranking) it stays the most accurate. The phase's mu is the median of the loop's decisions."""
    from types import SimpleNamespace

    from hmt.serve.reporting.oracle import phase_mu

    bounds = phase_bounds([0.0, 5.0, 10.0], 15.0)
    static = {v: phase_scores(records(v, {}), bounds, ACCURACY) for v in ACCURACY}
    # eq. 3 at mu 0.2 on a table where big costs far more energy: small scores best.
    low = {"big": -0.6, "mid": -0.2, "small": 0.0}
    assert oracle_choice(static, ACCURACY, ranking=[None, low, None]) == ["big", "small", "big"]
    # The ranking chooses among the variants that met the phase only.
    loaded = {"big": phase_scores(records("big", {}), bounds, ACCURACY),
              "mid": phase_scores(records("mid", {}), bounds, ACCURACY),
              "small": phase_scores(records("small", {1: 2}), bounds, ACCURACY)}
    assert oracle_choice(loaded, ACCURACY, ranking=[None, low, None])[1] == "mid"
    rows = compare(static["small"], static, ACCURACY, largest="big", ranking=[None, low, None], mu=[1.0, 0.2, 1.0])
    assert [r["oracle_by"] for r in rows] == ["accuracy", "eq. 3", "accuracy"]
    assert [r["tracks_oracle"] for r in rows] == [False, True, False]
    ticks = [SimpleNamespace(time_s=t, mu=m) for t, m in [(1.0, 0.9), (6.0, 0.4), (7.0, 0.2), (8.0, 0.2)]]
    assert phase_mu(ticks, bounds) == [0.9, 0.2, None]


def test_budgets_met_counts_misses_and_answers_over_the_memory_budget() -> None:
    """A phase is met with at most 5% of deadlines missed and at most 5% of answers from a variant over
    the phase's memory budget: the static largest ignoring a memory cut fails it where the adaptive run,
    switched to a variant that fits, meets it; where nothing fits, the least-memory variant counts as within."""
    from hmt.serve.reporting.oracle import meets_budgets, over_memory_share

    bounds = phase_bounds([0.0, 5.0, 10.0], 15.0)
    static = {v: phase_scores(records(v, {}), bounds, ACCURACY) for v in ACCURACY}
    memory = {"big": 3.5, "mid": 1.0, "small": 0.5}
    # The adaptive run: big in phase 0, mid from phase 1 on, but 10 of phase 1's answers still from big.
    mixed = records("big", {})[:100] + records("mid", {})[100:]
    for j in range(100, 110):
        mixed[j] = records("big", {})[j]
    adaptive = phase_scores(mixed, bounds, ACCURACY)
    assert over_memory_share(adaptive[1], memory, 2.0) == 0.1
    assert not meets_budgets(adaptive[1], memory, 2.0)
    assert meets_budgets(adaptive[2], memory, 2.0) and not meets_budgets(static["big"][2], memory, 2.0)
    assert meets_budgets(static["big"][0], memory, None)  # no memory budget
    assert meets_budgets(static["small"][2], memory, 0.1)  # nothing fits: least memory is within
    assert not meets_budgets(static["mid"][2], memory, 0.1)
    missing = phase_scores(records("mid", {2: 10}), bounds, ACCURACY)  # 10% of phase 2 missed
    assert not meets_budgets(missing[2], memory, None) and meets_budgets(missing[1], memory, None)
    rows = compare(adaptive, static, ACCURACY, largest="big", memory_mb=memory, phase_memory_mb=[None, 2.0, 2.0])
    assert [r["budgets_met"]["static_largest"] for r in rows] == [True, False, False]
    assert [r["budgets_met"]["adaptive"] for r in rows] == [True, False, True]
    assert [r["budgets_met"]["oracle"] for r in rows] == [True, True, True]


def test_a_phase_without_a_latency_budget_is_judged_on_memory_and_accuracy() -> None:
    """A scenario of memory or battery steps alone sets no latency budget: no request is judged for a
    deadline, so every run that answered meets the phase's deadlines; it used to count as missed
    (every run 'over budget', none tracking the oracle, and the oracle ignoring the loop's objective)."""
    from dataclasses import replace

    from hmt.serve.reporting.oracle import meets_budgets

    bounds = phase_bounds([0.0, 5.0, 10.0], 15.0)

    def unbudgeted(variant: str) -> list[RequestRecord]:
        return [replace(r, latency_budget_ms=None) for r in records(variant, {})]

    static = {v: phase_scores(unbudgeted(v), bounds, ACCURACY) for v in ACCURACY}
    assert static["big"][0].judged == 0 and static["big"][0].miss_share is None
    memory = {"big": 3.5, "mid": 1.0, "small": 0.5}
    assert meets_budgets(static["big"][0], memory, None) and not meets_budgets(static["big"][1], memory, 2.0)
    low = {"big": -0.6, "mid": -0.2, "small": 0.0}
    assert oracle_choice(static, ACCURACY, memory_mb=memory, phase_memory_mb=[None, 2.0, None],
                         ranking=[None, None, low]) == ["big", "mid", "small"]
    adaptive = phase_scores(unbudgeted("big")[:100] + unbudgeted("mid")[100:], bounds, ACCURACY)
    rows = compare(adaptive, static, ACCURACY, largest="big", memory_mb=memory, phase_memory_mb=[None, 2.0, None])
    assert [r["tracks_oracle"] for r in rows] == [True, True, False]  # phase 2: mid, less accurate than big
    assert [r["budgets_met"]["adaptive"] for r in rows] == [True, True, True]
    assert [r["budgets_met"]["static_largest"] for r in rows] == [True, False, True]
    # A run that answered nothing in the phase did not meet it.
    silent = phase_scores([r for r in unbudgeted("big") if r.time_s < 10.0], bounds, ACCURACY)
    assert not meets_budgets(silent[2], memory, None)


def test_a_phase_without_a_request_is_left_out_of_the_counts() -> None:
    """A scenario's phase shorter than the gap between two requests (rows 1e-9 s apart) holds no request:
    it was counted as a phase the loop neither tracked nor met ('budgets met in 1 of 3 phases' where the
    only phase with requests was met). Its row says sent 0, and the counts are over the phases with requests."""
    from types import SimpleNamespace

    from hmt.serve.running.compare import Comparison

    bounds = [(0.0, 1e-9), (1e-9, 2e-9), (2e-9, 5.0)]
    static = {v: phase_scores(records(v, {}), bounds, ACCURACY) for v in ("big", "mid")}
    assert [s.requests for s in static["big"]] == [1, 0, 99]  # the request at 0 s falls in the first
    rows = compare(static["big"], static, ACCURACY, largest="big")
    assert [r["sent"] for r in rows] == [1, 0, 99]
    assert [r["tracks_oracle"] for r in rows] == [True, False, True]
    runs = {"adaptive": SimpleNamespace(summary={"switches": 0, "decision_us": None, "first_clean_window_s_max": None})}
    comparison = Comparison(largest="big", accuracy=ACCURACY, runs=runs, phases=rows)  # type: ignore[arg-type]
    summary = comparison.summary()
    assert summary["phases"] == 2 and summary["phases_without_requests"] == 1
    assert summary["phases_tracked"] == 2 and summary["phases_budgets_met"]["adaptive"] == 2


def test_the_whole_runs_accuracy_is_over_the_answers_without_a_latency_budget() -> None:
    """The summary's accuracy of each run was weighed by the requests judged for a deadline: a scenario
    without a latency budget judges none, so every run's accuracy read None (--json's comparison)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from hmt.serve.running.compare import Comparison

    bounds = phase_bounds([0.0, 5.0, 10.0], 15.0)
    static = {v: phase_scores([replace(r, latency_budget_ms=None) for r in records(v, {})], bounds, ACCURACY)
              for v in ("big", "small")}
    rows = compare(static["small"], static, ACCURACY, largest="big")
    runs = {"adaptive": SimpleNamespace(summary={"switches": 0, "decision_us": None, "first_clean_window_s_max": None})}
    summary = Comparison(largest="big", accuracy=ACCURACY, runs=runs, phases=rows).summary()  # type: ignore[arg-type]
    assert abs(summary["adaptive"]["table_accuracy"] - ACCURACY["small"]) < 1e-9
    assert abs(summary["static_largest"]["table_accuracy"] - ACCURACY["big"]) < 1e-9
    assert summary["adaptive"]["miss_share"] is None
