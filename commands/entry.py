"""The ``hmt`` console script and ``python -m commands``: the full command line on Python 3.10 or
newer, the device command line below it (:mod:`commands.device_cli`: ``hmt serve`` on JetPack 5's
Python 3.8). Nothing here may need more than Python 3.8."""

from __future__ import annotations

import sys
from typing import Any

FULL_PYTHON = (3, 10)


def main() -> Any:
    if sys.version_info < FULL_PYTHON:
        from commands.device_cli import main as device_main

        raise SystemExit(device_main(sys.argv[1:]))
    from commands.app import cli

    return cli()
