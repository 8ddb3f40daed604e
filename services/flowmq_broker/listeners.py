"""The TCP listener every protocol adapter serves on: one place for its socket options.

The address given (the ``bind`` key: loopback unless configured, DESIGN.md §12), ``SO_REUSEADDR`` (a restarted broker binds at once, even with connections of
its previous run in TIME_WAIT) and a backlog large enough for a burst of clients connecting
together.  Port 0 binds a free port; the bound one is returned.  With ``ssl`` (the broker's
one ``SSLContext``, flowmq_broker.tls) the listener speaks TLS and the protocol sees the
decrypted stream, so an adapter serves its plain and its TLS port with the same factory.

``reuse_port`` (host mode, flowmq_broker.hostmode; DESIGN.md §14) adds ``SO_REUSEPORT``: the
processes of one host then listen on the same port and the kernel spreads the connections
over them.  Only then: without it a second broker on a taken port must fail to start, not
silently share it.  The MQTT, Kafka and AMQP ports (plain and TLS) are not even bound in a
host-mode process: its supervisor accepts their connections and hands each to the next
process in turn (``HandedOver``), since the kernel's spreading hashes each connection and
put every publisher of a benchmark on one process in 2 rounds of 8.

``log_admin_api`` is the start-up line naming where the HTTP listener's admin API answers.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from ssl import SSLContext

BACKLOG = 1024

# Set by host mode's supervisor on its processes (internal, not configuration): the socket
# its connections come on, and the ports they were accepted on.
HANDOFF_FD_ENV = "FLOWMQ_HANDOFF_FD"
HANDOFF_PORTS_ENV = "FLOWMQ_HANDOFF_PORTS"
HANDOFF_MESSAGE = struct.Struct("!H")  # the port the connection came to; the socket rides along

log = logging.getLogger(__name__)


class HandedOver:
    """This process's end of its supervisor's connection hand-over: each message is one
    accepted socket and the port it came to, served by what ``listen`` registered for that
    port.  A connection for a port nothing serves (yet, or any more) is closed."""

    def __init__(self, fd: int, ports: set[int]) -> None:
        self.ports = ports
        self._sock = socket.socket(fileno=fd)
        self._sock.setblocking(False)
        self._served: dict[int, tuple[Callable[[], asyncio.BaseProtocol], SSLContext | None]] = {}
        self._reading = False

    @classmethod
    def from_environment(cls) -> HandedOver | None:
        fd, ports = os.environ.get(HANDOFF_FD_ENV), os.environ.get(HANDOFF_PORTS_ENV)
        if not fd or not ports:
            return None
        return cls(int(fd), {int(port) for port in ports.split(",")})

    def serve(
        self,
        port: int,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        ssl: SSLContext | None,
    ) -> _HandedOverServer:
        self._served[port] = (protocol_factory, ssl)
        if not self._reading:
            self._reading = True
            asyncio.get_running_loop().add_reader(self._sock.fileno(), self._receive)
        return _HandedOverServer(self, port)

    def stop_serving(self, port: int) -> None:
        """Connections handed over for ``port`` from now on are closed."""
        self._served.pop(port, None)

    def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, HANDOFF_MESSAGE.size, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data and not fds:  # the supervisor is gone
                loop.remove_reader(self._sock.fileno())
                self._reading = False
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                served = self._served.get(HANDOFF_MESSAGE.unpack(data)[0]) if data else None
                if served is None:
                    conn.close()
                    continue
                conn.setblocking(False)
                factory, ssl = served
                loop.create_task(self._adopt(conn, factory, ssl))

    @staticmethod
    async def _adopt(
        conn: socket.socket, factory: Callable[[], asyncio.BaseProtocol], ssl: SSLContext | None
    ) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(factory, conn, ssl=ssl)
        except OSError as exc:  # a TLS handshake that failed, a reset
            log.debug("a handed-over connection ended before it started: %s", exc)
            conn.close()


class _HandedOverServer:
    """What ``listen`` returns for a handed-over port: ``close`` stops serving it."""

    def __init__(self, handed_over: HandedOver, port: int) -> None:
        self._handed_over = handed_over
        self._port = port

    def close(self) -> None:
        self._handed_over.stop_serving(self._port)

    async def wait_closed(self) -> None:
        return None


@functools.cache
def handed_over() -> HandedOver | None:
    """This process's hand-over from host mode's supervisor, if it has one."""
    return HandedOver.from_environment()


async def listen(
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    port: int,
    host: str,
    *,
    ssl: SSLContext | None = None,
    reuse_port: bool = False,
) -> tuple[asyncio.Server, int]:
    """Start serving ``protocol_factory`` on ``host``:``port``; returns the server and its
    bound port.  In a host-mode process a port its supervisor accepts on is not bound: the
    supervisor hands its connections over (``HandedOver``)."""
    handover = handed_over() if reuse_port else None
    if handover is not None and port in handover.ports:
        return handover.serve(port, protocol_factory, ssl), port  # type: ignore[return-value]
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        protocol_factory,
        host,
        port,
        reuse_address=True,
        reuse_port=reuse_port,
        backlog=BACKLOG,
        ssl=ssl,
    )
    return server, server.sockets[0].getsockname()[1]


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (an IP address), not yet listening, with the
    listeners' options: for a server that takes a socket (aiohttp's ``SockSite``).  One
    socket: with a host name asyncio may bind IPv4 and IPv6 apart, and port 0 would then give
    two ports.  Raises ``OSError`` (the socket closed) when the port cannot be bound."""
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def log_admin_api(bind: str, port: int, data_dir: Path) -> None:
    """Log where the admin API answers (a URL reaching ``bind``) and its token file."""
    host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(bind, f"[{bind}]" if ":" in bind else bind)
    logging.getLogger("flowmq").info(
        "admin API: http://%s:%d/api/v1 (token file %s)", host, port, data_dir / "admin_token"
    )
