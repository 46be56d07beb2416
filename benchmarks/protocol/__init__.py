"""Benchmarks of serve's protocols (issue 24): tritonclient on /v2 against /v1, dynamic batching, scrape cost.

Run all with ``python -m benchmarks.protocol [--quick]``, or one driver with
``python -m benchmarks.protocol.NAME [--quick]``; each writes ``benchmarks/protocol/results/NAME.json``
(``--quick``: a temporary directory). The server runs in its own process (``python -m commands serve``),
the clients in the driver's.
"""
