"""What an open AMQP connection offers to the parts below it: a ``Protocol``.

Its channels (channel.py and the modules it uses) and the broker-wide state (state.py) see
the connection only as a ``Link``; connection.py implements it.  So nothing below the
connection imports it, and data flows one way: server → connection → channel → state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from flowmq_broker.amqp.memqueue import MemoryQueue
from flowmq_core.acl import Access


class Link(Protocol):
    # After Connection.Open: the virtual host asked for and the namespace it names.
    namespace: str
    vhost: str
    # What the client may do there (flowmq_core.acl), from Connection.Open on.
    access: Access
    frame_max: int
    # Body bytes received of messages not yet complete, on every channel (limits.py).
    partial_bytes: int
    # The transport's write buffer is over its high-water mark: deliveries wait.
    paused_writing: bool
    loop: asyncio.AbstractEventLoop
    # Tasks running for the connection (a channel's meta-store methods); cancelled with it.
    tasks: set[asyncio.Task[Any]]
    # Memory queues declared here: exclusive ones go with the connection.
    owned_queues: list[MemoryQueue]

    def send(self, data: bytes) -> None:
        """Queue frames; everything sent while handling one read goes out in one write."""

    def flush(self) -> None:
        """Write what ``send`` queued now."""

    def fail(self, code: int, text: str, method: int) -> None:
        """Close the connection for a hard error."""

    def channel_closed(self, number: int, channel: object) -> None:
        """Forget channel ``number`` if it is still ``channel`` (its close finished)."""

    def publish_started(self, n: int) -> None:
        """``n`` more publishes wait to be stored (reading pauses beyond a bound)."""

    def publish_finished(self, n: int) -> None:
        """``n`` of them were stored or failed."""

    def cancel_consumers(self, match: Callable[[Any], bool]) -> None:
        """Cancel every consumer ``match`` picks, on every channel, and tell the client."""

    def shutdown(self) -> None:
        """Broker stopping: close with CONNECTION_FORCED."""

    def abort(self) -> None:
        """Drop the transport now."""
