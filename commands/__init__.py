"""The hmt command line: thin wrappers that turn library calls into terminal output.

The command line needs Python 3.10; below it, importing this package stops with one line saying
what runs there instead (the device half: serve started from Python).
"""

import sys

if sys.version_info < (3, 10):
    sys.stderr.write(
        "hmt: the command line needs Python 3.10 or newer (this is {}); on Python 3.8 the device half runs: "
        "python -c \"from hmt.serve.running.session import serve_forever; ...\" (see the README's "
        "'Python floor')\n".format(".".join(str(v) for v in sys.version_info[:3]))
    )
    raise SystemExit(2)
