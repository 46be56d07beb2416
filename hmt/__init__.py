"""hmt: port a deep-learning model to heterogeneous, changing edge devices.

The library never prints and never imports the CLI (typer/rich); see ``commands/`` for that.
"""

__version__ = "0.1.0"
