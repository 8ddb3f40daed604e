"""The TCP listener every protocol adapter serves on: one place for its socket options.

The address given (the ``bind`` key: loopback unless configured, DESIGN.md §12), ``SO_REUSEADDR`` (a restarted broker binds at once, even with connections of
its previous run in TIME_WAIT) and a backlog large enough for a burst of clients connecting
together.  Port 0 binds a free port; the bound one is returned.  With ``ssl`` (the broker's
one ``SSLContext``, flowmq_broker.tls) the listener speaks TLS and the protocol sees the
decrypted stream, so an adapter serves its plain and its TLS port with the same factory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from ssl import SSLContext

BACKLOG = 1024


async def listen(
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    port: int,
    host: str,
    *,
    ssl: SSLContext | None = None,
) -> tuple[asyncio.Server, int]:
    """Start serving ``protocol_factory`` on ``host``:``port``; returns the server and its
    bound port."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        protocol_factory, host, port, reuse_address=True, backlog=BACKLOG, ssl=ssl
    )
    return server, server.sockets[0].getsockname()[1]
