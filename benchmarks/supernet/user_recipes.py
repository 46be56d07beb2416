"""Issue 22: recipes tried against the twin gap, one summary per elastified original.

The same summary as ``user_stream`` (front, GPU seconds per phase, fewest MACs within 1 and 2
points, targets), kept apart so the baseline run's summary stays what it measured:

    python -m benchmarks.supernet user_recipes --model NAME FRONT_CSV HISTORY_JSON - [--test-half NAME] ...
"""

from __future__ import annotations

from benchmarks.harness import Driver
from benchmarks.supernet.user_stream import _claims, main

BENCH = Driver(
    baseline="each original itself (the largest variant, bit-exact), and the baseline recipe's run beside the others",
    needs="front CSVs and training histories of GPU runs (--model NAME FRONT HISTORY -)",
    claims=_claims,
)

if __name__ == "__main__":
    main()
