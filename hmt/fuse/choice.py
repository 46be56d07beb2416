"""Which verified candidate runs a variant: the fastest, with candidates within the measured
noise of each other tied (:func:`choose`, the rule in ``CHOICE_RULE``), and for the report how
far each candidate was from the choice (:func:`choice_margins`)."""

from __future__ import annotations

from typing import Any

from hmt.fuse.engines.timing import Timing, paired_ratios, ratio_noise

BASELINE = "ort-default(converted)"
DEFAULT_LIKE = (BASELINE, "ort[all,threads=default](fused)")


QUIET_QUANTILE = 0.1
CHOICE_RULE = (
    "eligible: ORT's defaults and the candidates whose p10 is within the tie threshold of the best default's; "
    "the fastest eligible median of round medians, unless other candidates are tied with it (round-by-round ratio "
    "median within max(tie_floor, half its inter-quartile range) of 1): then the tied candidate fastest at p10 "
    "(the quiet machine's rate), ORT's defaults first among those within tie_floor of that p10")


def _tie_threshold(candidate: Timing, reference: Timing, floor: float) -> tuple[float, float]:
    """(median round-by-round ratio of candidate to reference, the ratio under which they are tied)."""
    ratios = paired_ratios(candidate, reference)
    ordered = sorted(ratios)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return median, 1.0 + max(floor, ratio_noise(ratios))


def _tied(candidate: Timing, reference: Timing, floor: float) -> bool:
    ratio, threshold = _tie_threshold(candidate, reference, floor)
    return ratio <= threshold


def choose(timings: dict[str, Timing], *, tie_floor: float = 0.02) -> Timing:
    """The candidate fuse runs a variant with (the rule is ``CHOICE_RULE``).

    1. Eligible: ORT's defaults, and other candidates not slower than the best default at
       the fast end (the 10th percentile, the rate when the machine is quiet) by more than
       the tie threshold. On a shared machine the median is the contended rate: one ORT
       thread beat two there by 1.2x on ResNet-18 b1 while losing 2x whenever the other
       core was free; this keeps such a candidate out.
    2. The fastest eligible candidate by median of round medians.
    3. Tied with it: every eligible candidate whose round-by-round ratio to it (the rounds
       pair the two, so a slow spell of the machine hits both) has a median within
       ``max(tie_floor, measured noise)`` of 1, the noise being half the inter-quartile
       range of those ratios. Within that noise the median order is as likely as not to
       flip on the next run, so a tie goes to the candidate fastest at the 10th percentile:
       on a shared machine a two-thread candidate ties a one-thread one while the other
       core is busy and wins by 1.4-1.8x whenever it is free (on a shared VM); a
       candidate that is never slower and sometimes faster is the safe pick. Candidates
       within ``tie_floor`` of that p10 too are equal: ORT's defaults first, then the
       fastest median.
    """
    defaults = [timings[k] for k in DEFAULT_LIKE if k in timings]
    if not defaults:
        return min(timings.values(), key=lambda t: t.median_ms)
    best_default = min(defaults, key=lambda t: t.median_ms)
    quiet = best_default.percentile_ms(QUIET_QUANTILE)
    eligible = [t for t in timings.values() if t.name in DEFAULT_LIKE
                or t.percentile_ms(QUIET_QUANTILE) <= quiet * _tie_threshold(t, best_default, tie_floor)[1]]
    fastest = min(eligible, key=lambda t: t.median_ms)
    tied = [fastest] + [t for t in eligible if t is not fastest and _tied(t, fastest, tie_floor)]
    if len(tied) == 1:
        return fastest
    quietest = min(t.percentile_ms(QUIET_QUANTILE) for t in tied)
    equal = [t for t in tied if t.percentile_ms(QUIET_QUANTILE) <= quietest * (1 + tie_floor)]
    return min(equal, key=lambda t: (t.name not in DEFAULT_LIKE, t.median_ms))


def choice_margins(timings: dict[str, Timing], chosen: Timing, *, tie_floor: float) -> dict[str, Any]:
    """For the report: each candidate's round-by-round ratio to the chosen one and its tie threshold."""
    out: dict[str, Any] = {}
    for name, t in timings.items():
        if t is chosen:
            continue
        ratio, threshold = _tie_threshold(t, chosen, tie_floor)
        out[name] = {"median_ratio_to_choice": round(ratio, 4), "tie_threshold": round(threshold, 4),
                     "tied": ratio <= threshold}
    return out
