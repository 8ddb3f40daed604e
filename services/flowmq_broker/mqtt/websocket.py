"""MQTT over WebSocket (MQTT 5 §6, 3.1.1 §6): the ``mqtt_ws`` and ``mqtt_wss`` listeners.

A small aiohttp app with one route, ``GET /mqtt``, upgraded to a WebSocket offering the
``mqtt`` subprotocol; any other path is answered 404.  Each WebSocket is served by an
ordinary ``MqttConnection``, so the broker semantics and limits are those of the TCP port:

- binary frames' payloads are fed to ``MqttConnection.data_received`` as they come (the
  MQTT decoder is incremental: a packet may span frames, a frame may hold several packets);
- a text frame is a protocol error (MQTT over WebSocket is binary only): the WebSocket is
  closed with 1003 (unsupported data), and the connection ends as if the socket had closed;
- ``_WsTransport`` stands in for the ``asyncio.Transport`` the connection writes to: writes
  are queued and sent, in order, one binary frame per write, by one task per WebSocket;
  ``pause_reading`` stops reading frames (aiohttp then stops reading the socket), and the
  write buffer limits call the connection's ``pause_writing``/``resume_writing`` as TCP does;
- when the WebSocket ends (either side, or the socket), ``connection_lost`` runs once.

``mqtt_wss`` is the same app on a second site with the broker's TLS context (flowmq_broker.tls),
opened only when TLS is configured.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from flowmq_broker.listeners import bind_socket
from flowmq_broker.mqtt.connection import MqttConnection

if TYPE_CHECKING:
    from ssl import SSLContext

    from flowmq_broker.mqtt.host import ConnectionHost

log = logging.getLogger(__name__)

__all__ = ["MqttWebSocketListener", "WS_PATH", "WS_SUBPROTOCOL"]

WS_PATH = "/mqtt"
WS_SUBPROTOCOL = "mqtt"
# A WebSocket message (frame payload, reassembled) may hold a whole maximum-size MQTT packet
# and then some: clients may put several packets in one message.
_MSG_SLACK = 64 * 1024


class _WsTransport(asyncio.Transport):
    """What ``MqttConnection`` uses of a transport, over one aiohttp WebSocket."""

    # Its close is a WebSocket close handshake: the client reads what was sent, then its
    # close frame is awaited (what it still sends is read and dropped), so the lingering
    # close of TCP (flowmq_broker.lingering) is not needed.
    closes_gracefully = True

    def __init__(self, ws: web.WebSocketResponse, request: web.Request) -> None:
        super().__init__()
        self._ws = ws
        self._raw = request.transport  # the TCP (or TLS) transport under the WebSocket
        self._extra = {
            name: self._raw.get_extra_info(name) if self._raw is not None else None
            for name in ("peername", "sockname", "ssl_object", "socket")
        }
        self._protocol: MqttConnection | None = None
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._wake = asyncio.Event()
        self._closing = False
        self._high = 64 * 1024
        self._low = self._high // 4
        self._writing_paused = False
        self.reading = asyncio.Event()
        self.reading.set()
        self.sender = asyncio.get_running_loop().create_task(self._send_loop())

    # --- asyncio.Transport --------------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        value = self._extra.get(name)
        return default if value is None else value

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol  # type: ignore[return-value]

    def is_closing(self) -> bool:
        return self._closing or self._ws.closed

    def close(self) -> None:
        """Send what was written, then close the WebSocket (normal closure)."""
        self._closing = True
        self._wake.set()
        self.reading.set()  # let the reader see the close

    def abort(self) -> None:
        self._pending.clear()
        self._pending_bytes = 0
        self.close()

    def is_reading(self) -> bool:
        return self.reading.is_set()

    def pause_reading(self) -> None:
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = 64 * 1024 if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        under = self._raw.get_write_buffer_size() if self._raw is not None else 0
        return self._pending_bytes + under

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        self._pending.append(bytes(data))
        self._pending_bytes += len(data)
        self._wake.set()
        if not self._writing_paused and self.get_write_buffer_size() > self._high:
            self._writing_paused = True
            if self._protocol is not None:
                self._protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def write_eof(self) -> None:
        self.close()

    def can_write_eof(self) -> bool:
        return False

    # --- sending ---------------------------------------------------------------------------
    async def _send_loop(self) -> None:
        ws = self._ws
        try:
            while True:
                while self._pending and not ws.closed:
                    data = self._pending.popleft()
                    self._pending_bytes -= len(data)
                    await ws.send_bytes(data)  # waits for the socket to drain when it must
                    self._maybe_resume_writing()
                if self._closing or ws.closed:
                    break
                self._wake.clear()
                await self._wake.wait()
            if not ws.closed:
                await ws.close()
        except (ConnectionError, RuntimeError, asyncio.CancelledError):
            pass  # the peer went; the reader notices and ends the connection
        except Exception:
            log.exception("mqtt websocket: sending failed")
        finally:
            self._pending.clear()
            self._pending_bytes = 0

    def _maybe_resume_writing(self) -> None:
        if self._writing_paused and self.get_write_buffer_size() <= self._low:
            self._writing_paused = False
            if self._protocol is not None:
                self._protocol.resume_writing()


class MqttWebSocketListener:
    """``GET /mqtt`` WebSocket endpoints of one MQTT server (``MqttServer``, which owns this
    listener, seen through the connections' interface): ``start`` a plain or TLS site,
    sharing its port with other processes when ``reuse_port`` (host mode); ``stop`` closes
    the sites (the MQTT server shuts the connections down)."""

    def __init__(self, server: ConnectionHost, *, reuse_port: bool) -> None:
        self.server = server
        self.reuse_port = reuse_port
        app = web.Application()
        app.router.add_get(WS_PATH, self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        self._started = False

    async def start(self, host: str, port: int, ssl_context: SSLContext | None = None) -> int:
        """Serve on ``host``:``port`` (0: a free port), over TLS with ``ssl_context``;
        returns the bound port."""
        if not self._started:
            await self._runner.setup()
            self._started = True
        sock = bind_socket(host, port, reuse_port=self.reuse_port)
        bound = sock.getsockname()[1]
        await web.SockSite(self._runner, sock, ssl_context=ssl_context).start()
        return bound

    async def stop(self) -> None:
        if self._started:
            await self._runner.cleanup()
            self._started = False

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        server = self.server
        ws = web.WebSocketResponse(
            protocols=(WS_SUBPROTOCOL,),
            max_msg_size=server.max_packet_size + _MSG_SLACK,
            autoping=True,
        )
        await ws.prepare(request)
        transport = _WsTransport(ws, request)
        conn = MqttConnection(server)
        transport.set_protocol(conn)
        conn.connection_made(transport)
        try:
            while not transport.is_closing():
                if not transport.reading.is_set():
                    await transport.reading.wait()
                    continue
                msg = await ws.receive()
                if msg.type == WSMsgType.BINARY:
                    conn.data_received(msg.data)
                elif msg.type == WSMsgType.TEXT:
                    log.info("mqtt websocket %s: text frame; closing", conn._peer())
                    await ws.close(code=1003, message=b"MQTT needs binary frames")
                    break
                elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                    break
                elif msg.type == WSMsgType.ERROR:
                    log.info("mqtt websocket %s: %s", conn._peer(), ws.exception())
                    break
            # Let what was queued (CONNACK refusals, DISCONNECT) out, then close.
            transport.close()
            await asyncio.shield(transport.sender)
        finally:
            if not transport.sender.done():
                transport.sender.cancel()
            transport._closing = True
            conn.connection_lost(None)
            if not ws.closed:
                await ws.close()
        return ws
