"""``python -m benchmarks.protocol [--quick]``: every protocol benchmark in turn."""

from __future__ import annotations

import sys

from benchmarks.protocol import batching, latency, scrape


def main(argv: list[str]) -> None:
    for driver in (latency, batching, scrape):
        print(driver.run(list(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
