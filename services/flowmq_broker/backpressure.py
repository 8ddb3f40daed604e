"""Backpressure instead of growth (DESIGN.md §13): publishers held while durable writes lag.

The broker's group-commit batcher calls ``on_pressure(True)`` when the bytes waiting for a
flush pass its high-water mark (``pending_writes_high_water``) and ``on_pressure(False)``
once they are below its low-water mark.  Meanwhile every protocol adapter, on its durable
publish path, asks ``active`` and, when it is set, pauses reading from the publishing
connection (TCP then pushes back to the client) and ``hold``s it here with the callback that
resumes it; the end of the pressure calls every such callback.  A connection that only
subscribes never publishes, so it is never held: Subscriptions keep flowing.

A connection may be paused for other reasons too (a slow subscriber, a blocked cluster
link, a full write buffer); each adapter's resume callback reads again only when no other
reason holds it (``holds`` tells whether this one still does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

# What Kafka Produce answers carry in ``throttle_time_ms`` while under pressure: how long
# the client should back off (KIP-219).  A hint of the order of a few flushes: the broker
# also stops reading the connection until the pressure ends, which is what bounds memory.
KAFKA_THROTTLE_MS = 100


class Backpressure:
    __slots__ = ("_held", "active")

    def __init__(self) -> None:
        self.active = False
        self._held: dict[object, Callable[[], None]] = {}

    def hold(self, connection: object, resume: Callable[[], None]) -> bool:
        """Remember ``connection``, which its caller pauses now if this returns True (False:
        already held); ``resume()`` is called when the pressure ends."""
        if connection in self._held:
            return False
        self._held[connection] = resume
        return True

    def holds(self, connection: object) -> bool:
        return connection in self._held

    def forget(self, connection: object) -> None:
        """``connection`` closed: nothing to resume."""
        self._held.pop(connection, None)

    def on_pressure(self, active: bool) -> None:
        """The batcher's listener."""
        self.active = active
        if not active:
            held, self._held = self._held, {}
            for resume in held.values():
                try:
                    resume()
                except Exception:  # one connection's failure must not strand the others
                    log.exception("resuming a publisher failed")

    @property
    def held(self) -> list[object]:
        """The connections paused now (operations and tests)."""
        return list(self._held)
