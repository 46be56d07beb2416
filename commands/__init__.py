"""The hmt command line: thin wrappers that turn library calls into terminal output.

The command line needs Python 3.10 (typer reads the options' annotations when it runs); below it,
the console script (:mod:`commands.entry`) runs the device command line instead
(:mod:`commands.device_cli`: ``hmt serve`` on JetPack 5's Python 3.8).
"""
