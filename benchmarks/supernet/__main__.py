"""``python -m benchmarks.supernet [--quick] [--out-dir DIR] [NAME [ARGS ...]]``."""

import sys

from benchmarks.harness import area_main

if __name__ == "__main__":
    sys.exit(area_main("supernet"))
