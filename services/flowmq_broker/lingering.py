"""Lingering close: end a connection so that the client reads the broker's last words.

A socket closed while the client's bytes are still arriving (or unread in the kernel) is
answered with a TCP reset, and a reset makes the client's kernel drop what it had received
but not yet read: a client that sent too much reads ``ConnectionResetError`` instead of the
DISCONNECT (MQTT) or Connection.Close (AMQP) that said why.  So, as nginx and Apache do, the
broker half-closes instead (FIN once the write buffer is sent: ``write_eof``) and keeps reading
and discarding for a while, closing at the client's end of stream, after ``LINGER_S`` or after
``LINGER_MAX_BYTES``, whichever comes first.  TLS transports cannot half-close (a TLS close is
a close): there the close is only delayed the same bounded way, still reading.

The connection itself ends at once: its protocol's ``connection_lost`` runs on the next turn
of the loop, as after an ordinary close, and only the socket lingers on (drained by a
``_Drain`` protocol put in its place), so sessions, wills and counts are not held up by a
client that never closes its side.
"""

from __future__ import annotations

import asyncio

__all__ = ["LINGER_MAX_BYTES", "LINGER_S", "close"]

LINGER_S = 2.0
LINGER_MAX_BYTES = 8 * 1024 * 1024  # reading and discarding is cheap; the time bounds the rest


class _Drain(asyncio.Protocol):
    """Reads and discards what a lingering socket still receives, then closes it."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._left = LINGER_MAX_BYTES
        self._timer = asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        self._left -= len(data)
        if self._left < 0:
            self._transport.close()

    def eof_received(self) -> bool:
        return False  # the client is done: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()


def close(transport: asyncio.Transport | None, protocol: asyncio.BaseProtocol) -> None:
    """Close ``transport`` (``protocol``'s) after what was written to it, lingering as the
    module says; ``protocol.connection_lost(None)`` follows on the next turn of the loop.
    The protocol must write nothing more to it (a half-closed transport refuses writes).

    A transport that closes gracefully by itself (``closes_gracefully``: the WebSocket one,
    whose close handshake already waits for the client) is only closed."""
    if transport is None or transport.is_closing():
        return
    if getattr(transport, "closes_gracefully", False):
        transport.close()
        return
    transport.set_protocol(_Drain(transport))
    asyncio.get_running_loop().call_soon(protocol.connection_lost, None)
    transport.resume_reading()  # the protocol may have paused it (CONNECT, backpressure)
    if transport.can_write_eof():
        transport.write_eof()
