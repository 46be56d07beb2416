"""Client-reported latency (``X-HMT-Client-Latency-Ms``), accepted only where it is plausible.

:mod:`hmt.client` sends, with each request, the latency it measured for its previous one on
the same keep-alive connection. Any client can put any number there, and ``/metrics`` and the
controller's record of whole-request latency summarise what is accepted, so an unchecked
header let one client poison both (a few requests reporting 9,999,999 ms). A report is
accepted only when the same connection (the client's address and port) had a prediction
answered before, and it is at most that answer's server-side span plus
:data:`NETWORK_SLACK_MS`. So a client can only describe its own previous request, and can
add at most the slack to it. (No lower bound: the server's span ends when its event loop
gets back from handing the last byte over, which can be after the client has read it.)
Refused reports are counted, never an error: the prediction itself is answered.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

NETWORK_SLACK_MS = 1000.0  # transfer and client-side time a report may add to the server's span
_MAX_CONNECTIONS = 4096  # recent connections remembered (least recently answered forgotten first)


class ClientReports:
    """The last answered span per connection, and the reports accepted against it."""

    def __init__(self, slack_ms: float = NETWORK_SLACK_MS) -> None:
        self.slack_ms = slack_ms
        self.accepted = 0
        self.refused = 0
        self._last_span_ms: OrderedDict[Hashable, float] = OrderedDict()
        self._lock = threading.Lock()

    def answered(self, connection: Hashable | None, span_ms: float, reported_ms: float | None) -> float | None:
        """Record ``span_ms`` as ``connection``'s latest answer; returns ``reported_ms`` when it is
        plausible for the answer before (else None, counted as refused)."""
        with self._lock:
            previous = None if connection is None else self._last_span_ms.pop(connection, None)
            if connection is not None:
                self._last_span_ms[connection] = span_ms
                while len(self._last_span_ms) > _MAX_CONNECTIONS:
                    self._last_span_ms.popitem(last=False)
            if reported_ms is None:
                return None
            if previous is not None and reported_ms <= previous + self.slack_ms:
                self.accepted += 1
                return reported_ms
            self.refused += 1
            return None

    def to_json_dict(self) -> dict[str, float]:
        return {"accepted": self.accepted, "refused": self.refused, "slack_ms": self.slack_ms}
