"""The TCP listener every protocol adapter serves on: one place for its socket options.

The address given (the ``bind`` key: loopback unless configured, DESIGN.md §12), ``SO_REUSEADDR`` (a restarted broker binds at once, even with connections of
its previous run in TIME_WAIT) and a backlog large enough for a burst of clients connecting
together.  Port 0 binds a free port; the bound one is returned.  With ``ssl`` (the broker's
one ``SSLContext``, flowmq_broker.tls) the listener speaks TLS and the protocol sees the
decrypted stream, so an adapter serves its plain and its TLS port with the same factory.

``reuse_port`` (host mode, flowmq_broker.hostmode; DESIGN.md §14) adds ``SO_REUSEPORT``: the
processes of one host then listen on the same port and the kernel spreads the connections
over them.  Only then: without it a second broker on a taken port must fail to start, not
silently share it.

``log_admin_api`` is the start-up line naming where the HTTP listener's admin API answers.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from ssl import SSLContext

BACKLOG = 1024


async def listen(
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    port: int,
    host: str,
    *,
    ssl: SSLContext | None = None,
    reuse_port: bool = False,
) -> tuple[asyncio.Server, int]:
    """Start serving ``protocol_factory`` on ``host``:``port``; returns the server and its
    bound port."""
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
