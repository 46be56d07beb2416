"""``python -m commands``: the hmt command line without the console script."""

from commands.entry import main

main()
