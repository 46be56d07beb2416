"""``python -m benchmarks.device [--quick]``: every device benchmark (the emulated arm64 device)."""

from __future__ import annotations

import sys

from benchmarks.device.emulated_arm64 import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
