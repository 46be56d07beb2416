"""The child process of the harness: ``python -m benchmarks._run AREA NAME MODE OUT_DIR COMMAND [ARGS ...]``."""

import sys
from pathlib import Path

from benchmarks.harness import run_here

if __name__ == "__main__":
    area, name, mode, out_dir, command, *args = sys.argv[1:]
    run_here(area, name, mode, args, Path(out_dir), command)
