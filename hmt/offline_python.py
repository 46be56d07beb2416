"""Imported first by every offline-half package (supernet, profile, convert, fuse, data): below
Python 3.10 it raises ImportError saying what runs there instead. The device half (serve, the
runtime, the client, the offload device side) installs and runs on Python 3.8, as JetPack 5 ships;
the offline half and the ``hmt`` command line need 3.10.
"""

import sys

OFFLINE_PYTHON = (3, 10)

if sys.version_info < OFFLINE_PYTHON:
    raise ImportError(
        "this part of hmt is the offline half (train-supernet, profile-device, pareto, convert, fuse, deploy), "
        "which needs Python 3.10 or newer (this is {}); on Python 3.8 only the device half runs: serve a bundle "
        "with hmt.serve.running.session.serve_forever".format(".".join(str(v) for v in sys.version_info[:3]))
    )
