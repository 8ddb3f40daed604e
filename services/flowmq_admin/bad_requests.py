"""One info line, not an ERROR traceback, for an HTTP request aiohttp cannot parse.

aiohttp answers a malformed request (bad request line, header, chunk size ...) with 400
itself, before any handler or middleware runs, and then logs the parser's exception on
``aiohttp.server`` at ERROR with its traceback.  That is the client's mistake, not the
broker's: a filter on that logger turns such a record into one info line (what was wrong
and from where), as the MQTT, Kafka and AMQP listeners log a malformed packet.  Every other
record of the logger (a handler's own exception) is left as it is.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

_SERVER_LOGGER = "aiohttp.server"


class _BadRequestFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            lines = str(exc.message).strip().splitlines() or [type(exc).__name__]
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg = "HTTP %s: bad request (%d %s)"
            record.args = (remote, exc.code, lines[0].rstrip(":"))
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        return True


_FILTER = _BadRequestFilter()


def log_bad_requests_briefly() -> None:
    """Install the filter (once: repeated calls change nothing)."""
    logger = logging.getLogger(_SERVER_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


__all__ = ["log_bad_requests_briefly"]
