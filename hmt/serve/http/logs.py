"""serve's logging: plain text or one JSON object per line, with or without an access log.

:func:`logging_config` is a :func:`logging.config.dictConfig` dictionary that uvicorn applies at
start (``uvicorn.Config(log_config=...)``): the ``hmt`` loggers, uvicorn's error log and, when
asked, its access log, all to stderr through one formatter. :class:`JsonFormatter` writes ``ts``
(UTC, ISO 8601), ``level``, ``logger`` and ``message``; an access-log record also carries
``client``, ``method``, ``path``, ``http_version`` and ``status`` as fields, so a log shipper
needs no pattern to parse it. Tokens never reach a log: the access log has the request line, not
its headers.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

from hmt.compat import strict_zip

LOG_FORMATS = ("text", "json")
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            doc.update(strict_zip(_ACCESS_FIELDS, record.args))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def logging_config(level: str = "warning", log_format: str = "text", access_log: bool = False) -> dict[str, Any]:
    """The dictConfig of serve's loggers (``level`` for all but the access log, which logs at info)."""
    if log_format not in LOG_FORMATS:
        from hmt.errors import UsageError

        raise UsageError(f"--log-format must be one of {list(LOG_FORMATS)}, got {log_format!r}")
    formatter: dict[str, Any] = {"()": f"{__name__}.JsonFormatter"} if log_format == "json" else {
        "format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    handler = {"class": "logging.StreamHandler", "formatter": "serve", "stream": "ext://sys.stderr"}
    level_name = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"serve": formatter},
        "handlers": {"serve": handler},
        "loggers": {
            "hmt": {"handlers": ["serve"], "level": level_name, "propagate": False},
            "uvicorn": {"handlers": ["serve"], "level": level_name, "propagate": False},
            "uvicorn.error": {"level": level_name},
            "uvicorn.access": {"handlers": ["serve"] if access_log else [], "level": "INFO" if access_log
                               else "CRITICAL", "propagate": False},
        },
    }
