"""Connection limits of the client listeners (DESIGN.md §13): per listener, per client address.

One ``ConnectionLimits`` per broker process counts the open connections of every client
listener (MQTT over TCP, TLS, WebSocket and secure WebSocket, Kafka, AMQP and their TLS ports;
not the HTTP API and not the cluster plane).  A connection is counted against its listener
(the local port it came in on) and against its client's IP address, all listeners together,
from ``admit`` in its protocol's ``connection_made`` to ``release`` in ``connection_lost``.

Past either limit the connection is closed at once, before the protocol says a word: no
protocol has a refusal it could send before the client's first packet (an MQTT client that
has sent nothing cannot be given a CONNACK; Mosquitto closes too).  Each refusal is counted
in ``limits_rejections_count{limit="connections"|"connections_per_address"}``; it is logged
once per address per ``LOG_INTERVAL_S``, so a client retrying in a loop does not flood the log.

Invariant: every connection ``admit`` returned True for is in ``_open`` until ``release``, and
the two counters are exactly the sums over ``_open`` — ``release`` of a refused (or unknown)
connection changes nothing, so a protocol may call it unconditionally.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import flowmq_metrics as metrics
from flowmq_core.log_throttle import LogThrottle

log = logging.getLogger(__name__)

__all__ = ["ConnectionLimits"]

LOG_INTERVAL_S = 60.0
# limit label -> (config key, what was counted), for the log line.
_LIMITS = {
    "connections": ("max_connections", "on the listener"),
    "connections_per_address": ("max_connections_per_address", "from that address"),
}


class ConnectionLimits:
    """Open connections per listener (``max_per_listener``) and per client address
    (``max_per_address``); 0 means no limit."""

    def __init__(self, max_per_listener: int = 0, max_per_address: int = 0) -> None:
        self.max_per_listener = max_per_listener or sys.maxsize
        self.max_per_address = max_per_address or sys.maxsize
        self._open: dict[object, tuple[Any, str]] = {}  # connection -> (listener, address)
        self._per_listener: dict[Any, int] = {}
        self._per_address: dict[str, int] = {}
        self._log = LogThrottle(LOG_INTERVAL_S)  # one line per address per interval

    def admit(self, connection: object, transport: asyncio.BaseTransport) -> bool:
        """Count ``connection`` in; False when it passes a limit: ``transport`` is then closed
        and the connection must do nothing more (its ``connection_lost`` still follows)."""
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        address = str(peer[0]) if peer else "?"
        listener = local[1] if isinstance(local, tuple) and len(local) > 1 else local
        if self._per_listener.get(listener, 0) >= self.max_per_listener:
            self._refuse(transport, "connections", address, listener, self.max_per_listener)
            return False
        if self._per_address.get(address, 0) >= self.max_per_address:
            self._refuse(
                transport, "connections_per_address", address, listener, self.max_per_address
            )
            return False
        self._open[connection] = (listener, address)
        self._per_listener[listener] = self._per_listener.get(listener, 0) + 1
        self._per_address[address] = self._per_address.get(address, 0) + 1
        return True

    def release(self, connection: object) -> None:
        """``connection`` ended (a refused or unknown one: nothing to do)."""
        counted = self._open.pop(connection, None)
        if counted is None:
            return
        listener, address = counted
        _decrement(self._per_listener, listener)
        _decrement(self._per_address, address)

    def open_connections(self, address: str | None = None) -> int:
        """Connections counted now: all of them, or those from ``address``."""
        if address is None:
            return len(self._open)
        return self._per_address.get(address, 0)

    def _refuse(
        self, transport: asyncio.BaseTransport, limit: str, address: str, listener: Any, value: int
    ) -> None:
        transport.close()
        metrics.limits_rejections_count.labels(limit).inc()
        if not self._log.due(address):
            return
        key, scope = _LIMITS[limit]
        log.info(
            "connection from %s to port %s refused: %d connections %s (limit %s); further "
            "refusals for %.0f s are only counted (limits_rejections_count)",
            address,
            listener,
            value,
            scope,
            key,
            LOG_INTERVAL_S,
        )


def _decrement(counts: dict[Any, int], key: Any) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
